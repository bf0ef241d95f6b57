"""The logging extension (GET/POST /v2/logging, gRPC LogSettings) through tritonclient.http,
tritonclient.grpc, grpcio and raw HTTP: reading and changing the settings, Triton's errors
for bad values (naming the setting), and the settings' effect on the `openinfer` logger and
its log file. Each test runs its own server: the settings drive a process-wide logger."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def _echo(inputs: dict) -> dict:
    return {"OUTPUT0": inputs["INPUT0"]}


ECHO = Model("echo", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


@pytest.fixture
def srv() -> Iterator[openinfer.Server]:
    with openinfer.serve(models=[ECHO], http_port=0, log=False) as s:
        yield s


def _http(s: openinfer.Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}")


def _grpc(s: openinfer.Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")


def _grpc_settings(response: dict) -> dict:
    return {k: next(iter(v.values())) for k, v in response["settings"].items()}


def test_extension_listed(srv: openinfer.Server) -> None:
    assert "logging" in _http(srv).get_server_metadata()["extensions"]


def test_http_get_and_update(srv: openinfer.Server) -> None:
    client = _http(srv)
    assert client.get_log_settings() == DEFAULTS
    changed = client.update_log_settings({"log_info": False, "log_verbose_level": 3, "log_format": "ISO8601"})
    assert changed == {**DEFAULTS, "log_info": False, "log_verbose_level": 3, "log_format": "ISO8601"}
    assert client.get_log_settings() == changed
    # null leaves a setting as it is; an empty POST only reads, as in Triton
    assert client.update_log_settings({"log_info": None, "log_file": None}) == changed
    r = requests.post(f"http://127.0.0.1:{srv.http_port}/v2/logging", timeout=10)
    assert r.status_code == 200 and r.json() == changed
    assert r.headers["Content-Type"].startswith("application/json")


def test_grpc_get_and_update_seen_over_http(srv: openinfer.Server) -> None:
    client = _grpc(srv)
    assert _grpc_settings(client.get_log_settings(as_json=True)) == DEFAULTS
    got = client.update_log_settings({"log_warning": False, "log_verbose_level": 1}, as_json=True)
    want = {**DEFAULTS, "log_warning": False, "log_verbose_level": 1}
    assert _grpc_settings(got) == want
    assert _http(srv).get_log_settings() == want
    typed = client.get_log_settings().settings
    assert typed["log_verbose_level"].WhichOneof("parameter_choice") == "uint32_param"
    assert typed["log_error"].WhichOneof("parameter_choice") == "bool_param"
    assert typed["log_format"].WhichOneof("parameter_choice") == "string_param"


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"log_info": "yes"}, 400, "expect boolean for 'log_info'"),
        ({"log_warning": 1}, 400, "expect boolean for 'log_warning'"),
        ({"log_error": "false"}, 400, "expect boolean for 'log_error'"),
        ({"log_verbose_level": "2"}, 400, "expect int32 for 'log_verbose_level'"),
        ({"log_verbose_level": 1.5}, 400, "expect int32 for 'log_verbose_level'"),
        ({"log_verbose_level": True}, 400, "expect int32 for 'log_verbose_level'"),
        ({"log_verbose_level": -1}, 400, "invalid argument for log_verbose_level, got: -1"),
        ({"log_format": 8601}, 400, "expect string for 'log_format'"),
        ({"log_format": "json"}, 400, "invalid argument for log_format, got: json"),
        ({"log_file": "/tmp/elsewhere.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_level": "debug"}, 400, "unknown log setting 'log_level'"),
    ],
)
def test_http_bad_values(srv: openinfer.Server, body: dict, status: int, message: str) -> None:
    client = _http(srv)
    with pytest.raises(InferenceServerException) as e:
        client.update_log_settings({"log_info": False, **body})
    assert e.value.status() == str(status)
    assert message in e.value.message()
    # all or nothing: the valid setting beside the bad one was not applied
    assert client.get_log_settings() == DEFAULTS


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "failed to parse the dynamic logging request JSON buffer"),
        (b"[1, 2]", "the dynamic logging request must be a JSON object, got list"),
    ],
)
def test_http_malformed_body(srv: openinfer.Server, body: bytes, message: str) -> None:
    r = requests.post(f"http://127.0.0.1:{srv.http_port}/v2/logging", data=body, timeout=10)
    assert r.status_code == 400 and message in r.json()["error"]
    r = requests.put(f"http://127.0.0.1:{srv.http_port}/v2/logging", json={}, timeout=10)
    assert r.status_code == 405
    assert _http(srv).get_log_settings() == DEFAULTS  # the server is still up, unchanged


def _setting(name: str, **value: object) -> service_pb2.LogSettingsRequest:
    req = service_pb2.LogSettingsRequest()
    field = req.settings[name]
    for k, v in value.items():
        setattr(field, k, v)
    return req


@pytest.mark.parametrize(
    "request_, code, message",
    [
        (_setting("log_info", string_param="true"), grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_info'"),
        (_setting("log_error", uint32_param=1), grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_error'"),
        (_setting("log_warning"), grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_warning'"),
        (
            _setting("log_verbose_level", bool_param=True),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expect int32 for 'log_verbose_level'",
        ),
        (
            _setting("log_format", string_param="xml"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid argument for log_format, got: xml",
        ),
        (
            _setting("log_file", string_param="/tmp/x.log"),
            grpc.StatusCode.UNIMPLEMENTED,
            "log file location can not be updated through network protocol",
        ),
    ],
)
def test_grpc_bad_values(srv: openinfer.Server, request_: service_pb2.LogSettingsRequest, code: grpc.StatusCode,
                         message: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.LogSettings(request_, timeout=10)
        assert e.value.code() == code
        assert message in e.value.details()
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
    assert _http(srv).get_log_settings() == DEFAULTS


def test_settings_drive_the_log_file(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    log = logging.getLogger("openinfer")
    with openinfer.serve(models=[ECHO], http_port=0, log_file=str(path)) as s:
        client = _http(s)
        assert client.get_log_settings()["log_file"] == str(path)
        log.debug("verbose line one")
        log.info("info line one")
        client.update_log_settings({"log_verbose_level": 1, "log_info": False})
        log.debug("verbose line two")
        log.info("info line two")
        log.warning("warning line one")
        client.update_log_settings({"log_warning": False, "log_format": "ISO8601", "log_info": True})
        log.warning("warning line two")
        log.info("info line three")
        log.error("error line one")
    text = path.read_text()
    lines = text.splitlines()
    # the server's own start-up line went to the file in Triton's default layout
    start = next(line for line in lines if "listening on" in line)
    assert re.match(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ server\.py:\d+\] openinfer ", start)
    for absent in ("verbose line one", "info line two", "warning line two"):
        assert absent not in text
    assert re.search(r"^V\d{4} [\d:.]+ \d+ test_logging\.py:\d+\] verbose line two$", text, re.M)
    assert re.search(r"^W\d{4} [\d:.]+ \d+ test_logging\.py:\d+\] warning line one$", text, re.M)
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ test_logging\.py:\d+\] info line three$", text, re.M)
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ E \d+ test_logging\.py:\d+\] error line one$", text, re.M)
    order = [next(i for i, line in enumerate(lines) if m in line) for m in
             ("info line one", "verbose line two", "warning line one", "info line three", "error line one")]
    assert order == sorted(order)
    # after stop the log file is closed and the logger propagates again
    assert not any(getattr(h, "baseFilename", None) == str(path) for h in log.handlers)
    assert log.propagate


def test_bad_start_settings() -> None:
    with pytest.raises(ValueError, match="invalid argument for --log-format, got: json"):
        openinfer.Server(models=[ECHO], http_port=0, log_format="json")


def test_the_latest_server_governs_the_shared_logger(tmp_path: Path) -> None:
    """The `openinfer` logger is the process's: with two servers, the one started last
    decides; once it stops, the other's settings apply again."""
    path = tmp_path / "older.log"
    log = logging.getLogger("openinfer")
    with openinfer.serve(models=[ECHO], http_port=0, log=False, log_file=str(path)) as older:
        _http(older).update_log_settings({"log_verbose_level": 1})
        with openinfer.serve(models=[ECHO], http_port=0, log=False) as newer:
            assert _http(newer).get_log_settings()["log_verbose_level"] == 0
            assert _http(older).get_log_settings()["log_verbose_level"] == 1  # each reports its own
            log.debug("while the newer governs")
        log.debug("after the newer stopped")
    text = path.read_text()
    assert "while the newer governs" not in text
    assert "after the newer stopped" in text
