"""Health the way orchestrators and clients ask for it: HEAD on the GET endpoints, the standard
grpc.health.v1 service (Check and Watch, through the grpcio-health-checking client), ModelReady
and unknown-model errors worded and coded as Triton does on both protocols, and /v2 listing
exactly the extensions served."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

from conftest import Http, assert_alive, assert_grpc_alive

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["X"]}


def identity_model(name: str = "identity") -> Model:
    return Model(name, _identity, inputs=[Tensor("X", "FP32", [-1])], outputs=[Tensor("Y", "FP32", [-1])])


def read_head(conn: Http) -> tuple[int, dict[str, str]]:
    """A response's status line and headers only: a HEAD response has no body to read."""
    while b"\r\n\r\n" not in conn.buf:
        if not conn._fill():
            raise ConnectionError(f"connection closed before a response; got {conn.buf!r}")
    head, conn.buf = conn.buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), headers


# ---- HEAD ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/",
        "/v2/models/simple",
        "/v2/models/simple/ready",
        "/v2/models/simple/versions/1/ready",
        "/v2/models/simple/config",
        "/v2/models/nope/ready",  # 400, as GET
        "/v2/models/nope",  # 404, as GET
        "/v2/models/simple/versions/x/config",  # 400, as GET
        "/v2/systemsharedmemory/status",
        "/v2/models/simple/config/x",  # bad paths: 404, as GET
        "/v2/nothing",
        "/v2/models/%zz/config",  # 400, as GET
    ],
)
def test_head_answers_as_get_without_a_body(server: openinfer.Server, path: str) -> None:
    """HEAD gets GET's status and headers (Content-Length included) and no body bytes: the
    next response on the same connection starts right after the head."""
    conn = Http(server.http_port)
    try:
        get_status, get_headers, get_body = conn.request("GET", path)
        conn.send(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, headers = read_head(conn)
        assert status == get_status
        assert int(headers["content-length"]) == len(get_body)
        assert headers.get("content-type") == get_headers.get("content-type")
        assert conn.buf == b""
        # The connection goes on: had the body been sent, it would sit before this answer.
        status, _, body = conn.request("GET", "/v2/health/live")
        assert (status, json.loads(body)) == (200, {"live": True})
    finally:
        conn.close()


def test_head_through_requests(url: str) -> None:
    r = requests.head(url + "/v2/health/ready", timeout=10)
    assert r.status_code == 200 and r.content == b"" and int(r.headers["Content-Length"]) == len(b'{"ready":true}')
    r = requests.head(url + "/v2/models/nope/ready", timeout=10)
    assert r.status_code == 400 and r.content == b""


@pytest.mark.parametrize("path", ["/v2/models/simple/infer", "/v2/systemsharedmemory/register"])
def test_head_on_post_endpoints_is_405(server: openinfer.Server, path: str) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, headers = read_head(conn)
        assert status in (404, 405) and int(headers["content-length"]) > 0 and conn.buf == b""
        assert conn.request("GET", "/v2/health/live")[0] == 200
    finally:
        conn.close()


def test_other_methods_on_health_still_405(url: str) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        r = requests.request(method, url + "/v2/health/live", timeout=10)
        assert r.status_code == 405 and "use GET or HEAD" in r.json()["error"]


# ---- grpc.health.v1 ----------------------------------------------------------------------


@pytest.fixture
def health_stub(server: openinfer.Server) -> Iterator[Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        yield health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "anything"])
def test_check_serving(health_stub: Any, service: str) -> None:
    """As Triton: every service name gets the server's readiness."""
    r = health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert r.status == SERVING


def test_check_not_serving_while_a_model_is_not_ready(tmp_path: Any) -> None:
    (tmp_path / "broken").mkdir()  # no version directory: the model fails to load
    with openinfer.serve(tmp_path, models=identity_model(), http_port=0, log=False) as s:
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == NOT_SERVING
            watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
            assert next(watch).status == NOT_SERVING
            watch.cancel()
        assert requests.get(s.url + "/v2/health/ready", timeout=10).status_code == 400


def test_watch_sends_not_serving_on_shutdown() -> None:
    s = openinfer.serve(models=identity_model(), http_port=0, log=False)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watches = [stub.Watch(health_pb2.HealthCheckRequest(service=n), timeout=30) for n in ("", "x")]
            assert [next(w).status for w in watches] == [SERVING, SERVING]
            stopper = threading.Thread(target=s.stop)
            stopper.start()
            for w in watches:
                assert next(w).status == NOT_SERVING
                with pytest.raises(grpc.RpcError) as e:
                    next(w)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            stopper.join(30)
            assert not stopper.is_alive()
    finally:
        s.stop()


def test_cancelled_watches_leave_nothing_behind(server: openinfer.Server, health_stub: Any) -> None:
    """Clients that open Watch and go away (the usual probe) are dropped; the server goes on
    and new watches still answer."""
    for _ in range(20):
        w = health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(w).status == SERVING
        w.cancel()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:  # a channel closed mid-watch
        w = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(w).status == SERVING
    assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
    assert_grpc_alive(server.grpc_port)


def test_health_bad_requests(server: openinfer.Server, grpc_channel: Any) -> None:
    for method in ("Check", "Watch"):
        call = grpc_channel.unary_unary(f"/grpc.health.v1.Health/{method}") if method == "Check" else \
            grpc_channel.unary_stream(f"/grpc.health.v1.Health/{method}")
        with pytest.raises(grpc.RpcError) as e:
            result = call(b"\x0a\x05ab", timeout=10)  # a string field cut short
            if method == "Watch":
                next(result)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "HealthCheckRequest" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        grpc_channel.unary_unary("/grpc.health.v1.Health/List")(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_grpc_alive(server.grpc_port)


# ---- ModelReady and unknown models --------------------------------------------------------


def test_model_ready_for_unknown_models(server: openinfer.Server) -> None:
    g = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    h = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        for client in (g, h):
            assert client.is_model_ready("simple") is True
            assert client.is_model_ready("nope") is False
            assert client.is_model_ready("simple", "7") is False
    finally:
        g.close()
        h.close()
    body = requests.get(server.url + "/v2/models/nope/ready", timeout=10)
    assert body.status_code == 400
    assert body.json() == {"name": "nope", "ready": False, "error": "Request for unknown model: 'nope' is not found"}


UNKNOWN = "Request for unknown model: 'nope' is not found"
UNKNOWN_VERSION = "Request for unknown model: 'simple' version 7 is not found"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.get_model_metadata("nope"), UNKNOWN),
        (lambda c: c.get_model_config("nope"), UNKNOWN),
        (lambda c: c.get_model_metadata("simple", "7"), UNKNOWN_VERSION),
        (lambda c: c.get_model_config("simple", "7"), UNKNOWN_VERSION),
        (lambda c: c.infer("nope", [_input(c)]), UNKNOWN),
        (lambda c: c.infer("simple", [_input(c)], model_version="7"), UNKNOWN_VERSION),
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unknown_model_wording(server: openinfer.Server, protocol: str, call: Any, message: str) -> None:
    if protocol == "http":
        client: Any = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    else:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        with pytest.raises(InferenceServerException) as e:
            call(client)
        assert e.value.message() == message
        assert e.value.status() in ("404", "StatusCode.NOT_FOUND")
    finally:
        client.close()


def _input(client: Any) -> Any:
    module = thttp if isinstance(client, thttp.InferenceServerClient) else tgrpc
    x = module.InferInput("INPUT0", [1, 16], "INT32")
    x.set_data_from_numpy(np.zeros((1, 16), np.int32))
    return x


def test_bad_version_string(server: openinfer.Server, stub: Any, grpc_stubs: Any) -> None:
    r = requests.get(server.url + "/v2/models/simple/versions/1x/config", timeout=10)
    assert r.status_code == 400
    assert r.json()["error"].startswith("failed to get model version from specified version string '1x'")
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelConfig(grpc_stubs.pb.ModelConfigRequest(name="simple", version="-1"), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'-1'" in e.value.details()


# ---- /v2 ---------------------------------------------------------------------------------------


def test_extensions_are_exactly_those_served(server: openinfer.Server) -> None:
    meta = requests.get(server.url + "/v2", timeout=10).json()
    assert meta["extensions"] == ["binary_tensor_data", "classification", "logging", "model_configuration", "model_repository",
                                  "statistics", "trace", "system_shared_memory", "cuda_shared_memory"]
    # Each listed extension answers (shared memory: its status endpoint).
    assert requests.get(server.url + "/v2/models/simple/config", timeout=10).status_code == 200
    assert requests.get(server.url + "/v2/models/simple/stats", timeout=10).status_code == 200
    assert requests.post(server.url + "/v2/repository/index", timeout=10).status_code == 200
    assert requests.get(server.url + "/v2/systemsharedmemory/status", timeout=10).status_code == 200
    assert requests.get(server.url + "/v2/logging", timeout=10).status_code == 200
    assert requests.get(server.url + "/v2/trace/setting", timeout=10).status_code == 200
    g = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        assert list(g.get_server_metadata().extensions) == meta["extensions"]
    finally:
        g.close()


def test_extensions_without_shared_memory() -> None:
    with openinfer.serve(models=identity_model(), http_port=0, log=False, allow_shared_memory=False) as s:
        meta = requests.get(s.url + "/v2", timeout=10).json()
        assert meta["extensions"] == ["binary_tensor_data", "classification", "logging", "model_configuration", "model_repository",
                                      "statistics", "trace"]
        assert_alive(s.http_port)


def test_watch_follows_readiness_changes() -> None:
    """A version registered while serving changes readiness; watchers hear it at once."""
    with openinfer.serve(models=identity_model(), http_port=0, log=False) as s:
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == SERVING
            # A version that failed to load, registered the way the server registers one.
            s._core.add_model("late", 1, inputs=(), outputs=(), max_batch_size=0, metadata_json=b"{}",
                              handler=None, error="broken on purpose")
            assert next(watch).status == NOT_SERVING
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == NOT_SERVING
            watch.cancel()
