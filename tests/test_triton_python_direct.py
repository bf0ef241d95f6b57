"""A Triton Python model's requests and dynamic batches are served by the core calling execute
itself (`_core.TritonExecute`, csrc/python/triton_execute.c), in the server and in worker
processes: execute is not called from the adapter's Python, and what the model sees of its
requests and what the clients get of their responses, errors and parameters are unchanged."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

import openinfer

from conftest import triton_grpc, triton_http
from test_triton_python_batching import holding, queued_batch

# What both models' execute starts with: whether the adapter's Python called it (`adapter`).
HEAD = textwrap.dedent(
    """
    import copy, json, os, sys, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            caller = sys._getframe().f_back
            adapter = caller is not None and caller.f_code.co_filename.endswith("triton_model.py")
            responses = []
            for request in requests:
    """
)


def _model(body: str) -> str:
    """A model.py whose execute runs `body` for each request, after `HEAD`."""
    return HEAD + textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12) + "\n        return responses\n"


# Each request answered with OUT = IN * 2 and INFO, what execute saw: whether the adapter's
# Python called it, and the request's fields. A request parameter "mode" picks another outcome.
MODEL = _model(
    """
    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    params = json.loads(request.parameters())
    mode = params.get("mode", "")
    if mode == "raise":
        raise ValueError("asked to fail")
    if mode == "error":
        error = pb_utils.TritonError("IN is bad", pb_utils.TritonError.INVALID_ARG)
        responses.append(pb_utils.InferenceResponse(error=error))
        continue
    info = {"adapter": adapter, "id": request.request_id(), "parameters": params,
            "requested": sorted(request.requested_output_names()), "cancelled": request.is_cancelled(),
            "model": request.model_name(), "inputs": [t.name() for t in request.inputs()],
            "none": pb_utils.get_input_tensor_by_name(request, "NOPE") is None,
            "by_keyword": pb_utils.get_input_tensor_by_name(inference_request=request, name="IN").name(),
            "copied": copy.copy(request).request_id() == request.request_id(),
            "flags": [request.correlation_id(), request.flags(), request.timeout()]}
    outputs = [pb_utils.Tensor("OUT", (x * 2).astype(np.float32))]
    if mode != "leave_out":
        outputs.append(pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)))
    parameters = {"seen": mode} if mode == "params" else None
    responses.append(pb_utils.InferenceResponse(outputs, parameters=parameters))
    """
)
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] }}]
output [{{ name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""
# In the server (one instance), in worker processes (two), and a batching model's lone request.
MODELS = {"direct": (0, 1), "direct_workers": (0, 2), "direct_batching": (4, 1)}

# A dynamic batch (`HOLD` makes one): each request answers, on each of its rows, how many
# requests its execute call got, whether the adapter's Python called execute, and its id's number.
BATCH_MODEL = holding(_model(
    """
    HOLD
    seen = [len(requests), int(adapter), int(request.request_id()[1:])]
    outputs = [pb_utils.Tensor("SEEN", np.array([seen] * rows, np.int32)), pb_utils.Tensor("OUT", x * 2)]
    responses.append(pb_utils.InferenceResponse(outputs))
    """
))  # fmt: skip
BATCH_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ }}
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "SEEN", data_type: TYPE_INT32, dims: [ 3 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, file_gate: Path) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_direct")
    models = {name: (MODEL, CONFIG.format(name=name, batch=batch, count=count))
              for name, (batch, count) in MODELS.items()}  # fmt: skip
    models["batched"] = (BATCH_MODEL, BATCH_CONFIG.format(name="batched", count=1))
    models["batched_workers"] = (BATCH_MODEL, BATCH_CONFIG.format(name="batched_workers", count=2))
    for name, (model_py, config) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(model_py)
        (repo / name / "config.pbtxt").write_text(config)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def _input(module: object, name: str, batch: int) -> tuple[object, np.ndarray]:
    data = np.array([[1.5, -2.0]] if batch else [1.5, -2.0], np.float32)
    tensor = module.InferInput("IN", list(data.shape), "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(data)
    return tensor, data


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("name", list(MODELS))
def test_execute_is_called_by_the_core_and_sees_its_request(srv: openinfer.Server, protocol: str, name: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module, client = (httpclient, triton_http(srv)) if protocol == "http" else (grpcclient, triton_grpc(srv))
    tensor, data = _input(module, name, MODELS[name][0])
    only_out = client.infer(name, [tensor], outputs=[module.InferRequestedOutput("OUT")])  # the common answer
    assert only_out.as_numpy("OUT").tolist() == (data * 2).tolist()
    assert only_out.as_numpy("INFO") is None
    both = [module.InferRequestedOutput("OUT"), module.InferRequestedOutput("INFO")]
    result = client.infer(name, [tensor], outputs=both, request_id="r-7", parameters={"k": "v"})
    assert result.as_numpy("OUT").tolist() == (data * 2).tolist()
    info = json.loads(result.as_numpy("INFO").flatten()[0])
    assert info == {
        "adapter": False, "id": "r-7", "parameters": {"k": "v"}, "requested": ["INFO", "OUT"], "cancelled": False,
        "model": name, "inputs": ["IN"], "none": True, "by_keyword": "IN", "copied": True, "flags": [0, 0, 0],
    }  # fmt: skip


@pytest.mark.parametrize("name", ["direct", "direct_workers"])
def test_errors_parameters_and_left_out_outputs_answer_as_before(srv: openinfer.Server, name: str) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = triton_http(srv)
    tensor, data = _input(httpclient, name, 0)
    both = [httpclient.InferRequestedOutput("OUT"), httpclient.InferRequestedOutput("INFO")]
    with pytest.raises(InferenceServerException) as raised:
        client.infer(name, [tensor], parameters={"mode": "raise"})
    assert raised.value.status() == "500"
    assert f"Failed to process the request(s) for model '{name}_0" in raised.value.message()
    assert "ValueError: asked to fail" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.infer(name, [tensor], parameters={"mode": "error"})
    assert raised.value.status() == "400" and raised.value.message() == "IN is bad"
    answered = client.infer(name, [tensor], outputs=both, parameters={"mode": "params"})
    assert answered.get_response()["parameters"] == {"seen": "params"}
    left_out = client.infer(name, [tensor], outputs=both, parameters={"mode": "leave_out"})
    assert left_out.as_numpy("OUT").tolist() == (data * 2).tolist() and left_out.as_numpy("INFO") is None


def _batch_infer(srv: openinfer.Server, model: str, value: float, rows: int, request_id: str) -> tuple[list, list]:
    body = {"id": request_id, "inputs": [{"name": "IN", "datatype": "FP32", "shape": [rows, 1], "data": [value] * rows}]}
    answer = requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    outs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    return outs["SEEN"], outs["OUT"]


@pytest.mark.parametrize("model, blockers", [("batched", 1), ("batched_workers", 2)])
def test_a_dynamic_batch_is_joined_by_the_core(srv: openinfer.Server, file_gate: Path, model: str, blockers: int) -> None:
    answers = queued_batch(srv, file_gate, model, blockers, _batch_infer)
    for k, (seen, out) in enumerate(answers):
        assert out == [2.0 * (k + 1)] * (k + 1)  # each client its own request's rows
        assert [s[1:] for s in np.reshape(seen, (k + 1, 3)).tolist()] == [[0, k]] * (k + 1)  # not the adapter; its id
    assert max(a[0][0] for a in answers) >= 2  # the queued requests reached execute together


# A sequence's control input (START) reaches execute as an input, as in Triton, with the
# sequence's id and flags: through the core's call of execute, and through the adapter's Python
# (a decoupled model's, answering through its sender).
SEQUENCE_MODEL = _model(
    """
    start = pb_utils.get_input_tensor_by_name(request, "START")
    seen = [[t.name() for t in request.inputs()], start.as_numpy().tolist(), request.correlation_id(), request.flags()]
    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(seen).encode()], np.object_))])
    if DECOUPLED:  # its answer goes through the sender, and execute returns None
        request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        responses = None
    else:
        responses.append(response)
    """
)
SEQUENCE_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }}]
model_transaction_policy {{ decoupled: {decoupled} }}
sequence_batching {{
  control_input [{{ name: "START", control [{{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }}] }}]
}}
"""


@pytest.fixture(scope="module")
def sequence_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_direct_sequence")
    for name, decoupled in (("sequence", False), ("sequence_decoupled", True)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(SEQUENCE_MODEL.replace("DECOUPLED", str(decoupled)))
        (repo / name / "config.pbtxt").write_text(SEQUENCE_CONFIG.format(name=name, decoupled=str(decoupled).lower()))
    server = openinfer.serve(repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("name", ["sequence", "sequence_decoupled"])
def test_a_sequence_control_input_reaches_execute(sequence_srv: openinfer.Server, name: str) -> None:
    import tritonclient.grpc as grpcclient

    client = triton_grpc(sequence_srv)
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    seen = []
    for start in (True, False):
        if name == "sequence":
            result = client.infer(name, [tensor], sequence_id=7, sequence_start=start)
        else:
            got: list = []
            client.start_stream(callback=lambda result, error: got.append(error or result))
            client.async_stream_infer(name, [tensor], sequence_id=7, sequence_start=start)
            client.stop_stream()
            (result,) = got
            assert not isinstance(result, Exception), result
        seen.append(json.loads(result.as_numpy("OUT")[0]))
    assert seen == [[["IN", "START"], [1], 7, 1], [["IN", "START"], [0], 7, 0]]
