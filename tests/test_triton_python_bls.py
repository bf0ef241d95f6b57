"""BLS (business logic scripting) from Triton Python models: python_backend's bls and bls_decoupled
examples served unchanged with their own clients, and InferenceRequest.exec / async_exec to Python,
TorchScript, ensemble and decoupled models through tritonclient HTTP and gRPC, errors included;
pb_utils.load_model / unload_model / is_model_ready under explicit model control."""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http
from test_triton_python_backend import EXAMPLES, PROLOGUE, add_model, example, run_client

# Calls the model named by its MODEL input with its IN input (as TARGET_IN), returns the
# target's TARGET_OUT as OUT, or the target's error message as OUT when it failed; options from
# the request's parameters: timeout, correlation_id, flags, params (JSON passed on), decoupled.
CALLER = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                p = json.loads(request.parameters())
                target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0]
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                bls = pb_utils.InferenceRequest(
                    model_name=target.decode(),
                    inputs=[pb_utils.Tensor(p.get("in_name", "INPUT0"), x)],
                    requested_output_names=[p.get("out_name", "OUTPUT0")],
                    timeout=p.get("timeout", 0), correlation_id=p.get("correlation_id", 0),
                    flags=p.get("flags", 0), parameters=p.get("params", {}),
                )
                if p.get("decoupled"):
                    got = [r for r in bls.exec(decoupled=True)]
                    errors = [r.error().message() for r in got if r.has_error()]
                    if errors:
                        out = np.array([errors[0].encode()], np.object_)
                    else:
                        outs = [pb_utils.get_output_tensor_by_name(r, p.get("out_name", "OUTPUT0")) for r in got]
                        out = np.array([str([o.as_numpy().tolist() for o in outs if o is not None]).encode()],
                                       np.object_)
                else:
                    r = bls.exec()
                    if r.has_error():
                        out = np.array([f"{r.error().code()}:{r.error().message()}".encode()], np.object_)
                    else:
                        t = r.output_tensors()[0]
                        out = np.array([str(t.as_numpy().tolist()).encode()], np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
            return responses
    """
)
CALLER_CONFIG = """
name: "caller"
backend: "python"
input [{ name: "MODEL", data_type: TYPE_STRING, dims: [ 1 ] }, { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# Echoes IN as OUT with what reached it: its parameters, correlation id and request id; fails
# when IN's first value is negative; waits on nothing.
ECHO = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                if x.size and x[0] < 0:
                    raise ValueError("negative input")
                seen = json.dumps({"params": json.loads(r.parameters()), "corr": r.correlation_id(), "flags": r.flags()})
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2),
                                                       pb_utils.Tensor("SEEN", np.array([seen.encode()], np.object_))]))
            return out
    """
)
ECHO_CONFIG = """
name: "echo"
backend: "python"
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] }]
"""
ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
ensemble_scheduling { step [
  { model_name: "echo", model_version: -1, input_map { key: "INPUT0" value: "INPUT0" },
    output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "echo", model_version: -1, input_map { key: "INPUT0" value: "mid" },
    output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""


def bls_examples(repo: Path) -> None:
    """The bls and bls_decoupled examples laid out as their READMEs say."""
    example(repo, "add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
    example(repo, "pytorch", "pytorch/model.py", "pytorch/config.pbtxt")
    example(repo, "bls_sync", "bls/sync_model.py", "bls/sync_config.pbtxt")
    example(repo, "bls_async", "bls/async_model.py", "bls/async_config.pbtxt")
    example(repo, "square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    example(repo, "bls_decoupled_sync", "bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt")
    example(repo, "bls_decoupled_async", "bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    pytest.importorskip("torch")
    repo = tmp_path_factory.mktemp("bls")
    bls_examples(repo)
    add_model(repo, "caller", CALLER, CALLER_CONFIG)
    add_model(repo, "echo", ECHO, ECHO_CONFIG)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("script", ["bls/sync_client.py", "bls/async_client.py",
                                    "bls_decoupled/sync_client.py", "bls_decoupled/async_client.py"])
def test_bls_examples_and_their_clients_unchanged(srv: openinfer.Server, script: str) -> None:
    out = run_client(srv, EXAMPLES / script)
    assert "PASS" in out, out


def call(srv: openinfer.Server, model: str, x: np.ndarray, protocol: str = "http", **params: object) -> str:
    """The caller model's OUT for a BLS to `model` with IN `x`, through tritonclient."""
    if protocol == "http":
        import tritonclient.http as client

        c = triton_http(srv)
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]

        c = triton_grpc(srv)
    name = client.InferInput("MODEL", [1], "BYTES")
    name.set_data_from_numpy(np.array([model.encode()], np.object_))
    value = client.InferInput("IN", list(x.shape), "FP32")
    value.set_data_from_numpy(x)
    sent = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in params.items()}
    result = c.infer("caller", [name, value], parameters=sent or None)
    return result.as_numpy("OUT")[0].decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_to_a_python_model(srv: openinfer.Server, protocol: str) -> None:
    assert call(srv, "echo", np.array([1.5, 2.0], np.float32), protocol) == "[3.0, 4.0]"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_to_an_ensemble(srv: openinfer.Server, protocol: str) -> None:
    assert call(srv, "ens", np.array([1.0, -0.5], np.float32), protocol) == "[4.0, -2.0]"


def test_bls_to_an_unknown_model_is_the_responses_error(srv: openinfer.Server) -> None:
    assert call(srv, "nothere", np.zeros(2, np.float32)) == "2:Request for unknown model: 'nothere' is not found"


def test_bls_to_a_model_that_fails(srv: openinfer.Server) -> None:
    out = call(srv, "echo", np.array([-1.0], np.float32))
    assert out.startswith("1:Failed to process the request(s) for model 'echo_0', message: ValueError: negative input"), out
