"""Unix-domain socket listeners, the recommended transport on one host: HTTP and gRPC served
on socket files beside TCP or instead of it, reached by curl --unix-socket, grpcio and
tritonclient.grpc (``unix:PATH``) and the openinfer Client (``unix:PATH`` / ``grpc+unix:PATH``);
the socket file made safely (a stale socket replaced, anything else refused and left alone,
permission bits as configured, removed at stop); and each connection acting with its own
process's user: a client running as another user is refused what that user may not open."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import Model, Tensor

from conftest import Cli

NOBODY = 65534
CURL = shutil.which("curl")
# Outside programs (curl, the system's python3) run without the sanitizer run's preload.
OUTSIDE_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


ECHO = Model("echo", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory others may enter (pytest's tmp_path is below /root, which is 0700,
    and can pass the 107 bytes a socket path may have)."""
    d = Path("/tmp") / f"oi_unix_{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def curl(sock: Path, path: str, data: bytes | None = None, user: int | None = None) -> tuple[int, Any]:
    """curl over the Unix socket (as `user`, when given): (status, parsed JSON body)."""
    assert CURL is not None, "curl is needed (scripts/setup.sh installs it)"
    cmd = [CURL, "-sS", "--max-time", "30", "--unix-socket", str(sock), "-o", "-", "-w", "\n%{http_code}"]
    if data is not None:
        cmd += ["--data-binary", "@-", "-H", "Content-Type: application/json"]
    r = subprocess.run(cmd + ["http://localhost" + path], input=data, capture_output=True, timeout=60, user=user,
                       env=OUTSIDE_ENV)
    assert r.returncode == 0, r.stderr
    body, _, code = r.stdout.rpartition(b"\n")
    return int(code), json.loads(body) if body else None


def infer_body(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()


# ---- serving ---------------------------------------------------------------------------------


def test_unix_only_http_and_grpc(sockdir: Path, grpc_stubs: Any) -> None:
    import grpc
    import tritonclient.grpc as tgrpc

    h, g = sockdir / "http.sock", sockdir / "grpc.sock"
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, grpc_unix=g, threads=2, log=False) as srv:
        assert srv.http_port is None and srv.grpc_port is None
        assert srv.url == f"unix://{h}" and srv.grpc_url == f"grpc+unix://{g}"
        assert stat.S_ISSOCK(os.stat(h).st_mode) and stat.S_ISSOCK(os.stat(g).st_mode)

        # curl, and the openinfer Client in both spellings of the path.
        assert curl(h, "/v2/health/ready") == (200, {"ready": True})
        status, body = curl(h, "/v2/models/echo/infer", infer_body([1, 2, 3]))
        assert status == 200 and body["outputs"][0]["data"] == [1, 2, 3]
        for url in (srv.url, f"unix:{h}", f"unix:{os.path.relpath(h)}"):
            with openinfer.Client(url) as client:
                out = client.infer("echo", {"INPUT0": np.arange(5, dtype=np.int32)})
                np.testing.assert_array_equal(out["OUTPUT0"], np.arange(5, dtype=np.int32))
                assert client.is_server_ready()

        # grpcio and tritonclient.grpc dial gRPC's own unix: target; the Client takes grpc+unix:.
        with grpc.insecure_channel(f"unix:{g}") as channel:
            stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerLive(grpc_stubs.pb.ServerLiveRequest(), timeout=10).live
            req = grpc_stubs.pb.ModelInferRequest(model_name="echo")
            req.inputs.add(name="INPUT0", datatype="INT32", shape=[3])
            req.raw_input_contents.append(np.array([7, 8, 9], dtype=np.int32).tobytes())
            resp = stub.ModelInfer(req, timeout=10)
            assert np.frombuffer(resp.raw_output_contents[0], dtype=np.int32).tolist() == [7, 8, 9]
        triton = tgrpc.InferenceServerClient(f"unix://{g}")
        inp = tgrpc.InferInput("INPUT0", [2], "INT32")
        inp.set_data_from_numpy(np.array([4, 5], dtype=np.int32))
        assert triton.infer("echo", [inp]).as_numpy("OUTPUT0").tolist() == [4, 5]
        triton.close()
        with openinfer.Client(srv.grpc_url) as client:
            assert client.infer("echo", {"INPUT0": np.array([6], dtype=np.int32)})["OUTPUT0"].tolist() == [6]

        # A Unix socket is this host: the Client stages large tensors in shared memory.
        big = np.arange(4 << 20, dtype=np.int32)
        for url in (srv.url, srv.grpc_url):
            with openinfer.Client(url) as client:
                np.testing.assert_array_equal(client.infer("echo", {"INPUT0": big})["OUTPUT0"], big)
                assert isinstance(client._shm_pool, openinfer.shm.Pool)
    assert not h.exists() and not g.exists(), "the socket files are removed at stop"


def test_unix_beside_tcp(sockdir: Path) -> None:
    h, g = sockdir / "h.sock", sockdir / "g.sock"
    with openinfer.serve(models=[ECHO], http_port=0, http_unix=h, grpc_unix=g, threads=1, log=False) as srv:
        assert srv.http_port and srv.grpc_port and srv.http_unix == str(h) and srv.grpc_unix == str(g)
        for url in (srv.url, srv.grpc_url, f"unix:{h}", f"grpc+unix://{g}"):
            with openinfer.Client(url) as client:
                assert client.infer("echo", {"INPUT0": np.array([1], dtype=np.int32)})["OUTPUT0"].tolist() == [1]


def test_socket_mode_default_and_configured(sockdir: Path) -> None:
    h = sockdir / "h.sock"
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, log=False, threads=1):
        assert stat.S_IMODE(os.stat(h).st_mode) == 0o660
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, unix_socket_mode=0o600, log=False, threads=1):
        assert stat.S_IMODE(os.stat(h).st_mode) == 0o600
    with pytest.raises(ValueError, match="unix_socket_mode"):
        openinfer.Server(models=[ECHO], http_port=None, http_unix=h, unix_socket_mode=0o1777)


# ---- the socket file -------------------------------------------------------------------------


def test_a_file_that_is_not_a_socket_is_refused_and_kept(sockdir: Path) -> None:
    victim = sockdir / "data.txt"
    victim.write_text("precious")
    with pytest.raises(OSError, match="exists and is not a socket; refusing to replace it"):
        openinfer.serve(models=[ECHO], http_port=None, http_unix=victim, log=False, threads=1)
    assert victim.read_text() == "precious"
    (sockdir / "dir").mkdir()
    with pytest.raises(OSError, match="not a socket"):
        openinfer.serve(models=[ECHO], http_port=0, grpc_unix=sockdir / "dir", log=False, threads=1)
    assert (sockdir / "dir").is_dir()
    link = sockdir / "link.sock"
    link.symlink_to(victim)
    with pytest.raises(OSError, match="not a socket"):
        openinfer.serve(models=[ECHO], http_port=None, http_unix=link, log=False, threads=1)
    assert link.is_symlink() and victim.read_text() == "precious"


def test_a_stale_socket_is_replaced(sockdir: Path) -> None:
    h = sockdir / "h.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(h))  # bound and closed without listening: what a killed server leaves
    dead.close()
    assert stat.S_ISSOCK(os.stat(h).st_mode)
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, log=False, threads=1):
        assert curl(h, "/v2/health/live") == (200, {"live": True})


def test_a_socket_another_server_listens_on_is_refused(sockdir: Path) -> None:
    h = sockdir / "h.sock"
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, log=False, threads=1):
        with pytest.raises(OSError, match="another server is listening on that socket"):
            openinfer.serve(models=[ECHO], http_port=None, http_unix=h, log=False, threads=1)
        assert curl(h, "/v2/health/live") == (200, {"live": True}), "the first server keeps its socket"
    assert not h.exists()


def test_the_file_is_left_alone_when_replaced_while_serving(sockdir: Path) -> None:
    h = sockdir / "h.sock"
    srv = openinfer.serve(models=[ECHO], http_port=None, http_unix=h, log=False, threads=1)
    os.unlink(h)
    h.write_text("someone else's")  # an operator put another file there meanwhile
    srv.stop()
    assert h.read_text() == "someone else's"


def test_bad_paths_and_ports(sockdir: Path) -> None:
    with pytest.raises(ValueError, match="socket path of 1 to 107 bytes"):
        openinfer.Server(models=[ECHO], http_port=0, http_unix="/tmp/" + "x" * 120)
    with pytest.raises(ValueError, match="give http_unix too"):
        openinfer.Server(models=[ECHO], http_port=None)
    with pytest.raises(OSError, match="No such file or directory|no such file"):
        openinfer.serve(models=[ECHO], http_port=None, http_unix=sockdir / "missing" / "h.sock", log=False)
    with pytest.raises(ValueError, match="absolute path"):
        openinfer.Client("unix://relative.sock")
    with pytest.raises(ValueError, match="no socket path"):
        openinfer.Client("grpc+unix:")
    with openinfer.Client(f"unix:{sockdir}/nobody-listens.sock") as client, \
            pytest.raises(ConnectionError, match="cannot connect to"):
        client.is_server_live()


# ---- whose rights ----------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_a_client_as_another_user_is_checked_with_its_own_uid(sockdir: Path) -> None:
    # The server runs as root; curl runs as nobody in a process of its own, over the Unix
    # socket (mode 0666 so that nobody may connect). SO_PEERCRED names nobody, so a 0600
    # root object is refused to it, while the same request from root on the same socket works.
    h = sockdir / "h.sock"
    name = f"oi_unix_{uuid.uuid4().hex[:10]}"
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    mine = f"oi_unix_nobody_{uuid.uuid4().hex[:10]}"
    try:
        os.ftruncate(fd, 64)
        os.pwrite(fd, b"root's secret", 0)
        body = json.dumps({"key": f"/{name}", "offset": 0, "byte_size": 64}).encode()
        with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, unix_socket_mode=0o666, log=False,
                             threads=1, allow_shared_memory=True):
            status, reply = curl(h, "/v2/systemsharedmemory/region/stolen/register", body, user=NOBODY)
            assert status == 403, reply
            assert f"key '/{name}'" in reply["error"] and f"uid {NOBODY}" in reply["error"]
            assert curl(h, "/v2/systemsharedmemory/status", user=NOBODY) == (200, [])

            # nobody's own object: registered, and seen by nobody only.
            own = os.open(f"/dev/shm/{mine}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(own, 64)
            os.fchown(own, NOBODY, NOBODY)
            os.close(own)
            own_body = json.dumps({"key": f"/{mine}", "offset": 0, "byte_size": 64}).encode()
            assert curl(h, "/v2/systemsharedmemory/region/theirs/register", own_body, user=NOBODY)[0] == 200
            status, regions = curl(h, "/v2/systemsharedmemory/status", user=NOBODY)
            assert status == 200 and [r["name"] for r in regions] == ["theirs"]

            # root, on the same socket: its own object registers, nobody's region is not its.
            assert curl(h, "/v2/systemsharedmemory/region/mine/register", body)[0] == 200
            status, regions = curl(h, "/v2/systemsharedmemory/status")
            assert status == 200 and [r["name"] for r in regions] == ["mine"]
            assert curl(h, "/v2/health/ready", user=NOBODY) == (200, {"ready": True})
    finally:
        os.close(fd)
        for n in (name, mine):
            try:
                os.unlink(f"/dev/shm/{n}")
            except FileNotFoundError:
                pass


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_a_grpc_client_as_another_user_is_checked_with_its_own_uid(sockdir: Path, grpc_stubs: Any) -> None:
    # A forked child drops to nobody (uid and groups) and calls SystemSharedMemoryRegister
    # over the gRPC Unix socket with the pure-Python h2 client: PERMISSION_DENIED naming uid
    # 65534; the parent (root), on the same socket, registers the object.
    import h2.config
    import h2.connection
    from test_grpc_transport import H2, SERVICE, status_of

    class H2Unix(H2):
        def __init__(self, path: str) -> None:  # H2 over a Unix socket
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(10)
            self.sock.connect(path)
            self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                              header_encoding="utf-8"))
            self.conn.initiate_connection()
            self.flush()
            self.streams = {}
            self.goaway = False

    g = sockdir / "g.sock"
    name = f"oi_unix_{uuid.uuid4().hex[:10]}"
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 64)
        msg = grpc_stubs.pb.SystemSharedMemoryRegisterRequest(name="r", key=f"/{name}", offset=0,
                                                              byte_size=64).SerializeToString()

        def register() -> tuple[str, str, str]:
            conn = H2Unix(str(g))
            try:
                [st] = conn.wait(conn.call(SERVICE + "SystemSharedMemoryRegister", msg))
                return status_of(st)
            finally:
                conn.close()

        with openinfer.serve(models=[ECHO], http_port=0, grpc_port=None, grpc_unix=g, unix_socket_mode=0o666,
                             log=False, threads=1, allow_shared_memory=True):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: nobody, then one call, then out without cleanup
                try:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                    os.write(w, json.dumps(register()).encode())
                except BaseException as e:  # noqa: BLE001 - reported through the pipe
                    os.write(w, json.dumps(["error", repr(e), ""]).encode())
                finally:
                    os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                child = json.loads(f.read())
            os.waitpid(pid, 0)
            _, code, text = child
            assert code == "7", child  # PERMISSION_DENIED
            assert f"key '/{name}'" in text and f"uid {NOBODY}" in text
            assert register()[1] == "0", "root may register its own object over the same socket"
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_socket_permissions_keep_other_users_out(sockdir: Path) -> None:
    h = sockdir / "h.sock"
    with openinfer.serve(models=[ECHO], http_port=None, http_unix=h, unix_socket_mode=0o600, log=False, threads=1):
        # connect() as nobody, from a Python of the system (this one may live below /root).
        python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or pytest.skip("no system python3")
        probe = "import socket, sys\ntry:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n" \
                "except OSError as e:\n    print(e.errno)\nelse:\n    print(0)"
        r = subprocess.run([python, "-c", probe, str(h)], capture_output=True, text=True, timeout=60, user=NOBODY,
                           env=OUTSIDE_ENV)
        assert r.stdout.strip() == str(errno.EACCES), r
        assert curl(h, "/v2/health/live") == (200, {"live": True})


# ---- the command line -------------------------------------------------------------------------


def test_cli_unix_only(sockdir: Path) -> None:
    h, g = sockdir / "h.sock", sockdir / "g.sock"
    cli = Cli(argv=[sys.executable, "-m", "openinfer", "serve", "--http-port", "-1", "--http-unix", str(h),
                    "--grpc-unix", str(g), "--unix-socket-mode", "640", "--threads", "1"])
    try:
        assert f"unix://{h}" in cli.output() and f"grpc+unix://{g}" in cli.output()
        assert stat.S_IMODE(os.stat(h).st_mode) == 0o640
        assert curl(h, "/v2/health/live") == (200, {"live": True})
        with openinfer.Client(f"grpc+unix:{g}") as client:
            assert client.is_server_live()
        cli.proc.send_signal(signal.SIGTERM)
        assert cli.wait()[0] == 0
        assert not h.exists() and not g.exists()
    finally:
        cli.kill()


def test_cli_bad_socket_mode() -> None:
    from openinfer.cli import _parser

    assert _parser().parse_args(["serve", "--unix-socket-mode", "0o640"]).unix_socket_mode == 0o640
    for bad in ("rw-", "1777", "9"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["serve", "--unix-socket-mode", bad])


def test_cli_http_port_minus_one_needs_a_socket() -> None:
    r = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "-1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--http-port -1 needs --http-unix PATH" in r.stderr
