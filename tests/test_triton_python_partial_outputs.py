"""A Triton Python model's response may carry only some of the declared outputs, as in Triton
(issue 39): the client gets the outputs that exist, an ensemble tensor such an output maps to
stays unset, the next step runs without it when its input is optional and fails in Triton's
words when it is not, and the ensemble's answer leaves an unset output out. In the server
process, in worker processes, in a dynamic batch, in a decoupled stream and to a BLS caller,
over tritonclient HTTP and gRPC."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc
from test_triton_python_batch_requests import in_one_batch, over_http
from test_triton_python_fidelity import PROLOGUE, add_model, client_and_module, config, tensor

# A always; B only when its input's first element is >= 0 (a response with some of its outputs,
# as Triton allows). -1 holds execute (bounded) until the gate file exists, so that later
# requests queue and form one batch.
SOMETIMES_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = request.inputs()[0].as_numpy()
                if x.reshape(-1)[0] == -1:
                    with open(os.environ["PYB_GATE"] + ".held", "a") as f:
                        f.write("held\\n")
                    end = time.monotonic() + 60
                    while not os.path.exists(os.environ["PYB_GATE"]) and time.monotonic() < end:
                        time.sleep(0.01)
                outs = [pb_utils.Tensor("A", x + 1)]
                if x.reshape(-1)[0] >= 0:
                    outs.append(pb_utils.Tensor("B", x * 2))
                responses.append(pb_utils.InferenceResponse(outs))
            return responses
    """
)
SOMETIMES_IO = ([("X", "FP32", "-1")], [("A", "FP32", "-1"), ("B", "FP32", "-1")])

# Which of its inputs a request brought, as JSON.
PRESENT_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                seen = [t.name() for t in request.inputs()]
                out = pb_utils.Tensor("S", np.array([json.dumps(sorted(seen)).encode()], np.object_))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)

# Decoupled: two responses, the first with A only, the second with A and B.
STREAM_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = request.inputs()[0].as_numpy()
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("A", x + 1)]))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("A", x + 2), pb_utils.Tensor("B", x * 2)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
)

# Calls `sometimes` by BLS and answers the names of the outputs its response holds.
BLS_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.Tensor("X", request.inputs()[0].as_numpy())
                answer = pb_utils.InferenceRequest(model_name="sometimes", inputs=[x],
                                                   requested_output_names=["A", "B"]).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                names = sorted(t.name() for t in answer.output_tensors())
                out = pb_utils.Tensor("S", np.array([json.dumps(names).encode()], np.object_))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)


def ensemble(name: str, second: str) -> str:
    """sometimes -> `second`: A and B become the ensemble tensors a and b, which `second` reads;
    the ensemble answers S and b (as BOUT)."""
    head = config(name, [("X", "FP32", "-1")], [("S", "STRING", "1"), ("b", "FP32", "-1")])
    return head.replace('backend: "python"', 'platform: "ensemble"') + textwrap.dedent(
        f"""
        ensemble_scheduling {{ step [
          {{ model_name: "sometimes" model_version: -1 input_map {{ key: "X" value: "X" }}
            output_map {{ key: "A" value: "a" }} output_map {{ key: "B" value: "b" }} }},
          {{ model_name: "{second}" model_version: -1 input_map {{ key: "A" value: "a" }}
            input_map {{ key: "B" value: "b" }} output_map {{ key: "S" value: "S" }} }}
        ] }}
        """
    )


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, file_gate: Path) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("partial_outputs")
    add_model(repo, "sometimes", SOMETIMES_MODEL, config("sometimes", *SOMETIMES_IO))
    add_model(repo, "sometimes_in_workers", SOMETIMES_MODEL,
              config("sometimes_in_workers", *SOMETIMES_IO, "instance_group [{ kind: KIND_CPU, count: 2 }]\n"))
    batched_io = ([("IN", "FP32", "1")], [("A", "FP32", "1"), ("B", "FP32", "1")])
    for name, count in (("sometimes_batched", 1), ("sometimes_batched_in_workers", 2)):
        batching = f"max_batch_size: 8\ndynamic_batching {{ }}\ninstance_group [{{ kind: KIND_CPU, count: {count} }}]\n"
        add_model(repo, name, SOMETIMES_MODEL, config(name, *batched_io, batching))
    present_io = [("A", "FP32", "-1")], [("S", "STRING", "1")]
    add_model(repo, "b_optional", PRESENT_MODEL, config("b_optional", [*present_io[0], ("B", "FP32", "-1", True)],
                                                        present_io[1]))
    add_model(repo, "b_required", PRESENT_MODEL, config("b_required", [*present_io[0], ("B", "FP32", "-1")],
                                                        present_io[1]))
    add_model(repo, "stream", STREAM_MODEL,
              config("stream", *SOMETIMES_IO, "model_transaction_policy { decoupled: true }\n"))
    add_model(repo, "bls_names", BLS_MODEL, config("bls_names", [("X", "FP32", "-1")], [("S", "STRING", "1")]))
    for name, second in (("ens_optional", "b_optional"), ("ens_required", "b_required")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ensemble(name, second))
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=1, log=False)
    try:
        yield server
    finally:
        server.stop()


def outputs_of(result: object, names: tuple[str, ...]) -> dict[str, object]:
    """The outputs a tritonclient result holds, by name (those missing left out)."""
    arrays = {name: result.as_numpy(name) for name in names}  # type: ignore[attr-defined]
    return {name: a.tolist() for name, a in arrays.items() if a is not None}


@pytest.mark.parametrize("model", ["sometimes", "sometimes_in_workers"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_response_without_an_output_answers_with_the_others(srv: openinfer.Server, model: str, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    x = tensor(module, "X", np.array([-3, 4], np.float32))
    result = client.infer(model, [x])  # type: ignore[attr-defined]
    assert outputs_of(result, ("A", "B")) == {"A": [-2.0, 5.0]}
    # asked for by name, as Triton's core answers: without it, and no error
    asked = [module.InferRequestedOutput(name) for name in ("B", "A")]  # type: ignore[attr-defined]
    assert outputs_of(client.infer(model, [x], outputs=asked), ("A", "B")) == {"A": [-2.0, 5.0]}  # type: ignore[attr-defined]
    x = tensor(module, "X", np.array([1, 4], np.float32))
    assert outputs_of(client.infer(model, [x]), ("A", "B")) == {"A": [2.0, 5.0], "B": [2.0, 8.0]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("model, blockers", [("sometimes_batched", 1), ("sometimes_batched_in_workers", 2)])
def test_a_dynamic_batch_whose_responses_leave_an_output_out(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    answers = in_one_batch(srv, file_gate, model, blockers, [(over_http, -2.0, 1, {}), (over_http, -3.0, 2, {})])
    assert answers == [(200, {"A": [-1.0], "parameters": None}), (200, {"A": [-2.0, -2.0], "parameters": None})]
    # some responses of the batch with it, some without: each client gets its own
    answers = in_one_batch(srv, file_gate, model, blockers,
                           [(over_http, -2.0, 1, {}), (over_http, 3.0, 2, {}), (over_http, -4.0, 1, {})])  # fmt: skip
    assert answers == [
        (200, {"A": [-1.0], "parameters": None}),
        (200, {"A": [4.0, 4.0], "B": [6.0, 6.0], "parameters": None}),
        (200, {"A": [-3.0], "parameters": None}),
    ]


def test_a_stream_response_without_an_output_answers_with_the_others(srv: openinfer.Server) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    client = triton_grpc(srv)
    got: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("stream", [tensor(grpcclient, "X", np.array([1], np.float32))])
    answers = [got.get(timeout=30) for _ in range(2)]
    client.stop_stream()
    assert [e for _, e in answers] == [None, None]
    assert [outputs_of(r, ("A", "B")) for r, _ in answers] == [{"A": [2.0]}, {"A": [3.0], "B": [2.0]}]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_bls_caller_gets_the_outputs_a_response_has(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    for x, names in ((-3, ["A"]), (3, ["A", "B"])):
        result = client.infer("bls_names", [tensor(module, "X", np.array([x], np.float32))])  # type: ignore[attr-defined]
        assert json.loads(result.as_numpy("S")[0]) == names


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unset_ensemble_tensor_skips_an_optional_input_and_the_answer(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    result = client.infer("ens_optional", [tensor(module, "X", np.array([-3], np.float32))])  # type: ignore[attr-defined]
    answer = outputs_of(result, ("S", "b"))
    assert set(answer) == {"S"} and json.loads(answer["S"][0]) == ["A"]
    result = client.infer("ens_optional", [tensor(module, "X", np.array([2], np.float32))])  # type: ignore[attr-defined]
    answer = outputs_of(result, ("S", "b"))
    assert json.loads(answer["S"][0]) == ["A", "B"] and answer["b"] == [4.0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unset_ensemble_tensor_fails_a_required_input_in_tritons_words(srv: openinfer.Server, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    client, module = client_and_module(srv, protocol)
    with pytest.raises(InferenceServerException) as e:
        client.infer("ens_required", [tensor(module, "X", np.array([-3], np.float32))])  # type: ignore[attr-defined]
    assert e.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert e.value.message() == (
        "in ensemble 'ens_required', step 1 (model 'b_required'): [request id: <id_unknown>] expected 2 inputs but "
        "got 1 inputs for model 'b_required'. Got input(s) ['A'], but missing required input(s) ['B']. Please "
        "provide all required input(s)."
    )
