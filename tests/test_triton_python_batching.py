"""Dynamic batching of a Triton Python model as Triton does it: execute(requests) gets the requests
of a batch apart (each its own rows and request id), in the server process and in worker
processes, and each client gets its own request's response."""

from __future__ import annotations

import gc
import re
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

import openinfer

from conftest import wait_for
from test_triton_python_backend import PROLOGUE, add_model

# A model's execute, for each request (in place of the line HOLD in its code): its IN as `x`,
# held (bounded) until the gate file exists when IN is -1 (each hold noted), so that the requests
# sent meanwhile queue up and form one batch.
HOLD = textwrap.dedent(
    """
    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    if x[0, 0] == -1:
        with open(os.environ["PYB_GATE"] + ".held", "a") as f:
            f.write("held\\n")
        end = time.monotonic() + 60
        while not os.path.exists(os.environ["PYB_GATE"]) and time.monotonic() < end:
            time.sleep(0.01)
    rows = x.shape[0]
    """
)


def holding(model_py: str) -> str:
    """`model_py` with its line HOLD replaced by `HOLD`, indented as that line is."""
    indent = model_py[: model_py.index("HOLD")].rsplit("\n", 1)[1]
    return model_py.replace(indent + "HOLD\n", textwrap.indent(HOLD.strip("\n"), indent) + "\n")


# Each request answers with how many requests its execute call got, and its own request id, on
# each of its rows.
MODEL = PROLOGUE + holding(textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                HOLD
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("N", np.full((rows, 1), len(requests), np.int32)),
                    pb_utils.Tensor("ID", np.array([[request.request_id().encode()]] * rows, np.object_)),
                    pb_utils.Tensor("OUT", x * 2),
                ]))
            return responses
    """
))  # fmt: skip
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ }}
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }}]
output [{{ name: "ID", data_type: TYPE_STRING, dims: [ 1 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, file_gate: Path) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_batching")
    add_model(repo, "batched", MODEL, CONFIG.format(name="batched", count=1))
    add_model(repo, "batched_workers", MODEL, CONFIG.format(name="batched_workers", count=2))
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def pending(srv: openinfer.Server, model: str) -> int:
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30).text
    m = re.search(rf'nv_inference_pending_request_count{{model="{model}",version="1"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def infer(srv: openinfer.Server, model: str, value: float, rows: int, request_id: str) -> tuple[list, list, list]:
    """One request over HTTP JSON (thread-safe, unlike a tritonclient shared across threads)."""
    body = {"id": request_id, "inputs": [{"name": "IN", "datatype": "FP32", "shape": [rows, 1], "data": [value] * rows}]}
    answer = requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["id"] == request_id
    outs = {o["name"]: o["data"] for o in got["outputs"]}
    return outs["N"], outs["ID"], outs["OUT"]


def held(file_gate: Path) -> int:
    marker = Path(str(file_gate) + ".held")
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def queued_batch(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int, infer: Callable[..., Any]
) -> list[Any]:
    """Holds `blockers` requests in execute (`HOLD`; one per instance), queues three behind them
    (request k: k + 1 rows of k + 1, id qk), then opens the gate: the three's answers, each
    infer(srv, model, value, rows, request_id)."""
    file_gate.unlink(missing_ok=True)
    Path(str(file_gate) + ".held").unlink(missing_ok=True)
    gc.collect()  # earlier tests' tritonclients go here, not in a pool thread (their gevent hub is this thread's)
    with ThreadPoolExecutor(blockers + 3) as pool:
        holding = []
        for i in range(blockers):  # one at a time, so that each holds an instance of its own
            holding.append(pool.submit(infer, srv, model, -1, 1, f"h{90 + i}"))
            wait_for(lambda: held(file_gate) == i + 1, "a request held in execute")
        queued = [pool.submit(infer, srv, model, float(k + 1), k + 1, f"q{k}") for k in range(3)]
        wait_for(lambda: pending(srv, model) == 3, "three requests queued behind the held ones")
        file_gate.touch()
        answers = [f.result(timeout=120) for f in queued]
        for f in holding:
            f.result(timeout=120)
    return answers


@pytest.mark.parametrize("model, blockers", [("batched", 1), ("batched_workers", 2)])
def test_execute_gets_the_requests_of_a_batch_apart(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    answers = queued_batch(srv, file_gate, model, blockers, infer)
    for k, (n, ids, out) in enumerate(answers):
        assert ids == [f"q{k}"] * (k + 1)  # each client its own request's rows and id
        assert out == [2.0 * (k + 1)] * (k + 1)
        assert len(set(n)) == 1
    assert max(a[0][0] for a in answers) >= 2  # the queued requests reached execute together
