"""Decoupled Triton Python models (response senders, from execute and from threads after it) and
instance_group counts (one TritonPythonModel per instance, in worker processes when more than
one): python_backend's decoupled repeat and square examples with their own gRPC streaming clients,
and Triton's errors for a send after the final flag and a decoupled execute that returns."""

from __future__ import annotations

import os
import queue
import signal
import textwrap
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http, wait_for, worker_children
from test_triton_python_backend import EXAMPLES, PROLOGUE, add_model, example, run_client

SENDS_CONFIG = """
name: "{name}"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [{{ name: "IN", data_type: TYPE_INT32, dims: [ -1 ] }}]
output [{{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }}]
"""

# Sends one response per element of IN from execute itself, then the final flag, then (asked
# by IN[0] == -1) once more: the late send's error is the last response's payload.
SENDS_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                for v in values[1:]:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], np.int32))]))
                if values[0] == -1:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    try:
                        sender.send(pb_utils.InferenceResponse([]))
                    except pb_utils.TritonModelException as e:
                        print("LATE SEND:", e, flush=True)
                        with open(__import__("os").environ["PYB_LATE"], "w") as f:
                            f.write(str(e))
                else:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
)

RETURNS_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.int32))]) for _ in requests]
    """
)

# Two instances (worker processes): each answers with its pid; a thread it starts after execute
# returned sends the response.
PIDS_CONFIG = """
name: "pids"
backend: "python"
model_transaction_policy { decoupled: true }
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT64, dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU, count: 2 }]
"""
PIDS_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_instance_name"]

        def execute(self, requests):
            for request in requests:
                wait = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                if wait > 10000:  # the kill test's request: say which worker holds it
                    with open(os.environ["PYB_HELD"], "w") as f:
                        f.write(str(os.getpid()))
                threading.Thread(target=self.answer, args=(request.get_response_sender(), wait)).start()
            return None

        def answer(self, sender, wait):
            time.sleep(wait / 1000)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()], np.int64))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
)


@pytest.fixture(scope="module")
def late(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("late") / "late.txt"
    mp = pytest.MonkeyPatch()
    mp.setenv("PYB_LATE", str(path))
    mp.setenv("PYB_HELD", str(path.parent / "held.txt"))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, late: Path) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_decoupled")
    example(repo, "repeat_int32", "decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt")
    example(repo, "square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    add_model(repo, "sends", SENDS_MODEL, SENDS_CONFIG.format(name="sends"))
    add_model(repo, "returns", RETURNS_MODEL, SENDS_CONFIG.format(name="returns"))
    add_model(repo, "pids", PIDS_MODEL, PIDS_CONFIG)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def test_repeat_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    assert "PASS: repeat_int32" in run_client(srv, EXAMPLES / "decoupled" / "repeat_client.py")


def test_square_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    assert "PASS: square_int32" in run_client(srv, EXAMPLES / "decoupled" / "square_client.py")


def stream(srv: openinfer.Server, model: str, values: list[int], dtype: str = "INT32") -> list[object]:
    """Every response (or error) of one streamed request, until the stream's final one."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue[object] = queue.Queue()
    client = triton_grpc(srv)
    client.start_stream(callback=lambda result, error: got.put(error if error is not None else result))
    tensor = grpcclient.InferInput("IN", [len(values)], dtype)
    tensor.set_data_from_numpy(np.array(values, np.int32))
    client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
    items = []
    while True:
        item = got.get(timeout=60)
        items.append(item)
        if not hasattr(item, "get_response") or item.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    return items


def test_sends_from_execute_then_final(srv: openinfer.Server) -> None:
    items = stream(srv, "sends", [0, 7, 8, 9])
    outs = [int(i.as_numpy("OUT")[0]) for i in items[:-1]]  # type: ignore[attr-defined]
    assert outs == [7, 8, 9]


def test_send_after_final_is_refused(srv: openinfer.Server, late: Path) -> None:
    items = stream(srv, "sends", [-1, 5])
    assert [int(i.as_numpy("OUT")[0]) for i in items[:-1]] == [5]  # type: ignore[attr-defined]
    wait_for(late.exists, "the model's late send")
    assert late.read_text() == "Unable to send response. Response sender has been closed."


def test_decoupled_execute_returning_responses_fails_as_triton_says(srv: openinfer.Server) -> None:
    from tritonclient.utils import InferenceServerException

    items = stream(srv, "returns", [1])
    assert isinstance(items[-1], InferenceServerException)
    assert items[-1].message() == (
        "Failed to process the request(s) for model 'returns_0', message: Python model 'returns_0' is using "
        "the decoupled mode and the execute function must return None."
    )
    assert triton_http(srv).is_model_ready("returns")


def _pid(srv: openinfer.Server, wait_ms: int) -> int:
    items = stream(srv, "pids", [wait_ms])
    return int(items[0].as_numpy("OUT")[0])  # type: ignore[attr-defined]


def test_instances_are_worker_processes_with_senders(srv: openinfer.Server) -> None:
    workers = worker_children()
    assert len(workers) >= 2
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # concurrent requests spread over both instances
        pids = set(pool.map(partial(_pid, srv), [300] * 4))
    assert pids <= workers and len(pids) == 2


def test_killed_instance_fails_its_request_and_is_replaced(srv: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient

    before = worker_children()
    got: queue.Queue[object] = queue.Queue()
    client = triton_grpc(srv)
    client.start_stream(callback=lambda result, error: got.put(error if error is not None else result))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([60_000], np.int32))  # answers after a minute: killed first
    client.async_stream_infer("pids", [tensor])
    held = Path(os.environ["PYB_HELD"])
    wait_for(held.exists, "the request held by a worker")
    wait_for(lambda: held.read_text() != "", "the worker's pid")
    victim = int(held.read_text())
    assert victim in before
    os.kill(victim, signal.SIGKILL)
    error = got.get(timeout=60)
    from tritonclient.utils import InferenceServerException

    assert isinstance(error, InferenceServerException), error
    client.stop_stream()
    wait_for(lambda: victim not in worker_children() and len(worker_children()) >= 2, "a replacement worker")
    assert _pid(srv, 0) in worker_children()
