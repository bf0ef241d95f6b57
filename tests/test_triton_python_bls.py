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

from conftest import save_torchscript, triton_grpc, triton_http, wait_for
from test_triton_python_backend import EXAMPLES, PROLOGUE, add_model, example, run_client

# Calls the model named by its MODEL input with its IN input (as TARGET_IN), returns the
# target's TARGET_OUT as OUT, or the target's error message as OUT when it failed; options from
# the request's parameters: bls_timeout, correlation_id, flags, params (JSON passed on), decoupled.
CALLER = PROLOGUE + textwrap.dedent(
    """
    import os

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                p = json.loads(request.parameters())
                target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0]
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().astype(p.get("dtype", "float32"))
                if p.get("send_pid"):
                    p.setdefault("params", {})["pid"] = os.getpid()
                bls = pb_utils.InferenceRequest(
                    model_name=target.decode(),
                    inputs=[pb_utils.Tensor(p.get("in_name", "INPUT0"), x)],
                    requested_output_names=[p.get("out_name", "OUTPUT0")],
                    timeout=p.get("bls_timeout", 0), correlation_id=p.get("correlation_id", 0),
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
instance_group [{ count: 3, kind: KIND_MODEL }]
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


# Holds each request until the test sets `release` (the gate lives in sys.modules: the server
# runs in the test's process), notes that a request runs, and that one saw its client go.
GATE = PROLOGUE + textwrap.dedent(
    """
    import sys, types
    g = sys.modules.setdefault("bls_test_gate", types.SimpleNamespace(
        running=threading.Event(), release=threading.Event(), cancelled=threading.Event(), params={}))

    class TritonPythonModel:
        def execute(self, requests):
            g.params = json.loads(requests[0].parameters())
            g.running.set()
            for _ in range(1200):
                if g.release.wait(0.05):
                    break
                if all(r.is_cancelled() for r in requests):
                    g.cancelled.set()
                    break
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                    pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
    """
)
GATE_CONFIG = """
name: "gate"
backend: "python"
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
TORCHSCRIPT = """
import torch

class Triple(torch.nn.Module):
    def forward(self, x):
        return x * 3
"""
TORCHSCRIPT_CONFIG = """
name: "ts"
platform: "pytorch_libtorch"
input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""


def save_onnx_doubler(repo: Path) -> None:
    """onnx/1/model.onnx: INPUT0 FP32 [N] -> OUTPUT0 = INPUT0 + INPUT0 (no config.pbtxt); left out
    without onnx and onnxruntime (the test that needs it skips)."""
    try:
        import onnx
        import onnxruntime  # noqa: F401
        from onnx import TensorProto, helper
    except ImportError:
        return

    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"])], "doubler",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "onnx" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "onnx" / "1" / "model.onnx"))


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
    add_model(repo, "gate", GATE, GATE_CONFIG)
    save_onnx_doubler(repo)
    add_model(repo, "caller_workers", CALLER, CALLER_CONFIG.replace('"caller"', '"caller_workers"').replace(
        "count: 3, kind: KIND_MODEL", "count: 2, kind: KIND_CPU"))
    save_torchscript(TORCHSCRIPT, "Triple", repo / "ts" / "1" / "model.pt", tmp_path_factory.mktemp("ts_src"))
    (repo / "ts" / "config.pbtxt").write_text(TORCHSCRIPT_CONFIG)
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


def call(srv: openinfer.Server, model: str, x: np.ndarray, protocol: str = "http", caller: str = "caller",
         **params: object) -> str:
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
    result = c.infer(caller, [name, value], parameters=sent or None)
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


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_to_a_torchscript_model(srv: openinfer.Server, protocol: str) -> None:
    out = call(srv, "ts", np.array([1.0, 2.0], np.float32), protocol, in_name="INPUT__0", out_name="OUTPUT__0")
    assert out == "[3.0, 6.0]"


@pytest.mark.parametrize("caller", ["caller", "caller_workers"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_to_an_onnx_model(srv: openinfer.Server, protocol: str, caller: str) -> None:
    if "onnx" not in srv.models:
        pytest.skip("onnx or onnxruntime is not installed")
    assert call(srv, "onnx", np.array([1.5, -2.0], np.float32), protocol, caller=caller) == "[3.0, -4.0]"


def test_bls_to_a_decoupled_model_without_decoupled_is_tritons_error(srv: openinfer.Server) -> None:
    out = call(srv, "square_int32", np.array([1.0], np.float32), in_name="IN", out_name="OUT")
    assert out == (
        "1:Model square_int32 is using the decoupled. The current BLS request call doesn't support models using the "
        "decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
        "decoupled models.'"
    )


def test_bls_with_a_wrong_input_is_the_responses_error(srv: openinfer.Server) -> None:
    out = call(srv, "echo", np.array([1.0], np.float32), in_name="NOPE")
    assert out.startswith("3:") and "NOPE" in out, out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_passes_parameters_and_correlation_id_on(srv: openinfer.Server, protocol: str) -> None:
    out = call(srv, "echo", np.array([1.0], np.float32), protocol, out_name="SEEN", correlation_id=42, flags=1,
               params={"color": "blue", "n": 3})
    seen = json.loads(eval(out)[0])  # noqa: S307 - the caller's str() of a list of bytes
    assert seen == {"params": {"color": "blue", "n": 3}, "corr": 42, "flags": 1}


def test_bls_timeout_that_expires_in_the_queue(srv: openinfer.Server) -> None:
    import sys

    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(call(srv, "gate", np.array([1.0], np.float32))))
    first.start()
    try:
        wait_for(lambda: "bls_test_gate" in sys.modules and sys.modules["bls_test_gate"].running.is_set(), "gate runs")
        # The gate's one instance is busy: this BLS request waits in its queue past its 1 µs.
        queued = threading.Thread(target=lambda: results.append(call(srv, "gate", np.array([2.0], np.float32),
                                                                     bls_timeout=1)))
        queued.start()
        wait_for(lambda: _pending(srv) > 0, "the timed request queued")
    finally:
        sys.modules["bls_test_gate"].release.set()
    first.join(60)
    queued.join(60)
    gate = sys.modules["bls_test_gate"]
    gate.release.clear()
    gate.running.clear()
    assert "[1.0]" in results
    expired = [r for r in results if r != "[1.0]"]
    assert len(expired) == 1 and expired[0].startswith("4:") and "timeout" in expired[0].lower(), results


def _pending(srv: openinfer.Server, model: str = "gate") -> int:
    """The model's queued requests, from /metrics (nv_inference_pending_request_count)."""
    import requests

    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_a_client_that_goes_away_cancels_the_bls_calls_in_flight(srv: openinfer.Server) -> None:
    import socket
    import sys

    body = json.dumps({"inputs": [{"name": "MODEL", "shape": [1], "datatype": "BYTES", "data": ["gate"]},
                                  {"name": "IN", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/caller/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: "bls_test_gate" in sys.modules and sys.modules["bls_test_gate"].running.is_set(), "gate runs")
    gate = sys.modules["bls_test_gate"]
    try:
        sock.close()  # the caller's client goes: its BLS call to the gate is cancelled
        wait_for(gate.cancelled.is_set, "the gate saw its BLS request cancelled")
    finally:
        gate.release.set()
        wait_for(lambda: _pending(srv) == 0, "the gate idle")
        gate.release.clear()
        gate.running.clear()
        gate.cancelled.clear()
    assert call(srv, "echo", np.array([1.0], np.float32)) == "[2.0]"  # the server serves on


# Model control from a model: OP is load, unload or ready, MODEL the model it acts on; OUT
# is "ready=<bool>" after the operation, or the TritonModelException's message.
CONTROLLER = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                op = pb_utils.get_input_tensor_by_name(r, "OP").as_numpy()[0].decode()
                name = pb_utils.get_input_tensor_by_name(r, "MODEL").as_numpy()[0].decode()
                try:
                    if op == "load":
                        pb_utils.load_model(model_name=name)
                    elif op == "unload":
                        pb_utils.unload_model(model_name=name)
                    text = f"ready={pb_utils.is_model_ready(model_name=name)}"
                except pb_utils.TritonModelException as e:
                    text = str(e)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
            return out
    """
)
CONTROLLER_CONFIG = """
name: "controller"
backend: "python"
input [{ name: "OP", data_type: TYPE_STRING, dims: [ 1 ] }, { name: "MODEL", data_type: TYPE_STRING, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""


def control(srv: openinfer.Server, op: str, model: str, protocol: str = "http") -> str:
    if protocol == "http":
        import tritonclient.http as client

        c = triton_http(srv)
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]

        c = triton_grpc(srv)
    tensors = []
    for name, value in (("OP", op), ("MODEL", model)):
        t = client.InferInput(name, [1], "BYTES")
        t.set_data_from_numpy(np.array([value.encode()], np.object_))
        tensors.append(t)
    return c.infer("controller", tensors).as_numpy("OUT")[0].decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_unload_is_model_ready_from_a_model_under_explicit_control(
    tmp_path: Path, protocol: str
) -> None:
    add_model(tmp_path, "controller", CONTROLLER, CONTROLLER_CONFIG)
    add_model(tmp_path, "echo", ECHO, ECHO_CONFIG)
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=2, log=False,
                             model_control_mode="explicit", load_models=["controller"])
    try:
        assert control(server, "ready", "echo", protocol) == "ready=False"
        assert control(server, "load", "echo", protocol) == "ready=True"
        assert triton_http(server).is_model_ready("echo")
        assert call_echo(server) == [4.0]
        assert control(server, "unload", "echo", protocol) == "ready=False"
        assert not triton_http(server).is_model_ready("echo")
        assert control(server, "load", "nothere", protocol).startswith("failed to load 'nothere'")
    finally:
        server.stop()


def test_load_model_from_a_model_without_explicit_control_is_refused(tmp_path: Path) -> None:
    add_model(tmp_path, "controller", CONTROLLER, CONTROLLER_CONFIG)
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        assert control(server, "load", "echo") == "explicit model load / unload is not allowed if polling is enabled"
    finally:
        server.stop()


def call_echo(srv: openinfer.Server) -> list[float]:
    import tritonclient.http as client

    t = client.InferInput("INPUT0", [1], "FP32")
    t.set_data_from_numpy(np.array([2.0], np.float32))
    return triton_http(srv).infer("echo", [t]).as_numpy("OUTPUT0").tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_from_worker_processes_over_the_process_wire(srv: openinfer.Server, protocol: str) -> None:
    def worker(model: str, x: list[float], **params: object) -> str:
        return call(srv, model, np.array(x, np.float32), protocol, caller="caller_workers", **params)

    assert worker("echo", [1.0, 2.5]) == "[2.0, 5.0]"
    assert worker("ens", [1.0]) == "[4.0]"
    assert worker("ts", [1.0, 2.0], in_name="INPUT__0", out_name="OUTPUT__0") == "[3.0, 6.0]"
    assert worker("nothere", [1.0]) == "2:Request for unknown model: 'nothere' is not found"
    assert worker("echo", [-1.0]).startswith("1:Failed to process the request(s) for model 'echo_0', message: "
                                             "ValueError: negative input")
    assert worker("square_int32", [1.0], in_name="IN", out_name="OUT").startswith("1:Model square_int32 is using "
                                                                                   "the decoupled.")
    seen = json.loads(eval(worker("echo", [1.0], out_name="SEEN", correlation_id=7, params={"k": "v"}))[0])  # noqa: S307
    assert seen == {"params": {"k": "v"}, "corr": 7, "flags": 0}


def test_bls_decoupled_from_worker_processes(srv: openinfer.Server) -> None:
    out = call(srv, "square_int32", np.array([3.0], np.float32), caller="caller_workers", in_name="IN",
               out_name="OUT", dtype="int32", decoupled=True)
    assert out == "[[3], [3], [3]]"


def test_a_worker_killed_during_bls_fails_only_its_own_request(srv: openinfer.Server) -> None:
    import os
    import signal
    import sys

    from tritonclient.utils import InferenceServerException

    failed: list[BaseException] = []

    def held() -> None:
        try:
            call(srv, "gate", np.array([1.0], np.float32), caller="caller_workers", send_pid=True)
        except InferenceServerException as e:
            failed.append(e)

    first = threading.Thread(target=held)
    first.start()
    wait_for(lambda: "bls_test_gate" in sys.modules and sys.modules["bls_test_gate"].running.is_set(), "gate runs")
    gate = sys.modules["bls_test_gate"]
    try:
        pid = gate.params["pid"]
        # The other worker serves on meanwhile.
        assert call(srv, "echo", np.array([1.0], np.float32), caller="caller_workers") == "[2.0]"
        os.kill(pid, signal.SIGKILL)
        wait_for(gate.cancelled.is_set, "the killed worker's BLS request cancelled")
        first.join(60)
        assert len(failed) == 1 and f"(pid {pid})" in str(failed[0]), failed
    finally:
        gate.release.set()
        first.join(60)
        wait_for(lambda: _pending(srv) == 0, "the gate idle")
        gate.release.clear()
        gate.running.clear()
        gate.cancelled.clear()
    assert call(srv, "echo", np.array([3.0], np.float32), caller="caller_workers") == "[6.0]"
