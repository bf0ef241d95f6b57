"""Shared fixtures: one server per session with the example repository and test models, and
small HTTP helpers that go through real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import Model, Tensor, _core

V2_TYPES = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]
# The numpy type of each fixed-size V2 datatype.
NP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BF16": np.uint16,  # BF16 as its raw 16-bit patterns
}


def pytest_configure(config: pytest.Config) -> None:
    # The sanitizer run (make test-asan) must test the sanitized extension, not another one.
    pkg = os.environ.get("OI_PACKAGE_DIR")
    if pkg:
        here = os.path.realpath(os.path.dirname(openinfer.__file__))
        assert here.startswith(os.path.realpath(pkg)), f"openinfer imported from {here}, expected {pkg}"


# The sequence batching of a model that accumulates INPUT0 (SUM_IN -> SUM_OUT, implicit state)
# from a START control: what the sequence-cancellation tests serve, with their own strategies.
START_AND_SUM_STATE: dict[str, Any] = {
    "control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}],
    "state": [{"input_name": "SUM_IN", "output_name": "SUM_OUT", "data_type": "TYPE_INT32", "dims": [1]}],
}


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _versioned(version: int) -> Model:
    def fn(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": np.full(inputs["INPUT0"].shape, version, dtype=np.int32)}

    return Model(
        "versioned", fn, version=version,
        inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])],
    )


def _raises(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise ValueError("the model refuses negative numbers")


def _client_error(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise openinfer.InferenceServerError(422, "INPUT0 must be sorted")


def _params(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.array([json.dumps(parameters, sort_keys=True).encode()], dtype=object)}


def _slow(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(float(inputs["INPUT0"][0]) / 1000.0)
    return {"OUTPUT0": inputs["INPUT0"]}


def _wrong_dtype(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.zeros(3, dtype=np.float64)}


def _missing_output(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {}


def test_models() -> list[Model]:
    models = [
        Model(f"echo_{t.lower()}", _echo, inputs=[Tensor("INPUT0", t, [-1])], outputs=[Tensor("OUTPUT0", t, [-1])])
        for t in V2_TYPES
    ]
    models += [_versioned(v) for v in (1, 2, 3)]
    one_int = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    models += [
        Model("raises", _raises, **one_int),
        Model("client_error", _client_error, **one_int),
        Model("slow", _slow, instances=4, **one_int),
        Model("wrong_dtype", _wrong_dtype, **one_int),
        Model("missing_output", _missing_output, **one_int),
        Model("params", _params, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "BYTES", [1])]),
        Model(
            "matrix", _echo,
            inputs=[Tensor("INPUT0", "FP32", [-1, 2, 3])], outputs=[Tensor("OUTPUT0", "FP32", [-1, 2, 3])],
            max_batch_size=4,
        ),
    ]
    return models


test_models.__test__ = False  # type: ignore[attr-defined]  # a factory, not a test


@pytest.fixture(scope="session")
def server() -> Iterator[openinfer.Server]:
    srv = openinfer.serve(
        openinfer.examples_path(), models=test_models(), http_port=0, threads=2, log=False,
        max_body_bytes=64 << 20, header_timeout_ms=1500, idle_timeout_ms=60_000,
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def url(server: openinfer.Server) -> str:
    return server.url


class Http:
    """A keep-alive HTTP/1.1 connection on a raw socket, for the tests that need control over
    the bytes (pipelining, partial writes, bad framing)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.buf += chunk
        return bool(chunk)

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"connection closed before a response; got {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("connection closed inside a response body")
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        self.send(encode_request(method, path, body, headers))
        return self.read_response()

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def encode_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    hdrs = {"Host": "127.0.0.1"}
    if body or method == "POST":
        hdrs["Content-Length"] = str(len(body))
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return head.encode("latin-1") + body


@pytest.fixture
def http(server: openinfer.Server) -> Iterator[Http]:
    conn = Http(server.http_port)
    try:
        yield conn
    finally:
        conn.close()


def infer_body(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def assert_alive(port: int) -> None:
    """The server still answers on a new connection."""
    conn = Http(port)
    try:
        status, _, body = conn.request("GET", "/v2/health/live")
        assert (status, json.loads(body)) == (200, {"live": True})
    finally:
        conn.close()


# ---- gRPC ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def grpc_stubs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Python stubs generated from proto/ (grpc_service, model_config, health) with grpcio-tools
    for this test session. Their messages live in a private descriptor pool, so they coexist
    with the copies of the same protos that tritonclient and grpcio-health-checking register.
    Returns a namespace with `pb` (messages) and `rpc` (the GRPCInferenceServiceStub module),
    `mc` (model_config messages), `health` and `health_rpc` (grpc.health.v1)."""
    import importlib.util
    import subprocess
    import sys
    import types

    out = tmp_path_factory.mktemp("grpc_stubs")
    proto_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "proto")
    # In a child process without the sanitizer run's preload: protoc is not ours to check.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    protos = ["model_config.proto", "grpc_service.proto", "health.proto"]
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}", *(os.path.join(proto_dir, p) for p in protos)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"grpc_tools.protoc failed on proto/: {r.stderr}"
    # One private descriptor pool for the three, so they coexist with tritonclient's copies.
    (out / "oi_test_pool.py").write_text("from google.protobuf import descriptor_pool\npool = descriptor_pool.DescriptorPool()\n")
    renames = {"import model_config_pb2 as": "import oi_test_model_config_pb2 as",
               "import grpc_service_pb2 as": "import oi_test_grpc_service_pb2 as",
               "import health_pb2 as": "import oi_test_health_pb2 as",
               "_descriptor_pool.Default()": "__import__('oi_test_pool').pool"}
    for path in out.glob("*_pb2*.py"):
        text = path.read_text()
        for a, b in renames.items():
            text = text.replace(a, b)
        path.write_text(text)

    def load(name: str, path: Any) -> Any:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("oi_test_pool", out / "oi_test_pool.py")
    mc = load("oi_test_model_config_pb2", out / "model_config_pb2.py")
    pb = load("oi_test_grpc_service_pb2", out / "grpc_service_pb2.py")
    rpc = load("oi_test_grpc_service_pb2_grpc", out / "grpc_service_pb2_grpc.py")
    health = load("oi_test_health_pb2", out / "health_pb2.py")
    health_rpc = load("oi_test_health_pb2_grpc", out / "health_pb2_grpc.py")
    return types.SimpleNamespace(pb=pb, rpc=rpc, mc=mc, health=health, health_rpc=health_rpc)


GRPC_BIG_MESSAGES = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@pytest.fixture(scope="session")
def grpc_channel(server: openinfer.Server) -> Iterator[Any]:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=GRPC_BIG_MESSAGES)
    try:
        yield channel
    finally:
        channel.close()


@pytest.fixture(scope="session")
def stub(grpc_stubs: Any, grpc_channel: Any) -> Any:
    return grpc_stubs.rpc.GRPCInferenceServiceStub(grpc_channel)


def assert_grpc_alive(port: int) -> None:
    """The gRPC side still answers on a new connection."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=10)
    assert live == b"\x08\x01"


@pytest.fixture
def hold() -> Iterator[None]:
    """Work sent to the worker pool (decompression, compression) waits on a hold until the test
    ends, so a test can show the event loop serving meanwhile."""
    _core._hold_work(True)
    try:
        yield
    finally:
        _core._hold_work(False)


_triton_clients: list[Any] = []


@pytest.fixture(autouse=True)
def _close_triton_clients() -> Iterator[None]:
    """Closes the clients a test made with triton_http/triton_grpc: a gRPC channel left open
    keeps threads running at exit."""
    yield
    while _triton_clients:
        _triton_clients.pop().close()


def triton_http(srv: openinfer.Server, timeout: float = 30.0) -> Any:
    """A tritonclient.http client of `srv`, closed after the test."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}", network_timeout=timeout)
    _triton_clients.append(client)
    return client


def triton_grpc(srv: openinfer.Server) -> Any:
    """A tritonclient.grpc client of `srv`, closed after the test."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    _triton_clients.append(client)
    return client


def save_torchscript(source: str, cls: str, model_pt: Any, workdir: Any) -> None:
    """Scripts class `cls` of the Python `source` (written to a file in `workdir` first:
    torch.jit.script reads a class's source file) and saves it as `model_pt`, its directory
    made. Skips the test without torch."""
    torch = pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    name = f"scripted_{cls.lower()}"
    path = Path(workdir) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Path(model_pt).parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(getattr(module, cls)()).save(str(model_pt))


# A Python model of one INT32 input and output, as a config override's fields (JSON) and as
# config.pbtxt text.
INT32_IO: dict[str, Any] = {
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
}
INT32_IO_PBTXT = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def python_model(repo: Path, name: str, code: str, extra: str = "") -> None:
    """Writes model `name` (config.pbtxt of INT32_IO_PBTXT then `extra`, 1/model.py of `code`)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{INT32_IO_PBTXT}{extra}')
    (repo / name / "1" / "model.py").write_text(code)


def wait_for(cond: Callable[[], bool], what: str, bound: float = 30.0) -> None:
    """Polls `cond` until it holds; `bound` seconds only stop a hang, they are not a timing claim."""
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, f"still not {what} after {bound}s"
        time.sleep(0.01)


def pending_requests(srv: openinfer.Server, model: str) -> float:
    """Requests of `model` queued in `srv` (its /metrics: nv_inference_pending_request_count)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    assert srv.metrics_url is not None, "the server has no metrics"
    text = requests.get(srv.metrics_url, timeout=30).text
    family = {f.name: f for f in text_string_to_metric_families(text)}["nv_inference_pending_request_count"]
    return sum(s.value for s in family.samples if s.labels["model"] == model)


def concurrent(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """fn(0) .. fn(n - 1) on n threads that start together; their results, in order. Fails if
    a call raised or a thread has not ended after 120 s (a bound on a hang, not a timing)."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a call still runs after 120 s"
    return results


def wait_until_held(n: int = 1, bound: float = 60.0) -> None:
    """Waits (bounded) for `n` pieces of work to be waiting on the hold."""
    end = time.monotonic() + bound
    while _core._held_work() < n:
        assert time.monotonic() < end, f"{_core._held_work()} of {n} pieces of work reached the hold"
        time.sleep(0.005)


def worker_children() -> set[int]:
    """This process's children that are model workers. Read from each process's parent in
    /proc/PID/stat: /proc/self/task/*/children misses children while others start or end."""
    me, found = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:  # a process may end meanwhile
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            if ppid == me and b"openinfer._worker" in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                found.add(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    return found


@pytest.fixture(scope="module")
def file_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A gate a model in any process can wait at: the path in $PYB_GATE, open once it exists
    (the model notes each wait in PATH.held)."""
    path = tmp_path_factory.mktemp("gate") / "open"
    mp = pytest.MonkeyPatch()
    mp.setenv("PYB_GATE", str(path))
    yield path
    mp.undo()


def port_is_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


class Cli:
    """`openinfer serve ARGS` (on a free HTTP port, one loop thread), or any command line given
    whole as `argv`, in a subprocess that has started once it logs "listening on"; its output
    is collected by a thread (reading the pipe from two places would lose lines). `port` is
    the HTTP port of the first "listening on http://127.0.0.1:PORT", when there is one."""

    def __init__(self, *args: str, argv: list[str] | None = None, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        if argv is None:
            argv = [sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--threads", "1", *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=cwd)
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.port = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.listening.wait(60):
            self.kill()
            raise AssertionError("no 'listening on' line: " + self.output())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"listening on (?:http://127\.0\.0\.1:(\d+))?", line)
            if m and not self.listening.is_set():
                self.port = int(m.group(1) or 0)
                self.listening.set()

    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 30) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(10)
        return rc, self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)


@contextlib.contextmanager
def serve_apart(repo: Path, *args: str) -> Iterator[tuple[str, str]]:
    """`openinfer serve REPO` in a process of its own, HTTP and gRPC on free ports; yields their
    URLs. CUDA IPC needs it: a handle cannot be opened by the process that exported it, so a
    server that maps a client's CUDA memory is another process, as for every real client."""
    cli = Cli(str(repo), "--grpc-port", "0", "--metrics-port", "0", *args)
    try:
        m = re.search(r"grpc://127\.0\.0\.1:(\d+)", cli.output())
        assert m and cli.port, cli.output()
        yield f"http://127.0.0.1:{cli.port}", f"grpc://127.0.0.1:{m.group(1)}"
    finally:
        cli.kill()


class Observed:
    """What a test model (a generator) saw, shared with the test: items produced, whether it was
    closed (GeneratorExit) or ran to its end, and a gate the test opens. Waits end after 30 s
    at most: a bound against hanging, not a timing claim."""

    BOUND = 30.0

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.reset()

    def reset(self) -> None:
        self.produced = 0
        self.closed = False
        self.finished = False
        self.gate = threading.Event()

    def note(self, **changes: Any) -> None:
        with self.cond:
            for key, value in changes.items():
                setattr(self, key, value)
            self.cond.notify_all()

    def wait_for(self, predicate: Any, what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, self.BOUND), f"never {what}: produced {self.produced}"


def executor_switches() -> int:
    """Context switches of this process's executor threads so far (they all sleep when idle,
    so only the model being called adds to them)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != "oi-exec":
                continue
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total
