"""A network of its own for locally launched workers (Linux), so their TensorFlow ports face no one else.

TensorFlow's worker servers listen on every interface of the machine (its gRPC server binds
``0.0.0.0``/``[::]`` at the ``TF_CONFIG`` port; no option binds one address), and they take
requests from anyone who can reach the port, without authentication. For workers that only
talk to each other on one machine, :func:`run_in_private_network` runs a function in a forked
process that first enters a new network namespace with nothing but a loopback interface: the
workers it starts share that namespace, reach each other on ``127.0.0.1``, and cannot be
reached from the machine's network (nor reach it).

Entering a namespace needs root, or unprivileged user namespaces; where neither is allowed
(or off Linux), the caller is told why and runs the workers on the machine's network.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys
from typing import Callable

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _unshare(flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.unshare(flags) == 0 else ctypes.get_errno()


def _enter() -> str | None:
    """Enter a new network namespace with loopback up; None on success, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    uid, gid = os.getuid(), os.getgid()
    errno = _unshare(_CLONE_NEWNET)
    if errno:  # not root: a user namespace of our own, mapped to our ids, with its own network
        errno = _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        if errno:
            return f"this machine allows neither network nor user namespaces to this user ({os.strerror(errno)})"
        for name, text in (("uid_map", f"0 {uid} 1"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))
    return None


def run_in_private_network(work: Callable[[], int]) -> tuple[int | None, str | None]:
    """Run ``work()`` in a forked process inside a private network namespace.

    Returns:
        ``(exit code of work, None)``, or ``(None, reason)`` when no namespace could be made
        (then nothing ran). SIGINT and SIGTERM received meanwhile are passed on to the process.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    report_read, report_write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked side; its effects are tested end to end
        os.close(report_read)
        try:
            reason = _enter()
        except OSError as e:
            reason = f"the private network could not be set up ({e})"
        os.write(report_write, (reason or "").encode())
        os.close(report_write)
        if reason:
            os._exit(0)
        code = 1
        try:
            code = int(work())
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as fh:
        reason = fh.read().decode()
    previous = {s: signal.signal(s, lambda signum, _frame: os.kill(child, signum)) for s in
                (signal.SIGINT, signal.SIGTERM)}
    try:
        _, status = os.waitpid(child, 0)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if reason:
        return None, reason
    return (os.waitstatus_to_exitcode(status) if status else 0), None
