"""Triton Python models (TritonPythonModel) under ``sequence_batching { state [...] }``:
execute finds the state input in each request, as in Triton, and sees what Triton's
python_backend gives it: the initial state at every step, since python_backend never updates a
state (it calls no TRITONBACKEND_StateNew / TRITONBACKEND_StateUpdate; core's
SequenceStates::Initialize makes the input state at START and only such a call replaces it).
Driven through tritonclient over HTTP and gRPC, in the direct (one request) and the dynamic
batch paths, with one and two instances, in the server process and in worker processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer

from conftest import concurrent, triton_grpc, triton_http
from test_triton_python_backend import add_model

# A would-be accumulator: OUT and S_OUT are IN plus the state input; SEEN is the state input
# itself, so the client sees what execute saw, N how many requests that execute had and PID
# the process it ran in. NO_STATE_OUT leaves the state output out.
MODEL_PY = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils

NO_STATE_OUT = {no_state_out}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "S_IN").as_numpy()
            total = x + state
            outputs = [pb_utils.Tensor("OUT", total), pb_utils.Tensor("SEEN", state.copy()),
                       pb_utils.Tensor("N", np.full(x.shape, len(requests), np.int32)),
                       pb_utils.Tensor("PID", np.full(x.shape, os.getpid(), np.int64))]
            if not NO_STATE_OUT:
                outputs.append(pb_utils.Tensor("S_OUT", total))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  {strategy}
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ {state_dims} ] {initial} }} ]
}}
"""

FROM_FILE = 'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "h" }'
ZERO_DATA = 'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" }'
OLDEST = "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 20000 }"
# Waits for four requests (up to 5 s, a bound for a slow machine): a batch of four sequences.
BATCH_OF_FOUR = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }"

# name: (max_batch_size, instances, strategy, state dims, initial_state, initial value)
MODELS: dict[str, tuple[int, int, str, str, str, int]] = {
    "acc_zeros": (0, 1, "oldest { max_candidate_sequences: 4 }", "-1", "", 0),  # no initial_state: zeros
    "acc_file": (4, 1, "direct { }", "1", FROM_FILE, 100),
    "acc_two": (4, 2, OLDEST, "1", ZERO_DATA, 0),  # dynamic batches, two instances in this process
    "acc_workers": (4, 2, "direct { }", "1", ZERO_DATA, 0),  # an instance per worker process
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("repo")
    for name, (max_batch, instances, strategy, dims, initial, _) in MODELS.items():
        add_model(repo, name, MODEL_PY.format(no_state_out=False),
                  CONFIG.format(name=name, max_batch=max_batch, instances=instances, strategy=strategy,
                                state_dims=dims, initial=initial))  # fmt: skip
    add_model(repo, "acc_batch", MODEL_PY.format(no_state_out=False),
              CONFIG.format(name="acc_batch", max_batch=4, instances=1, strategy=BATCH_OF_FOUR, state_dims="1",
                            initial=FROM_FILE))  # fmt: skip
    add_model(repo, "no_state_out", MODEL_PY.format(no_state_out=True),
              CONFIG.format(name="no_state_out", max_batch=0, instances=1, strategy="", state_dims="1",
                            initial=""))  # fmt: skip
    for name in ("acc_file", "acc_batch"):  # FROM_FILE's initial state: 100
        (repo / name / "initial_state").mkdir()
        (repo / name / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def _client(srv: openinfer.Server, protocol: str) -> tuple[Any, Any]:
    return (httpclient, triton_http(srv)) if protocol == "http" else (grpcclient, triton_grpc(srv))


def _step(module: Any, client: Any, model: str, batching: bool, value: int, asked: tuple[str, ...] = (),
          **sequence: Any) -> Any:  # fmt: skip
    shape = [1, 1] if batching else [1]
    tensor = module.InferInput("IN", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    outputs = [module.InferRequestedOutput(n) for n in asked] or None
    return client.infer(model, [tensor], outputs=outputs, **sequence)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", list(MODELS))
def test_execute_sees_the_initial_state_at_every_step(server: openinfer.Server, protocol: str, model: str) -> None:
    """Two interleaved sequences of three steps: execute finds S_IN in every request, holding
    the initial state each time (the state output the model returned is not carried on, as
    python_backend never updates a state), and a client that asks for the declared S_OUT gets
    what the model returned."""
    max_batch, _, _, _, _, initial = MODELS[model]
    module, client = _client(server, protocol)
    seen: dict[int, list[int]] = {41: [], 42: []}
    pids: dict[int, set[int]] = {41: set(), 42: set()}
    for step, (a, b) in enumerate([(1, 10), (2, 20), (3, 30)]):
        for seq, value in ((41, a), (42, b)):
            r = _step(module, client, model, max_batch > 0, value, ("OUT", "SEEN", "S_OUT", "PID"), sequence_id=seq,
                      sequence_start=step == 0, sequence_end=step == 2)  # fmt: skip
            seen[seq].append(int(r.as_numpy("SEEN").reshape(-1)[0]))
            pids[seq].add(int(r.as_numpy("PID").reshape(-1)[0]))
            assert r.as_numpy("SEEN").shape == ((1, 1) if max_batch > 0 else (1,))  # [1] + dims, -1 as 1
            assert int(r.as_numpy("OUT").reshape(-1)[0]) == value + initial
            assert int(r.as_numpy("S_OUT").reshape(-1)[0]) == value + initial
    assert seen == {41: [initial] * 3, 42: [initial] * 3}
    if model == "acc_workers":  # Direct: each sequence on one instance, here one worker, as in Triton
        assert len(pids[41]) == len(pids[42]) == 1 and pids[41] != pids[42] and os.getpid() not in pids[41] | pids[42]
    else:  # Oldest (any instance may run a step) and single instances stay in this process
        assert pids == {41: {os.getpid()}, 42: {os.getpid()}}


def test_a_dynamic_batch_of_sequences(server: openinfer.Server) -> None:
    """Four sequences at once, two steps each, on a model that batches four requests: execute
    gets the four requests of each batch apart, each with its own S_IN (the initial state)."""

    def sequence(k: int) -> list[tuple[int, int, int]]:
        client = triton_http(server)
        answers = [_step(httpclient, client, "acc_batch", True, k, ("OUT", "SEEN", "N"), sequence_id=60 + k,
                         sequence_start=step == 0, sequence_end=step == 1) for step in range(2)]  # fmt: skip
        return [tuple(int(r.as_numpy(n)[0][0]) for n in ("N", "SEEN", "OUT")) for r in answers]

    assert concurrent(4, sequence) == [[(4, 100, 100 + k)] * 2 for k in range(4)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_that_leaves_the_state_output_out(server: openinfer.Server, protocol: str) -> None:
    """Triton never reads a Python model's state output, so a model that produces none is
    served (200), its state input still the initial one."""
    module, client = _client(server, protocol)
    for step in range(3):
        r = _step(module, client, "no_state_out", False, 7, sequence_id=70, sequence_start=step == 0,
                  sequence_end=step == 2)  # fmt: skip
        assert int(r.as_numpy("SEEN")[0]) == 0
        assert int(r.as_numpy("OUT")[0]) == 7


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_cannot_send_the_state_input(server: openinfer.Server, protocol: str) -> None:
    """S_IN is the sequence batcher's, not the client's: sent by the client it is an unexpected
    input, 400 / INVALID_ARGUMENT (Triton's core: "unexpected inference input 'S_IN' for model")."""
    module, client = _client(server, protocol)
    tensors = []
    for name in ("IN", "S_IN"):
        tensor = module.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([5], np.int32))
        tensors.append(tensor)
    with pytest.raises(InferenceServerException) as e:
        client.infer("acc_zeros", tensors, sequence_id=80, sequence_start=True)
    assert "unexpected input 'S_IN' for model 'acc_zeros'" in e.value.message()
    assert e.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
