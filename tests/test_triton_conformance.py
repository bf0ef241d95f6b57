"""tritonserver's behaviour where openinfer had its own (issue 41): client shared memory off by
default on the command line, case-insensitive flag values, model namespacing, --metrics-config
as tritonserver reads it; each through tritonclient HTTP and gRPC or the metrics endpoint."""

from __future__ import annotations

import json
import logging
import re
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import Cli
from test_optional_inputs import IO as OPTIONAL_INPUTS
from openinfer import Model, Tensor

# tritonserver's words when client shared memory is off (its src/common.h).
SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."

IDENTITY = """name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def _repo(root: Path, *names: str) -> Path:
    for name in names:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(IDENTITY.format(name=name))
    return root


def _grpc_port(cli: Cli) -> int:
    m = re.search(r"grpc://127\.0\.0\.1:(\d+)", cli.output())
    assert m, cli.output()
    return int(m.group(1))


@pytest.fixture
def shm_key() -> object:
    region = shared_memory.SharedMemory(name=f"oi_conf_{uuid.uuid4().hex[:12]}", create=True, size=64)
    yield "/" + region.name
    region.close()
    region.unlink()


def test_client_shm_is_off_by_default_on_the_command_line(tmp_path: Path, shm_key: str) -> None:
    """As tritonserver: without --allow-client-shm, register and unregister answer 501 with its
    words over HTTP (UNIMPLEMENTED over gRPC); the status lists nothing."""
    cli = Cli(str(_repo(tmp_path / "repo", "good")), "--grpc-port", "0", "--metrics-port", "0")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}")
        for client in (http, grpc):
            with pytest.raises(InferenceServerException) as e:
                client.register_system_shared_memory("r", shm_key, 64)
            assert e.value.message() == SHM_DISABLED
            assert e.value.status() in ("501", "StatusCode.UNIMPLEMENTED")
            with pytest.raises(InferenceServerException) as e:
                client.unregister_system_shared_memory()
            assert e.value.message() == SHM_DISABLED
        assert http.get_system_shared_memory_status() == []
    finally:
        cli.kill()


@pytest.mark.parametrize("flag", ["--allow-client-shm=true", "--allow-client-shm=ON", "--allow-shared-memory"])
def test_allow_client_shm_opens_it(tmp_path: Path, shm_key: str, flag: str) -> None:
    cli = Cli(str(_repo(tmp_path / "repo", "good")), "--grpc-port", "0", "--metrics-port", "0", flag)
    try:
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}")
        grpc.register_system_shared_memory("r", shm_key, 64)
        with pytest.raises(InferenceServerException) as e:  # tritonserver's ALREADY_EXISTS
            grpc.register_system_shared_memory("r", shm_key, 64)
        assert e.value.status() == "StatusCode.ALREADY_EXISTS"
        assert e.value.message() == "shared memory region 'r' already in manager"
        assert requests.get(f"http://127.0.0.1:{cli.port}/v2/systemsharedmemory/status", timeout=10).json()[0]["name"] == "r"
    finally:
        cli.kill()


def test_flag_values_in_any_case(tmp_path: Path) -> None:
    """tritonserver lowers --model-control-mode and --grpc-infer-response-compression-level:
    EXPLICIT is explicit (a model loads only when asked), over HTTP and gRPC."""
    cli = Cli(str(_repo(tmp_path / "repo", "a", "b")), "--grpc-port", "0", "--metrics-port", "0",
              "--model-control-mode=EXPLICIT", "--load-model", "a", "--grpc-infer-response-compression-level", "High")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}")
        assert http.is_model_ready("a") and not http.is_model_ready("b")
        grpc.load_model("b")
        assert grpc.is_model_ready("b")
        http.unload_model("b")
        assert not grpc.is_model_ready("b")
    finally:
        cli.kill()


def _double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"] * 2}


def test_metrics_config_as_tritonserver_reads_it(caplog: pytest.LogCaptureFixture) -> None:
    """summary_quantiles read as tritonserver's core reads them (L0_metrics' own value, with
    its "0.0.1" that std::stod reads as 0.0; a pair without ':' logged and left out), the request
    summary left out for a model with a response cache and the cache hit and miss summaries
    given to it, as tritonserver does."""
    io = dict(inputs=[Tensor("INPUT0", "FP32", [-1])], outputs=[Tensor("OUTPUT0", "FP32", [-1])])
    models = [Model("cached", _double, response_cache=True, **io), Model("plain", _double, **io)]
    config = ["summary_latencies=true", "summary_quantiles=0.1:0.0.1,0.7:0.01,bad,0.75:0.01"]
    with caplog.at_level(logging.ERROR, logger="openinfer"), \
            openinfer.serve(models=models, http_port=0, grpc_port=None, log=False, metrics_config=config,
                            cache_config=["local,size=1048576"]) as srv:
        for model in ("cached", "plain", "cached"):  # a miss, then a hit
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
            assert requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=10).status_code == 200
        text = requests.get(srv.metrics_url, timeout=10).text
    assert "Invalid option: [bad]. No ':' delimiter found. Expected format is <quantile>:<error>" in caplog.text
    for q in ("0.1", "0.7", "0.75"):
        assert f'nv_inference_queue_summary_us{{model="plain",version="1",quantile="{q}"}}' in text
    assert 'nv_inference_request_summary_us{model="plain",version="1",quantile="0.7"}' in text
    assert 'nv_inference_request_summary_us_count{model="cached"' not in text
    assert 'nv_inference_queue_summary_us_count{model="cached",version="1"} 1' in text
    # tritonserver's cache summaries, for models with a response cache only
    for family in ("nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model"):
        assert f"# TYPE {family} summary" in text
        assert f'{family}_count{{model="cached",version="1"}} 1' in text
        assert re.search(family + r'\{model="cached",version="1",quantile="0.7"\} [0-9.]+\n', text), text
        assert f'{family}_count{{model="plain"' not in text


def test_request_summary_family_left_out_when_every_model_caches() -> None:
    io = dict(inputs=[Tensor("INPUT0", "FP32", [-1])], outputs=[Tensor("OUTPUT0", "FP32", [-1])])
    with openinfer.serve(models=[Model("cached", _double, response_cache=True, **io)], http_port=0, grpc_port=None,
                         log=False, metrics_config=["summary_latencies=true"], cache_config=["local,size=65536"]) as srv:
        text = requests.get(srv.metrics_url, timeout=10).text
    assert "nv_inference_request_summary" not in text and "nv_inference_queue_summary_us" in text
    assert "nv_cache_hit_summary_per_model_count" in text


# test_optional_inputs' identity model: INPUT0 required, INPUT1 and INPUT2 optional.
OPTIONAL_IO = 'name: "ident"\nbackend: "identity"\nmax_batch_size: 0\n' + OPTIONAL_INPUTS


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_with_optional_inputs(tmp_path: Path, endpoint: str) -> None:
    """/generate and /generate_stream leave optional inputs out as /infer does (Triton's
    identity backend answers zeros for them); a missing required one is refused in the core's
    words."""
    (tmp_path / "ident" / "1").mkdir(parents=True)
    (tmp_path / "ident" / "config.pbtxt").write_text(OPTIONAL_IO)
    with openinfer.serve(str(tmp_path), http_port=0, grpc_port=None, log=False) as srv:
        url = f"{srv.url}/v2/models/ident/{endpoint}"
        r = requests.post(url, json={"INPUT0": [1.0, 2.0]}, timeout=10)
        assert r.status_code == 200, r.text
        answer = json.loads(r.text.removeprefix("data: "))
        assert answer["OUTPUT0"] == [1.0, 2.0] and answer["OUTPUT1"] == [0, 0] and answer["OUTPUT2"] == ""
        r = requests.post(url, json={"INPUT0": [1.0], "INPUT2": "x"}, timeout=10)
        assert json.loads(r.text.removeprefix("data: "))["OUTPUT2"] == "x"
        r = requests.post(url, json={"INPUT1": [1, 2]}, timeout=10)
        assert r.status_code == 400 and "missing required input(s) ['INPUT0']" in r.json()["error"]
