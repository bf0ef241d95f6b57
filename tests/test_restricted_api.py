"""tritonserver's restricted APIs (--http-restricted-api, --grpc-restricted-protocol) over real
sockets: every group over HTTP (requests, tritonclient.http), gRPC (grpcio, tritonclient.grpc)
and the legacy v1 API on both, with and without the header, with a wrong value and with the
header's name in another case; the flags' errors in tritonserver's words; and the one warning
a server gives when its control APIs answer anyone beyond this host."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from typing import Any, Iterator

import numpy as np
import pytest
import requests
from conftest import Http, triton_grpc, triton_http

import openinfer
from openinfer import Model, Tensor

GROUPS = ["health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
          "trace", "logging"]


def header(group: str) -> str:
    """Each group its own header (configured in mixed case) and value, so that a request that
    reaches the wrong group's check is told so."""
    return f"X-{group.title()}-Key"


def value(group: str) -> str:
    return f"secret-{group}-0123456789"


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    model = Model("m", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    srv = openinfer.serve(
        models=[model], http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False,
        http_restricted_api=[f"{g}:{header(g)}={value(g)}" for g in GROUPS],
        grpc_restricted_protocol=[f"{g}:{header(g)}={value(g)}" for g in GROUPS],
    )
    try:
        yield srv
    finally:
        srv.stop()


INFER = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[2],"data":[1,2]}]}'

# (method, path, body, the groups it belongs to), every V2 route, generate and the legacy API.
HTTP_ROUTES = [
    ("GET", "/v2", b"", ["metadata"]),
    ("GET", "/v2/health/live", b"", ["health"]),
    ("GET", "/v2/health/ready", b"", ["health"]),
    ("GET", "/v2/models/m", b"", ["metadata"]),
    ("GET", "/v2/models/m/versions/1", b"", ["metadata"]),
    ("GET", "/v2/models/m/ready", b"", ["health"]),
    ("GET", "/v2/models/m/versions/1/ready", b"", ["health"]),
    ("GET", "/v2/models/m/config", b"", ["model-config"]),
    ("POST", "/v2/models/m/infer", INFER, ["inference"]),
    ("POST", "/v2/models/m/versions/1/infer", INFER, ["inference"]),
    ("POST", "/v2/models/m/generate", b'{"INPUT0":[1]}', ["inference"]),
    ("POST", "/v2/models/m/generate_stream", b'{"INPUT0":[1]}', ["inference"]),
    ("GET", "/v2/models/stats", b"", ["statistics"]),
    ("GET", "/v2/models/m/stats", b"", ["statistics"]),
    ("GET", "/v2/models/m/versions/1/stats", b"", ["statistics"]),
    ("GET", "/v2/trace/setting", b"", ["trace"]),
    ("GET", "/v2/models/m/trace/setting", b"", ["trace"]),
    ("GET", "/v2/logging", b"", ["logging"]),
    ("POST", "/v2/logging", b'{"log_verbose_level":0}', ["logging"]),
    ("POST", "/v2/repository/index", b"", ["model-repository"]),
    ("POST", "/v2/repository/models/nothing/load", b"", ["model-repository"]),
    ("POST", "/v2/repository/models/nothing/unload", b"", ["model-repository"]),
    ("GET", "/v2/systemsharedmemory/status", b"", ["shared-memory"]),
    ("POST", "/v2/systemsharedmemory/region/r/unregister", b"", ["shared-memory"]),
    ("GET", "/v2/cudasharedmemory/status", b"", ["shared-memory"]),
    ("GET", "/api/health/live", b"", ["health"]),
    ("GET", "/api/status", b"", ["metadata", "model-config", "statistics"]),
    ("GET", "/api/status/m", b"", ["metadata", "model-config", "statistics"]),
    ("POST", "/api/infer/m", b"", ["inference"]),
    ("GET", "/api/sharedmemorycontrol/status", b"", ["shared-memory"]),
]


def http_call(srv: openinfer.Server, method: str, path: str, body: bytes, headers: dict[str, str]) -> requests.Response:
    return requests.request(method, srv.url + path, data=body, headers=headers, timeout=30)


def refused_http(r: requests.Response, group: str) -> bool:
    return r.status_code == 403 and r.reason == "Forbidden" and r.json() == {
        "error": f"This API is restricted, expecting header '{header(group)}'"}


@pytest.mark.parametrize("method,path,body,groups", HTTP_ROUTES, ids=[f"{m} {p}" for m, p, _, _ in HTTP_ROUTES])
def test_http_route_answers_only_its_groups_header(server, method, path, body, groups) -> None:
    # Without a header: 403 naming the first group's header, never its value.
    r = http_call(server, method, path, body, {})
    assert refused_http(r, groups[0]), (r.status_code, r.text)
    assert value(groups[0]) not in r.text
    if path.startswith("/api/"):  # what a 1.x client reads
        nv_status = r.headers["NV-Status"]
        assert "code: UNAVAILABLE" in nv_status
        # text-format protobuf, which escapes the quotes
        assert f"msg: \"This API is restricted, expecting header \\'{header(groups[0])}\\'\"" in nv_status
    # Every other group's header does not open it.
    others = {header(g): value(g) for g in GROUPS if g not in groups}
    assert refused_http(http_call(server, method, path, body, others), groups[0])
    # Its own headers do, in any case of the name; a wrong value does not.
    own = {header(g).upper() if i % 2 else header(g).lower(): value(g) for i, g in enumerate(groups)}
    r = http_call(server, method, path, body, own)
    assert r.status_code != 403, r.text
    wrong = dict(own)
    wrong[next(iter(wrong))] = value(groups[0])[:-1] + "X"
    assert refused_http(http_call(server, method, path, body, wrong), groups[0])
    short = dict(own)
    short[next(iter(short))] = value(groups[0])[:-1]  # a prefix of the key is no key
    assert refused_http(http_call(server, method, path, body, short), groups[0])


def test_http_legacy_status_needs_each_of_its_groups(server) -> None:
    only_metadata = {header("metadata"): value("metadata")}
    assert refused_http(http_call(server, "GET", "/api/status", b"", only_metadata), "model-config")
    two = {**only_metadata, header("model-config"): value("model-config")}
    assert refused_http(http_call(server, "GET", "/api/status", b"", two), "statistics")


def test_http_connection_serves_on_after_a_refusal(server) -> None:
    with requests.Session() as s:
        for _ in range(3):
            assert s.get(server.url + "/v2/health/live", timeout=30).status_code == 403
            ok = s.get(server.url + "/v2/health/live", headers={header("health"): value("health")}, timeout=30)
            assert ok.status_code == 200 and ok.json() == {"live": True}


def test_tritonclient_http_with_headers(server) -> None:
    from tritonclient.http import InferInput
    from tritonclient.utils import InferenceServerException

    client = triton_http(server)
    assert client.is_server_live(headers={header("health"): value("health")})
    assert not client.is_server_live()  # its health calls read the status only
    assert client.get_server_metadata(headers={header("metadata"): value("metadata")})["name"] == "openinfer"
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'X-Metadata-Key'"):
        client.get_server_metadata()
    inp = InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(np.array([4, 5, 6], dtype=np.int32), binary_data=True)
    result = client.infer("m", [inp], headers={header("inference"): value("inference")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [4, 5, 6])
    with pytest.raises(InferenceServerException, match="expecting header 'X-Inference-Key'"):
        client.infer("m", [inp], headers={header("inference"): "nope"})


def raw_http(srv: openinfer.Server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = Http(srv.http_port)
    try:
        conn.send(request)
        return conn.read_response()
    finally:
        conn.close()


def test_http_key_with_whitespace_around_it_is_the_key(server) -> None:
    # RFC 9112, 5.1: the optional whitespace around a field value is not part of it.
    key = f"{header('health')}: \t {value('health')} \t \r\n".encode()
    status, _, body = raw_http(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + key + b"\r\n")
    assert status == 200, body
    assert json.loads(body) == {"live": True}


@pytest.mark.parametrize("first,second", [("right", "right"), ("right", "wrong"), ("wrong", "right")])
def test_http_repeated_key_header_is_refused(server, first, second) -> None:
    # Which of two keys counts is no guess the server makes: neither order opens the API.
    keys = {"right": value("health"), "wrong": "not-the-key"}
    twice = "".join(f"{name}: {keys[which]}\r\n" for name, which in
                    ((header("health").lower(), first), (header("health").upper(), second)))
    status, headers, body = raw_http(server, f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{twice}\r\n".encode())
    assert status == 400, body
    assert json.loads(body) == {"error": f"header '{header('health').upper()}' appears more than once; it carries "
                                         "a restricted-API key and is given once"}
    assert headers["connection"] == "close"
    assert value("health") not in body.decode()


# ---- gRPC ----------------------------------------------------------------------------------

V2 = "/inference.GRPCInferenceService/"
LEGACY = "/nvidia.inferenceserver.GRPCService/"
GRPC_RPCS = [
    (V2 + "ServerLive", ["health"]),
    (V2 + "ServerReady", ["health"]),
    (V2 + "ModelReady", ["health"]),
    ("/grpc.health.v1.Health/Check", ["health"]),
    (V2 + "ServerMetadata", ["metadata"]),
    (V2 + "ModelMetadata", ["metadata"]),
    (V2 + "ModelConfig", ["model-config"]),
    (V2 + "ModelInfer", ["inference"]),
    (V2 + "SystemSharedMemoryStatus", ["shared-memory"]),
    (V2 + "SystemSharedMemoryRegister", ["shared-memory"]),
    (V2 + "SystemSharedMemoryUnregister", ["shared-memory"]),
    (V2 + "CudaSharedMemoryStatus", ["shared-memory"]),
    (V2 + "CudaSharedMemoryRegister", ["shared-memory"]),
    (V2 + "CudaSharedMemoryUnregister", ["shared-memory"]),
    (V2 + "RepositoryIndex", ["model-repository"]),
    (V2 + "RepositoryModelLoad", ["model-repository"]),
    (V2 + "RepositoryModelUnload", ["model-repository"]),
    (V2 + "ModelStatistics", ["statistics"]),
    (V2 + "LogSettings", ["logging"]),
    (V2 + "TraceSetting", ["trace"]),
    (LEGACY + "Health", ["health"]),
    (LEGACY + "Status", ["metadata", "model-config", "statistics"]),
    (LEGACY + "Infer", ["inference"]),
    (LEGACY + "SharedMemoryControl", ["shared-memory"]),
    (LEGACY + "ModelControl", ["model-repository"]),
    (LEGACY + "Repository", ["model-repository"]),
]


@pytest.fixture(scope="module")
def channel(server) -> Iterator[Any]:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


def metadata(groups: list[str]) -> list[tuple[str, str]]:
    # gRPC metadata is lower-case on the wire; the flag's key was given in mixed case.
    return [(f"triton-grpc-protocol-{header(g).lower()}", value(g)) for g in groups]


def grpc_refusal(group: str) -> str:
    return f"This protocol is restricted, expecting header 'triton-grpc-protocol-{header(group)}'"


@pytest.mark.parametrize("method,groups", GRPC_RPCS, ids=[m for m, _ in GRPC_RPCS])
def test_grpc_rpc_answers_only_its_groups_metadata(channel, method, groups) -> None:
    import grpc

    call = channel.unary_unary(method)
    for md in ([], metadata([g for g in GROUPS if g not in groups]),
               [(k, v + "x") for k, v in metadata(groups)]):
        with pytest.raises(grpc.RpcError) as e:
            call(b"", metadata=md, timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == grpc_refusal(groups[0])
    try:
        call(b"", metadata=metadata(groups), timeout=30)
    except grpc.RpcError as e:  # an empty request may be refused, for its own reasons
        assert "restricted" not in (e.details() or ""), e.details()


def test_grpc_stream_infer_restricted(channel) -> None:
    import grpc

    stream = channel.stream_stream(V2 + "ModelStreamInfer")
    with pytest.raises(grpc.RpcError) as e:
        list(stream(iter([b""]), metadata=metadata(["health"]), timeout=30))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == grpc_refusal("inference")


@pytest.mark.parametrize("first,second", [("right", "right"), ("right", "wrong"), ("wrong", "right")])
def test_grpc_repeated_key_metadata_is_refused(channel, first, second) -> None:
    import grpc

    (key, right), = metadata(["health"])
    keys = {"right": right, "wrong": "not-the-key"}
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(V2 + "ServerLive")(b"", metadata=[(key, keys[first]), (key, keys[second])], timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"metadata '{key}' appears more than once; it carries a restricted-API key and is given once"


def test_tritonclient_grpc_with_headers(server) -> None:
    from tritonclient.grpc import InferInput
    from tritonclient.utils import InferenceServerException

    client = triton_grpc(server)
    md = dict(metadata(["health", "inference"]))
    assert client.is_server_live(headers=md)
    with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-X-Health-Key'"):
        client.is_server_live()
    inp = InferInput("INPUT0", [2], "INT32")
    inp.set_data_from_numpy(np.array([7, 8], dtype=np.int32))
    np.testing.assert_array_equal(client.infer("m", [inp], headers=md).as_numpy("OUTPUT0"), [7, 8])
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.infer("m", [inp], headers={"triton-grpc-protocol-x-inference-key": "wrong"})


# ---- the flags -----------------------------------------------------------------------------

BAD_FLAGS = [
    ("inference", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference"),
    ("inference:key", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:key"),
    ("inference:key=", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:key="),
    (":key=v", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got :key=<hidden>"),
    ("inference:=v", "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:=<hidden>"),
    ("infer:key=v", "unknown restricted api 'infer'"),
    ("health,,metadata:key=v", "unknown restricted api ''"),
    ("health,health:key=v", "restricted api 'health' can not be specified in multiple config groups"),
]


@pytest.mark.parametrize("flag,message", BAD_FLAGS, ids=[f for f, _ in BAD_FLAGS])
def test_bad_http_flag_refused_in_tritons_words(flag, message) -> None:
    with pytest.raises(ValueError) as e:
        openinfer.Server(models=[], http_port=0, grpc_port=None, metrics_port=None, http_restricted_api=[flag])
    assert str(e.value) == message


def test_a_group_in_two_flags_refused() -> None:
    with pytest.raises(ValueError, match="^restricted protocol 'inference' can not be specified in multiple config groups$"):
        openinfer.Server(models=[], http_port=0, grpc_port=None, metrics_port=None,
                         grpc_restricted_protocol=["inference,health:a=1", "logging,inference:b=2"])
    with pytest.raises(ValueError, match="^unknown restricted protocol 'nope'$"):
        openinfer.Server(models=[], http_port=0, grpc_port=None, metrics_port=None,
                         grpc_restricted_protocol="nope:a=1")


def test_cli_refuses_a_bad_flag_without_showing_the_key() -> None:
    r = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--grpc-port", "-1",
                        "--http-restricted-api", ":admin=topsecret"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got :admin=<hidden>" in r.stderr
    assert "topsecret" not in r.stderr + r.stdout


def test_several_groups_share_one_key(tmp_path) -> None:
    """One flag, several groups, one header: the transport keeps it once; a second flag adds
    a second key; groups not named stay open."""
    with openinfer.serve(models=[], http_port=0, grpc_port=None, metrics_port=None, log=False,
                         access_log=str(tmp_path / "access.log"),
                         http_restricted_api=["model-repository,logging,trace:admin=k1", "shared-memory:shm=k2"]) as srv:
        assert requests.get(srv.url + "/v2/health/live", timeout=30).status_code == 200
        for path, (h, v) in {"/v2/logging": ("admin", "k1"), "/v2/trace/setting": ("ADMIN", "k1"),
                             "/v2/systemsharedmemory/status": ("shm", "k2")}.items():
            assert requests.get(srv.url + path, timeout=30).status_code == 403
            assert requests.get(srv.url + path, headers={h: v}, timeout=30).status_code == 200
        assert requests.get(srv.url + "/v2/logging", headers={"shm": "k2"}, timeout=30).status_code == 403
    log = (tmp_path / "access.log").read_text()
    assert " 403 " in log and "k1" not in log and "k2" not in log


# ---- the warning off-host ------------------------------------------------------------------


def _warnings_of(caplog, **kw: Any) -> list[str]:
    """The warnings a server on 0.0.0.0 gives at start. It is handed loopback sockets, so
    nothing listens beyond this host while it believes it does."""
    http, grpc = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        srv = openinfer.serve(models=[], host="0.0.0.0", sockets={"http": http, "grpc": grpc}, metrics_port=None,
                              log=False, **kw)
        srv.stop()
    http.close()
    grpc.close()
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "beyond this host" in r.getMessage()]


def test_off_host_warning_names_what_is_open(caplog) -> None:
    (msg,) = _warnings_of(caplog)
    assert "settings (logging, trace)" in msg and "0.0.0.0" in msg
    assert "model control" not in msg and "shared memory" not in msg  # not served: off-host, mode none
    (msg,) = _warnings_of(caplog, model_control_mode="explicit", allow_shared_memory=True,
                          http_restricted_api="logging,trace:k=v")
    # gRPC still answers anyone, so everything is named.
    assert "model control (load, unload)" in msg and "shared memory" in msg and "settings" in msg
    both = dict(http_restricted_api="model-repository,shared-memory,logging,trace:k=v",
                grpc_restricted_protocol="model-repository,shared-memory,logging,trace:k=v")
    assert _warnings_of(caplog, model_control_mode="explicit", allow_shared_memory=True, **both) == []
    # On loopback, nothing to warn of.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        with openinfer.serve(models=[], http_port=0, grpc_port=0, metrics_port=None, log=False,
                             model_control_mode="explicit"):
            pass
    assert not [r for r in caplog.records if "beyond this host" in r.getMessage()]

