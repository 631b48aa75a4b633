"""What the launchers share: free ports, the workers' environment, and their output, line by line.

Nothing here imports TensorFlow.
"""
from __future__ import annotations

import os
import socket
import threading

from evenflow.tf.launch.cluster import REPLICAS_ENV


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free on ``host`` a moment ago.

    All sockets are held open together so the ports differ, then closed for the workers to bind
    (a port taken in between makes that worker fail to start, reported like any other failure).
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Pump(threading.Thread):
    """Copies one worker stream to ours, line by line, with the worker's prefix."""

    def __init__(self, stream, prefix: str, target, lock: threading.Lock):
        super().__init__(daemon=True)
        self.stream, self.prefix, self.target, self.lock = stream, prefix, target, lock

    def run(self):
        for raw in iter(self.stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            # A progress bar redrawn with \r: keep what the line finally showed.
            line = line.rsplit("\r", 1)[-1]
            with self.lock:
                self.target.write(f"{self.prefix}{line}\n")
                self.target.flush()
        self.stream.close()


def worker_env(options, env) -> dict[str, str]:
    """The environment every worker shares: ``env`` (default ours), unbuffered, with the replicas of ``options`` (a ``LaunchOptions``)."""
    base = dict(os.environ if env is None else env)
    base["PYTHONUNBUFFERED"] = "1"  # lines as they happen, not when a pipe buffer fills
    if options.replicas_per_worker is not None:
        base[REPLICAS_ENV] = str(options.replicas_per_worker)
    else:
        base.pop(REPLICAS_ENV, None)
    return base


def say_line(err, lock: threading.Lock, text: str) -> None:
    """Write one ``evenflow launch:`` line to ``err``, never inside a worker's line."""
    with lock:
        err.write(f"evenflow launch: {text}\n")
        err.flush()
