"""``evenflow launch`` keeps its workers' ports off the machine's network: they reach each other, nobody else them."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
WORKER = Path(__file__).with_name("_net_worker.py")


def _launch(*flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evenflow", "launch", "--workers", "2", *flags, "--",
                             sys.executable, str(WORKER)], env=dict(os.environ, PYTHONPATH=str(SRC)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("share", [False, True])
def test_workers_reach_each_other_and_only_a_shared_network_reaches_them(share):
    proc = _launch(*(["--share-network"] if share else []))
    port = None
    deadline = time.monotonic() + 20
    while port is None and time.monotonic() < deadline:  # the first "PORT n" line
        line = proc.stdout.readline()
        if line.startswith("[worker 0] PORT "):
            port = int(line.split()[-1])
    assert port is not None, proc.stderr.read()
    outside = _reachable(port)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.count("reached 127.0.0.1:") == 2  # each worker reached the other
    private = "(a private network)" in err
    if share or not private:  # --share-network, or a machine that allows no namespace (and says so)
        assert outside and (share or "note: the workers run on this machine's network" in err)
    else:
        assert not outside, "a worker's port was reachable from outside its private network"
