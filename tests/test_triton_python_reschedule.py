"""Request rescheduling (set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)) and
``sequence_batching { iterative_sequence: true }`` Triton Python models: a request runs again
until its model releases it, decoupled (a response per step, through gRPC streaming and BLS) or
not (one response at the end, through HTTP and gRPC)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http
from test_triton_python_backend import PROLOGUE, add_model
from test_triton_python_decoupled import stream

# Triton's iterative_sequence QA model (README "Request Rescheduling"): IN says how many
# responses; each step sends the count still to come and reschedules until it reaches 0.
ITERATIVE = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def initialize(self, args):
            self.remaining_response = 0
            self.reset_flag = True

        def execute(self, requests):
            for request in requests:
                in_input = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if self.reset_flag:
                    self.remaining_response = in_input[0]
                    self.reset_flag = False
                response_sender = request.get_response_sender()
                self.remaining_response -= 1
                out_output = pb_utils.Tensor("OUT", np.array([self.remaining_response], np.int32))
                response = pb_utils.InferenceResponse(output_tensors=[out_output])
                if self.remaining_response <= 0:
                    response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    self.reset_flag = True
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    response_sender.send(response)
            return None
    """
)
ITERATIVE_CONFIG = """
name: "iterative_sequence"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
sequence_batching { iterative_sequence : true }
instance_group [{ kind: KIND_CPU }]
"""
# Non-decoupled: counts the executions of its request, returning None while it reschedules.
COUNTING = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def initialize(self, args):
            self.runs = 0

        def execute(self, requests):
            out = []
            for request in requests:
                self.runs += 1
                n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                if self.runs < n:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    out.append(None if n > 0 else pb_utils.InferenceResponse([]))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.runs], np.int32))]))
                    self.runs = 0
            return out
    """
)
COUNTING_CONFIG = """
name: "counting"
backend: "python"
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
sequence_batching { iterative_sequence : true }
"""
# Rescheduling without returning None: Triton's error.
NOT_NONE = COUNTING.replace("out.append(None if n > 0 else pb_utils.InferenceResponse([]))",
                            "out.append(pb_utils.InferenceResponse([]))")
# BLS to the iterative model: the sum of its responses.
BLS = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                got = pb_utils.InferenceRequest(model_name="iterative_sequence", requested_output_names=["OUT"],
                    inputs=[pb_utils.get_input_tensor_by_name(request, "IN")]).exec(decoupled=True)
                values = [int(r.output_tensors()[0].as_numpy()[0]) for r in got if r.output_tensors()]
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(values, np.int32))]))
            return out
    """
)
BLS_CONFIG = """
name: "bls_iterative"
backend: "python"
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ -1 ] }]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("reschedule")
    add_model(repo, "iterative_sequence", ITERATIVE, ITERATIVE_CONFIG)
    add_model(repo, "counting", COUNTING, COUNTING_CONFIG)
    add_model(repo, "not_none", NOT_NONE, COUNTING_CONFIG.replace('"counting"', '"not_none"'))
    add_model(repo, "bls_iterative", BLS, BLS_CONFIG)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def test_iterative_sequence_decoupled_reschedules_until_done(srv: openinfer.Server) -> None:
    items = stream(srv, "iterative_sequence", [3])
    assert [int(i.as_numpy("OUT")[0]) for i in items if i.as_numpy("OUT") is not None] == [2, 1, 0]  # type: ignore[attr-defined]
    assert stream(srv, "iterative_sequence", [1])[0].as_numpy("OUT").tolist() == [0]  # type: ignore[attr-defined]


def infer(srv: openinfer.Server, model: str, n: int, protocol: str) -> object:
    if protocol == "http":
        import tritonclient.http as client

        c = triton_http(srv)
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]

        c = triton_grpc(srv)
    t = client.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([n], np.int32))
    return c.infer(model, [t]).as_numpy("OUT").tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_reschedule_answers_once_at_the_end(srv: openinfer.Server, protocol: str) -> None:
    assert infer(srv, "counting", 4, protocol) == [4]
    assert infer(srv, "counting", 1, protocol) == [1]


def test_a_rescheduled_request_with_a_response_is_tritons_error(srv: openinfer.Server) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:
        infer(srv, "not_none", 3, "http")
    assert "Expected a None object in the execute function return list for reschduled request" in str(e.value)


def test_bls_to_an_iterative_model(srv: openinfer.Server) -> None:
    assert infer(srv, "bls_iterative", 3, "http") == [2, 1, 0]
