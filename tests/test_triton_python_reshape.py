"""A Triton Python model's config `reshape` applies as Triton's core applies it: execute sees an
input in its reshape and produces an output in it, while the client sends and gets them in
their dims (in the server process, in worker processes and in a dynamic batch), over
tritonclient HTTP and gRPC."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

import openinfer

from test_triton_python_fidelity import PROLOGUE, add_model, client_and_module, tensor

# Answers X + 1 as Y, and the shape execute saw as SEEN.
MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                seen = np.array([json.dumps(list(x.shape)).encode()] * (x.shape[0] if BATCHED else 1), np.object_)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", x + 1), pb_utils.Tensor("SEEN", seen.reshape(SEEN_SHAPE(x)))]))
            return responses
    """
)


def batched_config(name: str, count: int) -> str:
    """dims [1], reshaped to [] both ways: execute sees [batch]."""
    return textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        dynamic_batching {{ }}
        input [{{ name: "X", data_type: TYPE_FP32, dims: [ 1 ], reshape: {{ shape: [ ] }} }}]
        output [{{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ], reshape: {{ shape: [ ] }} }}]
        output [{{ name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU, count: {count} }}]
        """
    )


# dims [2, -1] reshaped to [-1, 2]: a [2, 3] request is seen as [3, 2] (the -1 keeps its size).
WILDCARD_CONFIG = textwrap.dedent(
    """
    name: "wildcard"
    backend: "python"
    input [{ name: "X", data_type: TYPE_FP32, dims: [ 2, -1 ], reshape: { shape: [ -1, 2 ] } }]
    output [{ name: "Y", data_type: TYPE_FP32, dims: [ 2, -1 ], reshape: { shape: [ -1, 2 ] } }]
    output [{ name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] }]
    """
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_reshape")
    batched = MODEL.replace("BATCHED", "True").replace("SEEN_SHAPE(x)", "(-1, 1)")
    add_model(repo, "batched", batched, batched_config("batched", 1))
    add_model(repo, "batched_in_workers", batched, batched_config("batched_in_workers", 2))
    add_model(repo, "wildcard", MODEL.replace("BATCHED", "False").replace("SEEN_SHAPE(x)", "(1,)"), WILDCARD_CONFIG)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, metrics_port=None, threads=1, log=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("model", ["batched", "batched_in_workers"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batched_input_and_output_reshaped_to_no_dims(srv: openinfer.Server, model: str, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    result = client.infer(model, [tensor(module, "X", np.array([[1], [2], [3]], np.float32))])  # type: ignore[attr-defined]
    assert [json.loads(s) for s in result.as_numpy("SEEN").reshape(-1)] == [[3]] * 3
    assert result.as_numpy("Y").tolist() == [[2.0], [3.0], [4.0]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_variable_dimension_keeps_its_size_through_the_reshape(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("wildcard", [tensor(module, "X", x)])  # type: ignore[attr-defined]
    assert json.loads(result.as_numpy("SEEN")[0]) == [3, 2]
    assert result.as_numpy("Y").tolist() == (x + 1).tolist()
