"""Triton's identity backend (`backend: "identity"`): OUTPUT<i> answers with INPUT<i>, served by
the C core without a copy (csrc/backends/identity_backend.c), through tritonclient over HTTP and
gRPC; its config checked with Triton's words; execute_delay_ms; dynamic batching; shared memory
in and out; and the bad requests every model refuses."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as tshm
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import concurrent, executor_switches, triton_grpc, triton_http

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
        {{ name: "INPUT1" data_type: TYPE_STRING dims: [ 2 ] }},
        {{ name: "INPUT2" data_type: TYPE_INT64 dims: [ 4 ] reshape: {{ shape: [ 2, 2 ] }} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_STRING dims: [ 2 ] }},
         {{ name: "OUTPUT2" data_type: TYPE_INT64 dims: [ 2, 2 ] }} ]
{extra}
"""


def _model(repo: Path, name: str, mbs: int = 8, extra: str = "", config: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config or IDENTITY.format(name=name, mbs=mbs, extra=extra))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("identity")
    _model(repo, "identity")
    _model(repo, "identity_nobatch", mbs=0)
    _model(repo, "identity_batched", extra="dynamic_batching { max_queue_delay_microseconds: 2000 }")
    _model(repo, "identity_delayed", extra='parameters { key: "execute_delay_ms" value: { string_value: "300" } }')
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    assert srv.failed == {}, srv.failed
    yield srv
    srv.stop()


def _inputs(mod: Any, i: int = 0, batch: int | None = 2) -> tuple[list[Any], list[np.ndarray]]:
    lead = [batch] if batch else []
    x = (np.arange(3 * (batch or 1), dtype=np.float32) + i).reshape([*lead, 3])
    s = np.array([f"r{i}-{k}".encode() * (k % 3) for k in range(2 * (batch or 1))], dtype=np.object_).reshape([*lead, 2])
    n = (np.arange(4 * (batch or 1), dtype=np.int64) * (i + 1)).reshape([*lead, 4])
    arrays = [x, s, n]
    ins = []
    for k, (a, dt) in enumerate(zip(arrays, ("FP32", "BYTES", "INT64"))):
        t = mod.InferInput(f"INPUT{k}", list(a.shape), dt)
        t.set_data_from_numpy(a)
        ins.append(t)
    return ins, arrays


def _expect(result: Any, arrays: list[np.ndarray], batch: int | None = 2) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arrays[0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), arrays[1])
    lead = [batch] if batch else []
    np.testing.assert_array_equal(result.as_numpy("OUTPUT2"), arrays[2].reshape([*lead, 2, 2]))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["identity", "identity_nobatch"])
def test_outputs_are_the_inputs(server: openinfer.Server, protocol: str, model: str) -> None:
    client, mod = (triton_http(server), httpclient) if protocol == "http" else (triton_grpc(server), grpcclient)
    batch = 2 if model == "identity" else None
    ins, arrays = _inputs(mod, 3, batch)
    result = client.infer(model, ins)
    _expect(result, arrays, batch)
    # One output asked for: only that one comes back.
    out = [mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer(model, ins, outputs=out)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), arrays[1])
    assert result.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_it_runs_on_the_loop(server: openinfer.Server, protocol: str) -> None:
    """No work of its own: once timed quick on its executor, it answers on the loop that read
    the request (tests/test_run_on_loop.py), leaving its executor asleep."""
    client, mod = (triton_http(server), httpclient) if protocol == "http" else (triton_grpc(server), grpcclient)
    for i in range(5):
        ins, arrays = _inputs(mod, i)
        _expect(client.infer("identity", ins), arrays)
    before = executor_switches()
    for i in range(100):
        ins, arrays = _inputs(mod, i)
        _expect(client.infer("identity", ins), arrays)
    assert executor_switches() - before < 10


def test_json_outputs_and_metadata(server: openinfer.Server) -> None:
    client = triton_http(server)
    ins, arrays = _inputs(httpclient, 1)
    outs = [httpclient.InferRequestedOutput(f"OUTPUT{k}", binary_data=False) for k in range(3)]
    result = client.infer("identity", ins, outputs=outs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arrays[0])
    # tritonclient gives JSON strings back as str
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1").astype(np.bytes_), arrays[1].astype(np.bytes_))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT2"), arrays[2].reshape(2, 2, 2))
    meta = client.get_model_metadata("identity")
    assert meta["platform"] == "identity"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("OUTPUT0", "FP32", [-1, -1]), ("OUTPUT1", "BYTES", [-1, 2]), ("OUTPUT2", "INT64", [-1, 2, 2])]
    config = client.get_model_config("identity")
    assert config["backend"] == "identity" and config["max_batch_size"] == 8


def test_dynamic_batching_keeps_each_request_its_rows(server: openinfer.Server) -> None:
    def call(i: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        try:
            for j in range(10):
                ins, arrays = _inputs(httpclient, 100 * i + j, batch=1 + (i + j) % 3)
                _expect(client.infer("identity_batched", ins), arrays, batch=1 + (i + j) % 3)
        finally:
            client.close()

    concurrent(8, call)
    stats = triton_http(server).get_inference_statistics("identity_batched")["model_stats"][0]
    assert stats["inference_count"] == sum(1 + (i + j) % 3 for i in range(8) for j in range(10))
    assert stats["execution_count"] < 80  # some requests ran together


def test_execute_delay_ms(server: openinfer.Server) -> None:
    ins, arrays = _inputs(grpcclient, 2)
    start = time.monotonic()
    _expect(triton_grpc(server).infer("identity_delayed", ins), arrays)
    assert time.monotonic() - start >= 0.3  # the configured delay, at least


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_are_refused_by_name(server: openinfer.Server, protocol: str) -> None:
    client, mod = (triton_http(server), httpclient) if protocol == "http" else (triton_grpc(server), grpcclient)
    ins, _ = _inputs(mod)
    wrong = mod.InferInput("INPUT0", [2, 3], "INT32")
    wrong.set_data_from_numpy(np.zeros((2, 3), np.int32))
    with pytest.raises(InferenceServerException, match=r"input 'INPUT0': expected datatype FP32, got INT32"):
        client.infer("identity", [wrong, ins[1], ins[2]])
    missing = r"Got input\(s\) \['INPUT0','INPUT1'\], but missing required input\(s\) \['INPUT2'\]"
    with pytest.raises(InferenceServerException, match=missing):
        client.infer("identity", ins[:2])
    bad = mod.InferInput("INPUT2", [2, 5], "INT64")
    bad.set_data_from_numpy(np.zeros((2, 5), np.int64))
    with pytest.raises(InferenceServerException, match=r"input 'INPUT2': expected shape \[-1,4\], got \[2,5\]"):
        client.infer("identity", [ins[0], ins[1], bad])
    ins, arrays = _inputs(mod, 7)
    _expect(client.infer("identity", ins), arrays)  # the server and the connection still serve


def test_shared_memory_in_and_out(server: openinfer.Server) -> None:
    """An input read from one region comes back into another: the answer is the input's own
    bytes, placed by the server; and back into the input's own window, left as it is."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    size = x.nbytes
    key_in, key_out = f"/id_in_{uuid.uuid4().hex[:8]}", f"/id_out_{uuid.uuid4().hex[:8]}"
    shm_in = tshm.create_shared_memory_region("id_in", key_in, size)
    shm_out = tshm.create_shared_memory_region("id_out", key_out, size)
    try:
        tshm.set_shared_memory_region(shm_in, [x])
        client.register_system_shared_memory("id_in", key_in, size)
        client.register_system_shared_memory("id_out", key_out, size)
        others, _ = _inputs(httpclient)
        inp = httpclient.InferInput("INPUT0", [2, 6], "FP32")
        inp.set_shared_memory("id_in", size)
        for region, handle in (("id_out", shm_out), ("id_in", shm_in)):
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory(region, size)
            result = client.infer("identity", [inp, others[1], others[2]], outputs=[out])
            # As tritonserver: name, datatype and shape, no parameters (perf_analyzer reads any as binary data).
            assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 6]}
            np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.float32, [2, 6]), x)
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(shm_in)
        tshm.destroy_shared_memory_region(shm_out)
        client.close()


BAD_CONFIGS = {
    "pairs": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
              "model configuration must have equal input/output pairs"),
    "input_name": ('input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                   'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                   "expected input name to follow INPUT<index> pattern, got 'IN0'"),
    "output_name": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                    'output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                    "expected output name to follow OUTPUT<index> pattern, got 'OUT0'"),
    "indices": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                'output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                "expected input and output indices to match"),
    "datatype": ('input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
                 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                 "expected input and output datatype to match, got TYPE_STRING and TYPE_FP32"),
    "shape": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
              "expected input and output shape to match, got [2,2] and [4]"),
    "delay": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
              'parameters { key: "execute_delay_ms" value: { string_value: "soon" } }',
              "parameter execute_delay_ms must be a non-negative integer, got 'soon'"),
    "creation_delay": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                       'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                       'parameters { key: "creation_delay_sec" value: { string_value: "-1" } }',
                       "parameter creation_delay_sec must be a non-negative integer, got '-1'"),
    "no_tensors": ("", "the identity backend needs the model's inputs and outputs in config.pbtxt"),
    "sequence_state": ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                       'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                       'sequence_batching { state [ { input_name: "S_IN" output_name: "S_OUT" '
                       'data_type: TYPE_FP32 dims: [ 1 ] } ] }',
                       "the identity backend takes no implicit state (sequence_batching.state)"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_config_triton_refuses_fails_to_load_with_its_words(tmp_path: Path, case: str) -> None:
    body, words = BAD_CONFIGS[case]
    _model(tmp_path, "bad", config=f'backend: "identity"\n{body}\n')
    _model(tmp_path, "good", mbs=0)
    srv = openinfer.serve(tmp_path, http_port=0, grpc_port=None, model_control_mode="explicit", log=False)
    try:
        client = triton_http(srv)
        client.load_model("good")
        with pytest.raises(InferenceServerException, match="load failed") as e:
            client.load_model("bad")
        assert words in str(e.value)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["bad"]["state"] == "UNAVAILABLE" and words in index["bad"]["reason"]
        ins, arrays = _inputs(httpclient, batch=None)
        _expect(client.infer("good", ins), arrays, batch=None)
    finally:
        srv.stop()


# Triton's L0_request_cancellation models (qa/L0_request_cancellation/test.sh): identity models
# behind a sequence batcher, Direct and Oldest (no delay here: the cancellation itself is tested
# with a gated model in test_sequence_cancel.py).
SEQUENCE_MODELS = {
    "sequence_direct": "sequence_batching { direct { } \n max_sequence_idle_microseconds: 6000000 }",
    "sequence_oldest": "sequence_batching { oldest { max_candidate_sequences: 1 } \n"
                       " max_sequence_idle_microseconds: 6000000 }",
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_sequence_identity_models_serve(tmp_path: Path, protocol: str) -> None:
    for name, sequence in SEQUENCE_MODELS.items():
        _model(tmp_path, name, config=(
            f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 1\n'
            'input [{ name: "INPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
            'output [{ name: "OUTPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
            f'instance_group [{{ count: 1 \n kind: KIND_CPU }}]\n{sequence}\n'))  # fmt: skip
    srv = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        assert srv.failed == {}, srv.failed
        mod = httpclient if protocol == "http" else grpcclient
        client = triton_http(srv) if protocol == "http" else triton_grpc(srv)
        for name in SEQUENCE_MODELS:
            for k, flags in enumerate(({"sequence_start": True}, {}, {"sequence_end": True})):
                x = np.full([1, 8], k, dtype=np.float32)
                i = mod.InferInput("INPUT0", [1, 8], "FP32")
                i.set_data_from_numpy(x)
                np.testing.assert_array_equal(client.infer(name, [i], sequence_id=7, **flags).as_numpy("OUTPUT0"), x)
            with pytest.raises(InferenceServerException) as e:  # the sequence ended with END
                client.infer(name, [i], sequence_id=7)
            assert "must specify the START flag on the first request of the sequence" in e.value.message()
    finally:
        srv.stop()
