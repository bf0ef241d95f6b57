"""The abstract Unix sockets Triton Python models' workers use (readiness answers, custom
metrics) have no file permissions and their names are listed in /proc/net/unix: only this
process's own workers may use them. Another user's process, or one of ours that is not our
child, is turned away; the connection or datagram of a real child is taken."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from typing import Any


from openinfer._backends import triton_metrics
from openinfer._backends.triton_ready import WorkerReadiness

from conftest import wait_for

CONNECT = textwrap.dedent(
    """
    import os, socket, struct, sys
    kind, name, number, hop = sys.argv[1], "\\0" + sys.argv[2], int(sys.argv[3]), sys.argv[4] == "grandchild"
    if hop and os.fork() != 0:  # the grandchild, whose parent is this child, does the talking
        os._exit(0 if os.wait()[1] == 0 else 1)
    if kind == "ready":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(name)
        s.settimeout(30)
        try:  # the server may close before our number is sent, or with it unread
            s.sendall(struct.pack("<I", number))
            print("closed" if s.recv(1) == b"" else "open", flush=True)
        except (BrokenPipeError, ConnectionResetError):
            print("closed", flush=True)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect(name)
        s.send(('{"pid": %d, "families": []}' % number).encode())
        print("sent", flush=True)
        sys.stdin.read()  # alive until the test has looked: the server checks a live sender
    """
)


def _run(kind: str, address: str, number: int, hop: str = "child", **kw: Any) -> subprocess.Popen[str]:
    python = kw.pop("python", sys.executable)
    return subprocess.Popen([python, "-c", CONNECT, kind, address.lstrip("\0"), str(number), hop],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


def _strangers() -> list[dict[str, Any]]:
    """How a stranger runs: a grandchild of ours (same user), and, as root, a process of nobody."""
    out: list[dict[str, Any]] = [{"hop": "grandchild"}]
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if os.geteuid() == 0 and python is not None:
        out.append({"user": "nobody", "python": python})
    return out


def test_only_our_own_workers_may_answer_readiness() -> None:
    readiness = WorkerReadiness(1)
    for stranger in _strangers():
        out, _ = _run("ready", readiness.address, 7, **stranger).communicate(timeout=60)
        assert out.strip() == "closed", stranger
    worker = _run("ready", readiness.address, 0)
    try:
        wait_for(lambda: 0 in readiness._workers, "our child taken as worker 0", 60)
        assert set(readiness._workers) == {0}  # no stranger's number among them
    finally:
        worker.kill()
        worker.wait()


def test_only_our_own_workers_may_send_metrics() -> None:
    address = triton_metrics.listen()
    senders: list[subprocess.Popen[str]] = []
    try:
        # One after another, so the datagrams queue in this order; each sender stays alive
        # until its stdin closes.
        for i, stranger in enumerate([*_strangers(), {}]):
            senders.append(_run("metrics", address, 123_456 if not stranger else 900_000 + i, **stranger))
            assert senders[-1].stdout is not None and senders[-1].stdout.readline().strip() == "sent"
        wait_for(lambda: 123_456 in triton_metrics._remote, "our child's datagram taken", 60)
        assert not [pid for pid in triton_metrics._remote if pid >= 900_000]
    finally:
        for proc in senders:
            proc.communicate(timeout=60)
