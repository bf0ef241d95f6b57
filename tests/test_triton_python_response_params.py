"""A Triton Python model's response parameters (`InferenceResponse(parameters=...)`, issue 39
point 4) reach the client as Triton's frontends send them: the HTTP response's "parameters"
object, gRPC ModelInferResponse `parameters` (bool_param, int64_param, string_param), also over
ModelStreamInfer beside `triton_final_response`, the generate extension's keys, and a BLS
caller's `response.parameters()`. And a decoupled model's final flag sent with its last
response ends the stream with that response, with no empty one after it (issue 39 point 7)."""

from __future__ import annotations

import json
import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

import openinfer

from conftest import triton_grpc, triton_http

PARAMS = {"flag": True, "count": -7, "text": 'quoted " é', "é" * 40: "a long key of escapes"}

PARAMS_MODEL = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    PARAMS = {"flag": True, "count": -7, "text": 'quoted " é', "é" * 40: "a long key of escapes"}

    class TritonPythonModel:
        def initialize(self, args):  # `int64_overflow`: a value no InferParameter holds
            self.params = {"count": 2**63} if args["model_name"] == "int64_overflow" else PARAMS

        def execute(self, requests):
            out = pb_utils.Tensor("OUT", np.array([1.0], np.float32))
            return [pb_utils.InferenceResponse([out], parameters=self.params) for _ in requests]
    """
)

# Sends two responses, then the final flag alone (`stream_params`: Triton's stream ends with an
# empty response when the client asked for one) or with the second response (the other names:
# no empty response follows).
STREAM_MODEL = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    class TritonPythonModel:
        def initialize(self, args):
            self.final_alone = args["model_name"] == "stream_params"

        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                for k in range(2):
                    out = pb_utils.Tensor("OUT", np.array([float(k)], np.float32))
                    flags = FINAL if k == 1 and not self.final_alone else 0
                    sender.send(pb_utils.InferenceResponse([out], parameters={"index": k, "last": k == 1}), flags=flags)
                if self.final_alone:
                    sender.send(flags=FINAL)
            return None
    """
)

# Calls `params` (in this process and in worker processes) and the decoupled `stream_params`,
# and answers with what each BLS response's parameters() gave.
BLS_MODEL = textwrap.dedent(
    """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.Tensor("IN", np.zeros(1, np.float32))
            seen = []
            for target in ("params", "params_in_workers"):
                response = pb_utils.InferenceRequest(
                    model_name=target, inputs=[x], requested_output_names=["OUT"]).exec()
                seen.append(json.loads(response.parameters()))
            stream = pb_utils.InferenceRequest(
                model_name="stream_params", inputs=[x], requested_output_names=["OUT"]).exec(decoupled=True)
            seen.append([json.loads(r.parameters()) for r in stream])
            for target in ("final_with_last", "final_with_last_in_workers"):
                stream = pb_utils.InferenceRequest(
                    model_name=target, inputs=[x], requested_output_names=["OUT"]).exec(decoupled=True)
                seen.append([json.loads(r.parameters()) for r in stream])
            out = pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
    """
)
DECOUPLED = "model_transaction_policy { decoupled: true }\n"
IN_WORKERS = "instance_group [{ kind: KIND_CPU, count: 2 }]\n"


def add_model(repo: Path, name: str, model_py: str, extra: str = "", output: str = "OUT", dtype: str = "FP32") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]\n'
        f'output [{{ name: "{output}", data_type: TYPE_{dtype}, dims: [ 1 ] }}]\n' + extra
    )


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("respparams_repo")
    add_model(repo, "params", PARAMS_MODEL)
    add_model(repo, "params_in_workers", PARAMS_MODEL, IN_WORKERS)
    add_model(repo, "int64_overflow", PARAMS_MODEL)
    add_model(repo, "stream_params", STREAM_MODEL, DECOUPLED)
    add_model(repo, "final_with_last", STREAM_MODEL, DECOUPLED)
    add_model(repo, "final_with_last_in_workers", STREAM_MODEL, DECOUPLED + IN_WORKERS)
    add_model(repo, "bls_caller", BLS_MODEL, output="SEEN", dtype="STRING")
    add_model(repo, "bls_caller_in_workers", BLS_MODEL, IN_WORKERS, output="SEEN", dtype="STRING")
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 2, "log": False}
    with openinfer.serve(repo, **options) as server:
        yield server


def grpc_params(message: object) -> dict[str, object]:
    """A gRPC response's parameters as {key: value}, read off the InferParameter oneofs."""
    params = message.parameters  # type: ignore[attr-defined]
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in params.items()}


@pytest.mark.parametrize("binary", [False, True])
def test_http_response_carries_the_models_parameters(srv: openinfer.Server, binary: bool) -> None:
    import tritonclient.http as httpclient

    t = httpclient.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32), binary_data=binary)
    out = httpclient.InferRequestedOutput("OUT", binary_data=binary)
    result = triton_http(srv).infer("params", [t], outputs=[out])
    assert result.get_response()["parameters"] == PARAMS
    assert result.as_numpy("OUT").tolist() == [1.0]


def test_grpc_response_carries_the_models_parameters(srv: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    result = triton_grpc(srv).infer("params", [t])
    assert grpc_params(result.get_response()) == PARAMS
    assert result.get_response(as_json=True)["parameters"]["count"] == {"int64_param": "-7"}


def stream(srv: openinfer.Server, model: str, empty_final: bool = True) -> list[dict[str, object]]:
    """One request's responses over a gRPC stream (tritonclient), until the one flagged final or,
    without `empty_final`, until none comes for a second; each as its parameters."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = triton_grpc(srv)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got: list[dict[str, object]] = []
    try:
        t = grpcclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer(model, [t], enable_empty_final_response=empty_final)
        while True:
            try:
                result, error = answers.get(timeout=30 if empty_final or not got else 1)
            except queue.Empty:
                return got
            assert error is None
            got.append(grpc_params(result.get_response()))
            if empty_final and got[-1]["triton_final_response"]:
                return got
    finally:
        client.stop_stream()


def test_grpc_stream_responses_carry_their_parameters(srv: openinfer.Server) -> None:
    assert stream(srv, "stream_params") == [
        {"index": 0, "last": False, "triton_final_response": False},
        {"index": 1, "last": True, "triton_final_response": False},
        {"triton_final_response": True},
    ]


def test_generate_answer_has_each_parameter_as_a_key(srv: openinfer.Server) -> None:
    answer = requests.post(f"{srv.url}/v2/models/params/generate", json={"IN": [0.0]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"model_name": "params", "model_version": "1", "OUT": 1.0, **PARAMS}


def test_generate_stream_events_carry_their_parameters(srv: openinfer.Server) -> None:
    answer = requests.post(f"{srv.url}/v2/models/stream_params/generate_stream", json={"IN": [0.0]}, timeout=30)
    assert answer.status_code == 200, answer.text
    events = [json.loads(line[len("data: "):]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert [(e["OUT"], e["index"], e["last"]) for e in events] == [(0.0, 0, False), (1.0, 1, True)]


@pytest.mark.parametrize("model", ["params", "params_in_workers"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_parameters_of_a_model_in_worker_processes_too(srv: openinfer.Server, model: str, protocol: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    t = module.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    if protocol == "http":
        assert triton_http(srv).infer(model, [t]).get_response()["parameters"] == PARAMS
    else:
        assert grpc_params(triton_grpc(srv).infer(model, [t]).get_response()) == PARAMS


@pytest.mark.parametrize("caller", ["bls_caller", "bls_caller_in_workers"])
def test_a_bls_caller_reads_each_responses_parameters(srv: openinfer.Server, caller: str) -> None:
    import tritonclient.http as httpclient

    t = httpclient.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    seen = json.loads(triton_http(srv).infer(caller, [t]).as_numpy("SEEN")[0])
    final_alone = [{"index": 0, "last": False}, {"index": 1, "last": True}, {}]
    final_with_last = final_alone[:2]
    assert seen == [PARAMS, PARAMS, final_alone, final_with_last, final_with_last]


@pytest.mark.parametrize("model", ["final_with_last", "final_with_last_in_workers"])
@pytest.mark.parametrize("empty_final", [True, False])
def test_a_final_flag_sent_with_the_last_response_adds_no_empty_one(
    srv: openinfer.Server, model: str, empty_final: bool
) -> None:
    assert stream(srv, model, empty_final) == [
        {"index": 0, "last": False, "triton_final_response": False},
        {"index": 1, "last": True, "triton_final_response": True},
    ]


def test_a_final_flag_that_comes_alone_sends_nothing_unless_asked(srv: openinfer.Server) -> None:
    assert stream(srv, "stream_params", empty_final=False) == [
        {"index": 0, "last": False, "triton_final_response": False},
        {"index": 1, "last": True, "triton_final_response": False},
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_int_past_int64_fails_the_request_naming_it(srv: openinfer.Server, protocol: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    module, client = (httpclient, triton_http(srv)) if protocol == "http" else (grpcclient, triton_grpc(srv))
    t = module.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("int64_overflow", [t])
    assert e.value.message().startswith(
        "Failed to process the request(s) for model 'int64_overflow_0', message: TritonModelException: Expect "
        f"parameters int values to fit int64, found {2**63} for key 'count'\n"
    )


# Counts its executions in its response parameters: a cached response shows the first count.
COUNTING_MODEL = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.calls = 0

        def execute(self, requests):
            self.calls += 1
            out = pb_utils.Tensor("OUT", np.array([1.0], np.float32))
            return [pb_utils.InferenceResponse([out], parameters={"calls": self.calls}) for _ in requests]
    """
)


def test_a_cached_response_keeps_its_parameters(tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    add_model(tmp_path, "counting", COUNTING_MODEL, "response_cache { enable: true }\n")
    with openinfer.serve(tmp_path, http_port=0, log=False, cache_config=["local,size=1048576"]) as server:
        t = httpclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.zeros(1, np.float32))
        client = triton_http(server)
        answers = [client.infer("counting", [t]).get_response()["parameters"] for _ in range(2)]
    assert answers == [{"calls": 1}, {"calls": 1}]
