"""Start a test's TensorFlow program without paying TensorFlow's import again.

Importing TensorFlow and Keras costs every fresh process 6-9 CPU-seconds; the suite starts many
such processes (workers, ``evenflow train``) that differ only in what they run after the import.
``warm_python(env)`` returns the argv prefix to use instead of ``[sys.executable]``:

    subprocess.run([*warm_python(env), str(WORKER), str(out)], env=env, capture_output=True, ...)

The first call in a test process (per framework and set of import-time variables, below) starts a
*server* (``python _warm.py serve SOCKET FRAMEWORK``) that imports ``tensorflow`` and ``keras`` (no
TensorFlow runtime: no op has run, no device is set up), or ``torch`` for ``warm_python(env, "torch")``,
and waits.
Each command then starts a small *client* (``python _warm.py SOCKET PROGRAM...``, no TensorFlow)
that hands the server its stdin, stdout and stderr, argv, environment, working directory and cores; the
server forks a child that becomes that program (a script, ``-m module`` or ``-c code``) with those
descriptors and environment, and the client exits as the child does (its code, or the signal that
ended it). The program still runs in a process of its own, with its own logical devices,
checkpoints and exit; what it saves is the import. A client that ends early (a timeout killed it)
takes its child with it; a server whose test process is gone ends with its children.

The client runs the program in a fresh interpreter instead (``exec``), exactly as before, whenever
the server is not there or the environment asks for something the server's import already fixed:
a variable read while TensorFlow, Keras or Python start (``TF_*``, ``KERAS_*``, ``PYTHON*``,
``OMP_*``, ...) that differs from the server's (``TF_CONFIG`` and ``PYTHONUNBUFFERED`` are each child's own,
so the workers ``evenflow launch`` starts with a warm command start warm too). Do not use it for what rests
on the process itself being new or on its parent: kill tests whose program must receive the signal they
send the pid they started (that pid is the client's; a client killed by SIGKILL takes its program with
it), process groups, imports that must not happen (the server has imported its framework),
and ``evenflow ... --verbose`` (it sets TensorFlow's log level before the import).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"
# Variables read while the interpreter, TensorFlow or Keras start up: a request whose value differs from the
# server's runs in a fresh process.
IMPORT_TIME = ("TF_", "KERAS_", "PYTHON", "OMP_", "KMP_", "MKL", "CUDA", "XLA_", "LD_", "TPU_", "EVENFLOW_VERBOSE")
# ... except these, which each child honours over the server's: TF_CONFIG is read when a strategy or cluster
# resolver is made, not at import (TensorFlow, Keras and torch read no TF_CONFIG while they import), and
# PYTHONUNBUFFERED (which evenflow launch sets for its workers) is applied to the child's own stdout and stderr.
PER_CHILD = ("TF_CONFIG", "PYTHONUNBUFFERED")
# What a server imports, per framework ("python": nothing, for tests/test_warm.py).
PRELOAD = {"tensorflow": ("tensorflow", "keras"), "torch": ("torch",), "python": ()}
_servers: dict[tuple, tuple[subprocess.Popen, str]] = {}  # import-time variables -> (server, socket)


def _import_env(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in PER_CHILD}


# ---------------------------------------------------------------- the test process's side
def warm_python(env: dict, framework: str = "tensorflow") -> list[str]:
    """``[python, _warm.py, SOCKET]``: run a program after it, with ``env``, like after ``sys.executable``.

    The first call for a framework (``"tensorflow"``, ``"torch"`` or ``"python"``) and an environment's import-time
    variables (see ``IMPORT_TIME``) starts a server that imports the framework under them; later calls
    with the same ones share it.
    """
    if framework not in PRELOAD:
        raise ValueError(f"framework {framework!r}: use one of {sorted(PRELOAD)}")
    key = (framework, *sorted(_import_env(env).items()))
    found = _servers.get(key)
    if found is None or found[0].poll() is not None:
        sock = os.path.join(tempfile.mkdtemp(prefix="ef-warm-"), "s")
        proc = subprocess.Popen([sys.executable, str(HERE), "serve", sock, framework], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(_stop, proc, os.path.dirname(sock))
        found = _servers[key] = (proc, sock)
    return [sys.executable, str(HERE), found[1]]


def _stop(proc: subprocess.Popen, folder: str) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the client
def _client(sock_path: str, program: list[str]) -> None:
    """Run ``program`` in a child of the server (or, when that cannot be, exec it); exit as it does."""
    fresh = [sys.executable, *program]
    if program[0].startswith("-") and program[0] not in ("-c", "-m"):  # interpreter options: a fresh one
        os.execv(sys.executable, fresh)
    deadline = time.monotonic() + 120  # the server may still be importing TensorFlow
    while not os.path.exists(sock_path + ".env") and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        served = json.loads(Path(sock_path + ".env").read_text())
        if served != _import_env(os.environ):
            os.execv(sys.executable, fresh)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sock_path)
    except OSError:
        os.execv(sys.executable, fresh)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    request = json.dumps({"argv": program, "env": dict(os.environ), "cwd": os.getcwd(), "cores": cores}).encode()
    socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], [0, 1, 2])
    reply = b""
    while chunk := conn.recv(64):
        reply += chunk
    if not reply:  # the server went away without an answer
        sys.stderr.write("tests/_warm.py: the warm server ended before the program did\n")
        os._exit(70)
    how, number = reply.decode().split()
    if how == "signal":
        if int(number) not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(int(number), signal.SIG_DFL)
        os.kill(os.getpid(), int(number))
    os._exit(int(number))


# ---------------------------------------------------------------- the server
def _serve(sock_path: str, framework: str) -> list[str] | None:
    """Import the framework, then fork a child per request. Returns (in the child) the program to run."""
    import importlib

    before = dict(os.environ)
    try:
        for name in PRELOAD[framework]:  # imported here, once, for every child
            importlib.import_module(name)
    except BaseException:
        Path(sock_path + ".env").write_text("null")  # its clients run their programs in fresh processes
        raise
    # What the import set in the environment (TensorFlow: TPU_ML_PLATFORM, KMP_INIT_AT_FORK, ...), as a
    # fresh process would have it after the same import: each child sets it again over its own environment.
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    Path(sock_path + ".tmp").write_text(json.dumps(_import_env(before)))
    os.replace(sock_path + ".tmp", sock_path + ".env")
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    children: dict[int, socket.socket] = {}  # pid -> its client's connection
    while os.getppid() == parent and not stopped:  # until the test process is gone or asks us to end
        ready, _, _ = select.select([listener, *children.values()], [], [], 0.1)
        for conn in ready:
            if conn is listener:
                program = _fork_one(listener, children, added)
                if program is not None:
                    return program
            elif conn.recv(1) == b"":  # the client ended: its program ends too
                pid = next(p for p, c in children.items() if c is conn)
                os.kill(pid, signal.SIGKILL)
        _reap(children)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    return None


def _fork_one(listener: socket.socket, children: dict, added: dict) -> list[str] | None:
    conn, _ = listener.accept()
    head, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    size = int.from_bytes(head[:8], "big")
    body = head[8:]
    while len(body) < size:
        body += conn.recv(size - len(body))
    request = json.loads(body)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        children[pid] = conn
        return None
    # The child: become the program.
    listener.close()
    for other in children.values():
        other.close()
    conn.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    if request.get("cores") is not None:
        os.sched_setaffinity(0, request["cores"])  # the cores the client may use (evenflow launch --pin-cores)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(added)
    _std_streams(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    return request["argv"]


def _std_streams(unbuffered: bool) -> None:
    """``sys.stdout`` and ``sys.stderr`` on the child's descriptors, unbuffered where ``PYTHONUNBUFFERED`` asks, as a
    fresh interpreter opens them (stdout line-buffered on a terminal, stderr always)."""
    import io

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = io.FileIO(old.fileno(), "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding,
                                  errors=old.errors, line_buffering=name == "stderr" or raw.isatty(),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reap(children: dict) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        try:
            conn.sendall(how.encode())
        except OSError:
            pass
        conn.close()


def _run(program: list[str]) -> None:
    """Run ``program`` (what follows ``python`` on a command line) as a fresh interpreter would."""
    import runpy

    sys.path[0] = ""
    if program[0] == "-c":
        sys.argv = ["-c", *program[2:]]
        code = compile(program[1], "<string>", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    elif program[0] == "-m":
        sys.argv = [program[1], *program[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(program)
        sys.path[0] = str(Path(program[0]).resolve().parent)
        runpy.run_path(program[0], run_name="__main__")


def _run_and_exit(program: list[str]) -> None:
    """Run ``program``, then end as the interpreter does, short of its native teardown.

    The exit status, the message of a ``SystemExit`` or the traceback of an error, the wait for
    non-daemon threads, the ``atexit`` handlers and the flushed streams are a normal exit's; then the
    process ends with ``os._exit``, skipping the destructors of TensorFlow's native libraries (seconds
    of CPU in every process; 10 s in a forked one).
    """
    import atexit as exits
    import threading
    import traceback

    code = 0
    try:
        _run(program)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    exits._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        program = _serve(sys.argv[2], sys.argv[3])
        if program is None:
            sys.exit(0)
        _run_and_exit(program)  # in a child
    else:
        _client(sys.argv[1], sys.argv[2:])
