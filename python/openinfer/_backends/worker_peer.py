"""Whether a process at the other end of a local socket is one of this process's own workers.

The sockets workers use to answer readiness and send metrics are abstract Unix sockets: they have
no file permissions, and their names show in /proc/net/unix to every user. So the server checks
each peer's kernel-given credentials: the same user as this process, and this process its parent.
"""

from __future__ import annotations

import os
import socket
import struct

UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def is_our_worker(pid: int, uid: int) -> bool:
    if uid != os.getuid():
        return False
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
        return int(stat[stat.rindex(b")") + 2 :].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def connected_worker(conn: socket.socket) -> bool:
    """The peer of an accepted stream connection is one of our workers."""
    pid, uid, _ = UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
    return is_our_worker(pid, uid)


def receive_from_workers(sock: socket.socket, size: int) -> bytes | None:
    """The next datagram on `sock` (made with SO_PASSCRED on) when one of our workers sent it,
    else None (the datagram is dropped)."""
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(UCRED.size))
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(value) >= UCRED.size:
            pid, uid, _ = UCRED.unpack(value[: UCRED.size])
            return data if is_our_worker(pid, uid) else None
    return None
