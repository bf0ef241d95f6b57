"""Health, metadata and readiness endpoints of the V2 REST API, through real sockets."""

from __future__ import annotations

import json

import pytest
import requests
from conftest import assert_alive

import openinfer
from openinfer import Model, Tensor


def get(url: str, path: str) -> tuple[int, object]:
    r = requests.get(url + path, timeout=10)
    assert r.headers["content-type"] == "application/json"
    return r.status_code, r.json()


def test_health(url: str) -> None:
    assert get(url, "/v2/health/live") == (200, {"live": True})
    assert get(url, "/v2/health/ready") == (200, {"ready": True})


@pytest.mark.parametrize("path", ["/v2", "/v2/"])
def test_server_metadata(url: str, path: str) -> None:
    status, body = get(url, path)
    assert status == 200
    assert body["name"] == "openinfer"
    assert body["version"] == openinfer.__version__
    assert isinstance(body["extensions"], list)


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata(url: str, path: str) -> None:
    status, body = get(url, path)
    assert status == 200
    assert body["name"] == "simple"
    assert body["versions"] == ["1"]
    assert body["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_model_ready(url: str) -> None:
    assert get(url, "/v2/models/simple/ready") == (200, {"name": "simple", "version": "1", "ready": True})
    assert get(url, "/v2/models/versioned/versions/2/ready")[1]["version"] == "2"


def test_default_version_is_highest(url: str) -> None:
    assert get(url, "/v2/models/versioned/ready")[1]["version"] == "3"
    assert get(url, "/v2/models/versioned")[1]["versions"] == ["1", "2", "3"]


@pytest.mark.parametrize(
    "path, message",
    [
        # Triton's core words unknown models and versions so; scripts match on it.
        ("/v2/models/nope", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/nope/ready", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/nope/config", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/simple/versions/7", "Request for unknown model: 'simple' version 7 is not found"),
        ("/v2/models/simple/versions/7/config", "Request for unknown model: 'simple' version 7 is not found"),
        ("/v2/models/simple/versions/abc/ready",
         "failed to get model version from specified version string 'abc'"),
        ("/v2/models/simple/nothing", "no endpoint at /v2/models/simple/nothing"),
        ("/v3/health/live", "no endpoint at /v3/health/live"),
        ("/", "no endpoint at /"),
        ("/v2/models/simple/versions/", "model version in the URL is empty"),
    ],
)
def test_not_found(url: str, path: str, message: str) -> None:
    status, body = get(url, path)
    assert status in (400, 404)
    assert message in body["error"]


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("GET", "/v2/models/simple/infer", "POST"),
        ("POST", "/v2/health/live", "GET or HEAD"),
        ("DELETE", "/v2/models/simple", "GET or HEAD"),
        ("PUT", "/v2", "GET or HEAD"),
        ("POST", "/v2/models/simple/config", "GET or HEAD"),
    ],
)
def test_method_not_allowed(url: str, method: str, path: str, allowed: str) -> None:
    r = requests.request(method, url + path, timeout=10)
    assert r.status_code == 405
    assert f"method {method} is not allowed" in r.json()["error"]
    assert f"use {allowed}" in r.json()["error"]


def test_percent_encoded_model_name(url: str, http) -> None:
    assert get(url, "/v2/models/sim%70le/ready")[0] == 200
    status, _, body = http.request("GET", "/v2/models/bad%zz/ready")  # raw: requests would re-quote it
    assert status == 400 and "percent-encoded" in json.loads(body)["error"]


def test_failed_model_not_ready(tmp_path) -> None:
    repo = tmp_path / "repo"
    broken = repo / "broken" / "1"
    broken.mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\ninput [{name: "X" data_type: TYPE_FP32 dims: [1]}]\n'
        'output [{name: "Y" data_type: TYPE_FP32 dims: [1]}]\n'
    )
    (broken / "model.py").write_text("def infer(inputs):\n    return {\n")  # syntax error
    ok = Model("ok", lambda x: {"Y": x["X"]}, inputs=[Tensor("X", "FP32", [1])], outputs=[Tensor("Y", "FP32", [1])])
    with openinfer.serve(repo, models=[ok], http_port=0, log=False) as srv:
        status, body = get(srv.url, "/v2/models/broken/ready")
        assert status == 400 and body["ready"] is False and "SyntaxError" in body["error"]
        status, body = get(srv.url, "/v2/models/broken")
        assert status == 503 and "not ready" in body["error"]
        r = requests.post(srv.url + "/v2/models/broken/infer", json={"inputs": []}, timeout=10)
        assert r.status_code == 503 and "SyntaxError" in r.json()["error"]
        # Strict readiness, as Triton: one failed model makes the server not ready, while the
        # others serve.
        assert get(srv.url, "/v2/health/ready") == (400, {"ready": False})
        assert get(srv.url, "/v2/models/ok/ready")[0] == 200
        r = requests.post(
            srv.url + "/v2/models/ok/infer",
            json={"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.5]}]},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.5]


def test_metadata_body_is_json_for_every_model(url: str) -> None:
    for name in ("simple", "simple_string", "identity_fp32", "echo_bf16", "matrix"):
        status, body = get(url, f"/v2/models/{name}")
        assert status == 200, body
        json.dumps(body)
    assert_alive(int(url.rsplit(":", 1)[1]))
