"""Shared memory against hostile or careless local clients: an object shrunk while a request
reads or writes it fails that request and never the server (SIGBUS); the server acts with the
client's rights (a client may not register an object its user cannot read and write, and sees,
uses and unregisters only its own user's regions); registrations cannot use up the descriptors
that new connections need.

Other users are played without a second process: a socket's owner is the file-system uid of
the thread that creates it, so a socket made under setfsuid(uid) is that user's to the server."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import openinfer
from conftest import Http, assert_alive, encode_request

NOBODY = 65534
_libc = ctypes.CDLL(None, use_errno=True)


class ShmFile:
    """A POSIX shm object made by hand (no descriptor kept open), owned and moded as asked."""

    def __init__(self, size: int, owner: int = 0, mode: int = 0o600, data: bytes = b"") -> None:
        self.name = f"oi_attack_{uuid.uuid4().hex[:12]}"
        self.key = "/" + self.name
        self.path = "/dev/shm/" + self.name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, data, 0)
            os.fchown(fd, owner, owner)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def read(self, n: int, offset: int = 0) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(n)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@pytest.fixture
def shm_files() -> Iterator[Any]:
    made: list[ShmFile] = []

    def make(*args: Any, **kwargs: Any) -> ShmFile:
        f = ShmFile(*args, **kwargs)
        made.append(f)
        return f

    yield make
    for f in made:
        f.unlink()


def connect_as(port: int, uid: int) -> Http:
    """A connection whose socket belongs to `uid`, as a process of that user would make it."""
    if os.geteuid() != 0:
        pytest.skip("playing another user needs root")
    previous = _libc.setfsuid(uid)
    try:
        return Http(port)
    finally:
        _libc.setfsuid(previous)


def post(conn: Http, path: str, body: Any = None) -> tuple[int, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    status, _, reply = conn.request("POST", path, data)
    return status, json.loads(reply) if reply else None


def register(conn: Http, name: str, key: str, byte_size: int, offset: int = 0) -> tuple[int, Any]:
    return post(conn, f"/v2/systemsharedmemory/region/{name}/register",
                {"key": key, "offset": offset, "byte_size": byte_size})


def shm_input(region: str, n: int) -> dict[str, Any]:
    return {"name": "INPUT0", "datatype": "INT32", "shape": [n],
            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 4 * n}}


# ---- a client shrinks an object under a request ----------------------------------------------

# A server in a child process: if a SIGBUS still killed it, the test says so instead of
# taking the test session down. Its models shrink the object named in their parameters (as a
# client racing the request would), then read the input or return an output placed there.
SHRINK_SERVER = textwrap.dedent('''
    import os, sys, numpy as np, openinfer
    from openinfer import Model, Tensor

    def shrink(parameters):
        key = parameters.get("shrink")
        if key:
            os.truncate("/dev/shm" + key, 0)

    def read_after_shrink(inputs, parameters):
        shrink(parameters)
        return {"OUTPUT0": inputs["INPUT0"] * 2}   # reads the shrunk pages

    def write_after_shrink(inputs, parameters):
        shrink(parameters)
        return {"OUTPUT0": np.arange(inputs["INPUT0"].size, dtype=np.int32)}

    def passthrough(inputs, parameters):
        shrink(parameters)
        return {"OUTPUT0": inputs["INPUT0"]}       # a view of the input, sent from the region

    io = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    models = [Model("read", read_after_shrink, **io), Model("write", write_after_shrink, **io),
              Model("pass", passthrough, **io)]
    with openinfer.serve(models=models, http_port=0, grpc_port=None, log=False) as srv:
        print(srv.http_port, flush=True)
        sys.stdin.read()   # until the test closes it
''')


@pytest.fixture
def shrink_server() -> Iterator[tuple[subprocess.Popen, int]]:
    proc = subprocess.Popen([sys.executable, "-c", SHRINK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip().isdigit(), (line, proc.stderr.read() if proc.stderr else "")
        yield proc, int(line)
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _infer(conn: Http, model: str, body: dict[str, Any]) -> tuple[int, Any]:
    return post(conn, f"/v2/models/{model}/infer", body)


def test_object_shrunk_while_an_input_is_read(shrink_server: Any, shm_files: Any) -> None:
    proc, port = shrink_server
    n = 4096  # 16 KiB: four pages, all read after the shrink
    f = shm_files(4 * n, data=bytes(range(256)) * (4 * n // 256))
    conn = Http(port)
    try:
        assert register(conn, "in", f.key, 4 * n)[0] == 200
        status, reply = _infer(conn, "read", {"inputs": [shm_input("in", n)], "parameters": {"shrink": f.key}})
        assert proc.poll() is None, f"the server died: exit {proc.returncode}: {proc.stderr.read()[-2000:]}"
        assert status == 400, reply
        assert "input 'INPUT0'" in reply["error"] and "shrank to 0 bytes during the request" in reply["error"]
        # The connection and the server go on; the broken region is refused until registered again.
        status, reply = _infer(conn, "read", {"inputs": [shm_input("in", n)]})
        assert status == 400 and "register the region again" in reply["error"]
        os.truncate(f.path, 4 * n)
        assert post(conn, "/v2/systemsharedmemory/region/in/unregister")[0] == 200
        assert register(conn, "in", f.key, 4 * n)[0] == 200
        status, reply = _infer(conn, "read", {"inputs": [shm_input("in", n)]})
        assert status == 200 and reply["outputs"][0]["data"] == [0] * n
    finally:
        conn.close()
    assert_alive(port)


def test_object_shrunk_before_an_output_is_written(shrink_server: Any, shm_files: Any) -> None:
    proc, port = shrink_server
    n = 2048
    f = shm_files(4 * n)
    conn = Http(port)
    try:
        assert register(conn, "out", f.key, 4 * n)[0] == 200
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [n], "data": [1] * n}],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                               "shared_memory_byte_size": 4 * n}}],
                "parameters": {"shrink": f.key}}
        status, reply = _infer(conn, "write", body)
        assert proc.poll() is None, f"the server died: exit {proc.returncode}: {proc.stderr.read()[-2000:]}"
        assert status == 400 and "output 'OUTPUT0'" in reply["error"] and "shrank" in reply["error"], reply
    finally:
        conn.close()
    assert_alive(port)


def test_object_shrunk_under_an_output_viewing_the_input(shrink_server: Any, shm_files: Any) -> None:
    """The model returns its input as is, to be sent from the region: the check after the
    model sees the shrink and refuses rather than sending what is no longer there."""
    proc, port = shrink_server
    n = 1024
    f = shm_files(4 * n)
    conn = Http(port)
    try:
        assert register(conn, "in", f.key, 4 * n)[0] == 200
        status, reply = _infer(conn, "pass", {"inputs": [shm_input("in", n)], "parameters": {"shrink": f.key}})
        assert status == 400 and "shrank to 0 bytes during the request" in reply["error"], reply
    finally:
        conn.close()
    assert proc.poll() is None
    assert_alive(port)


# ---- the server acts with the client's rights ------------------------------------------------


@pytest.fixture(scope="module")
def srv() -> Iterator[openinfer.Server]:
    with openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, log=False) as s:
        yield s


def test_a_client_cannot_register_an_object_its_user_cannot_open(srv: openinfer.Server, shm_files: Any) -> None:
    secret = b"root's secret bytes, 0600"
    victim = shm_files(4096, owner=0, mode=0o600, data=secret)
    conn = connect_as(srv.http_port, NOBODY)
    try:
        status, reply = register(conn, "probe", victim.key, 4096)
        assert status == 403, reply
        assert f"uid {NOBODY}" in reply["error"] and "may not be read and written" in reply["error"]
        # Nothing was registered, so nothing can be read back or written over.
        status, reply = _infer(conn, "identity_fp32", {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                        "parameters": {"shared_memory_region": "probe", "shared_memory_byte_size": 16}}]})
        assert status == 400 and "Unable to find shared memory region: 'probe'" in reply["error"]
        # Readable by all but writable only by root: still refused (the server maps it read-write).
        readable = shm_files(4096, owner=0, mode=0o644)
        assert register(conn, "probe", readable.key, 4096)[0] == 403
    finally:
        conn.close()
    assert victim.read(len(secret)) == secret


def test_a_client_may_register_what_its_user_can_open(srv: openinfer.Server, shm_files: Any) -> None:
    mine = shm_files(64, owner=NOBODY, mode=0o600)
    shared = shm_files(64, owner=0, mode=0o666)
    conn = connect_as(srv.http_port, NOBODY)
    try:
        assert register(conn, "mine", mine.key, 64)[0] == 200
        assert register(conn, "shared", shared.key, 64)[0] == 200
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "mine",
                                                               "shared_memory_byte_size": 16}}]}
        status, reply = _infer(conn, "identity_fp32", body)
        assert status == 200, reply
        assert mine.read(16) == b"".join(int.to_bytes(b, 4, "little") for b in (0x3F800000, 0x40000000,
                                                                              0x40400000, 0x40800000))
    finally:
        post(conn, "/v2/systemsharedmemory/unregister")
        conn.close()


def test_region_names_are_scoped_per_user(srv: openinfer.Server, shm_files: Any) -> None:
    root_obj = shm_files(64, owner=0, mode=0o666)
    nobody_obj = shm_files(64, owner=NOBODY, mode=0o600)
    root = Http(srv.http_port)
    other = connect_as(srv.http_port, NOBODY)
    try:
        assert register(root, "same_name", root_obj.key, 64)[0] == 200
        # The other user sees none of it, cannot use it, and may take the name for itself.
        status, _, listing = other.request("GET", "/v2/systemsharedmemory/status")
        assert status == 200 and json.loads(listing) == []
        status, _, reply = other.request("GET", "/v2/systemsharedmemory/region/same_name/status")
        assert status == 404
        status, reply = _infer(other, "identity_fp32", {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                        "parameters": {"shared_memory_region": "same_name", "shared_memory_byte_size": 16}}]})
        assert status == 400 and "Unable to find shared memory region: 'same_name'" in reply["error"]
        assert post(other, "/v2/systemsharedmemory/unregister")[0] == 200          # all of its own: none
        assert post(other, "/v2/systemsharedmemory/region/same_name/unregister")[0] == 200
        assert register(other, "same_name", nobody_obj.key, 64)[0] == 200
        # Each user still has exactly its own region under that name.
        for conn, obj in ((root, root_obj), (other, nobody_obj)):
            status, _, listing = conn.request("GET", "/v2/systemsharedmemory/status")
            assert [(r["name"], r["key"]) for r in json.loads(listing)] == [("same_name", obj.key)]
    finally:
        post(other, "/v2/systemsharedmemory/unregister")
        post(root, "/v2/systemsharedmemory/unregister")
        root.close()
        other.close()


def test_peer_credentials() -> None:
    """What the server knows of a client: a Unix-domain peer's credentials and groups, a TCP
    peer's user found through sock_diag (with that user's groups), nothing for a socket with
    no peer."""
    import socket

    from openinfer import _core

    a, b = socket.socketpair()
    with a, b:
        p = _core.peer_credentials(a)
        assert (p["uid"], p["gid"]) == (os.getuid(), os.getgid())
        assert set(os.getgroups()) <= set(p["groups"])
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        client = connect_as(listener.getsockname()[1], NOBODY)
        server_side, _ = listener.accept()
        with server_side:
            p = _core.peer_credentials(server_side)
            assert p["uid"] == NOBODY
            import pwd

            assert p["gid"] == pwd.getpwuid(NOBODY).pw_gid
        client.close()
    lone = socket.socket()
    with lone, pytest.raises(OSError):
        _core.peer_credentials(lone)


# ---- descriptors ---------------------------------------------------------------------------


def test_registrations_leave_descriptors_for_connections(shm_files: Any) -> None:
    """Objects hold a descriptor each, bounded by RLIMIT_NOFILE less a reserve, and one user
    may hold at most half of that: past either bound a registration gets 429, and new
    connections are still accepted."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 1024
    # This process is both client and server: its own descriptors, the objects' and both ends
    # of the extra connections must fit under the limit.
    extra_connections = 16
    if len(os.listdir("/proc/self/fd")) > 256 - 2 * extra_connections - 16 or hard < limit:
        pytest.skip("this process already holds too many descriptors for the test's limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with openinfer.serve(models=[], http_port=0, grpc_port=None, log=False) as s:
            root, other = Http(s.http_port), connect_as(s.http_port, NOBODY)
            try:
                budget = limit - 256  # the reserve: max(256, limit / 4)
                for i in range(budget // 2):
                    status, reply = register(root, f"r{i}", shm_files(64).key, 64)
                    assert status == 200, (i, reply)
                status, reply = register(root, "past", shm_files(64).key, 64)
                assert status == 429 and "one user may hold" in reply["error"], reply
                # The other half is still there for another user, and then the total is reached.
                for i in range(budget // 2):
                    status, reply = register(other, f"r{i}", shm_files(64, owner=NOBODY).key, 64)
                    assert status == 200, (i, reply)
                status, reply = register(other, "past", shm_files(64, owner=NOBODY).key, 64)
                assert status == 429 and "descriptor limit" in reply["error"], reply
                extra = [Http(s.http_port) for _ in range(extra_connections)]  # still accepted
                for c in extra:
                    c.send(encode_request("GET", "/v2/health/live"))
                for c in extra:
                    assert c.read_response()[0] == 200
                    c.close()
                assert post(root, "/v2/systemsharedmemory/unregister")[0] == 200
                assert register(root, "past", shm_files(64).key, 64)[0] == 200
                assert register(other, "past", shm_files(64, owner=NOBODY).key, 64)[0] == 429
            finally:
                root.close()
                other.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_grpc_acts_with_the_clients_rights(shm_files: Any, grpc_stubs: Any) -> None:
    """The same rules over gRPC: PERMISSION_DENIED for an object the client's user may not
    open, and the other user's regions invisible."""
    from test_grpc_transport import H2, SERVICE, status_of

    if os.geteuid() != 0:
        pytest.skip("playing another user needs root")
    pb = grpc_stubs.pb
    victim = shm_files(4096, owner=0, mode=0o600)
    with openinfer.serve(models=[], http_port=0, grpc_port=0, log=False) as s:
        root = Http(s.http_port)
        previous = _libc.setfsuid(NOBODY)
        try:
            other = H2(s.grpc_port)
        finally:
            _libc.setfsuid(previous)
        try:
            assert register(root, "roots", victim.key, 4096)[0] == 200
            reg = pb.SystemSharedMemoryRegisterRequest(name="probe", key=victim.key, byte_size=4096)
            st, = other.wait(other.call(SERVICE + "SystemSharedMemoryRegister", reg.SerializeToString()))
            _, code, message = status_of(st)
            assert code == "7" and f"uid {NOBODY}" in message, (code, message)  # PERMISSION_DENIED
            st, = other.wait(other.call(SERVICE + "SystemSharedMemoryStatus",
                                        pb.SystemSharedMemoryStatusRequest().SerializeToString()))
            assert status_of(st)[1] == "0"
            assert len(pb.SystemSharedMemoryStatusResponse.FromString(st["data"][5:]).regions) == 0
        finally:
            post(root, "/v2/systemsharedmemory/unregister")
            root.close()
            other.close()
