"""The requests of one dynamic batch of a Triton Python model stay apart as in Triton: each has its
own ``parameters()`` (requests with different parameters share a batch, as Triton batches them),
and an error response fails only its own request, in the server process and in worker processes,
over HTTP and gRPC."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer

from conftest import wait_for
from test_triton_python_backend import PROLOGUE, add_model
from test_triton_python_batching import held, pending

# IN == -1 holds execute (bounded) until the gate file exists, so that later requests queue and
# form one batch. Each request answers with its rows times its own "scale" parameter, its
# parameters as it saw them, and how many requests its execute call got; a "fail" parameter
# makes its response an error with that text and its row count (and code, when "code" names one).
MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if x[0, 0] == -1:
                    with open(os.environ["PYB_GATE"] + ".held", "a") as f:
                        f.write("held\\n")
                    end = time.monotonic() + 60
                    while not os.path.exists(os.environ["PYB_GATE"]) and time.monotonic() < end:
                        time.sleep(0.01)
                params = json.loads(request.parameters())
                if "fail" in params:
                    code = getattr(pb_utils.TritonError, params.get("code", "INVALID_ARG"))
                    text = f"{params['fail']} ({x.shape[0]} rows)"
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(text, code)))
                    continue
                rows = x.shape[0]
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", x * params.get("scale", 1)),
                    pb_utils.Tensor("P", np.array([[request.parameters().encode()]] * rows, np.object_)),
                    pb_utils.Tensor("N", np.full((rows, 1), len(requests), np.int32)),
                ]))
            return responses
    """
)
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ }}
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "P", data_type: TYPE_STRING, dims: [ 1 ] }}]
output [{{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, file_gate: Path) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_batch_requests")
    add_model(repo, "apart", MODEL, CONFIG.format(name="apart", count=1))
    add_model(repo, "apart_workers", MODEL, CONFIG.format(name="apart_workers", count=2))
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def over_http(srv: openinfer.Server, model: str, value: float, rows: int, params: dict[str, Any]) -> Any:
    """One request over HTTP JSON: (status, outputs by name or the error text)."""
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [rows, 1], "data": [value] * rows}],
            "parameters": params}
    answer = requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=120)
    if answer.status_code != 200:
        return answer.status_code, answer.json()["error"]
    return 200, {o["name"]: o["data"] for o in answer.json()["outputs"]}


def over_grpc(srv: openinfer.Server, model: str, value: float, rows: int, params: dict[str, Any]) -> Any:
    """The same over tritonclient gRPC (a client of its own: one per thread)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        x = grpcclient.InferInput("IN", [rows, 1], "FP32")
        x.set_data_from_numpy(np.full((rows, 1), value, np.float32))
        try:
            result = client.infer(model, [x], parameters=params, client_timeout=120)
        except InferenceServerException as e:
            return e.status(), e.message()
        return 200, {name: result.as_numpy(name).reshape(-1).tolist() for name in ("OUT", "P", "N")}
    finally:
        client.close()


@pytest.mark.parametrize("model, blockers", [("apart", 1), ("apart_workers", 2)])
def test_each_request_of_a_batch_has_its_own_parameters_and_errors(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    file_gate.unlink(missing_ok=True)
    Path(str(file_gate) + ".held").unlink(missing_ok=True)
    queued_params: list[tuple[Any, dict[str, Any]]] = [
        (over_http, {"scale": 2}),
        (over_http, {"fail": "row one is bad"}),
        (over_grpc, {"scale": 5}),
        (over_grpc, {"fail": "row three is missing", "code": "NOT_FOUND"}),
    ]
    with ThreadPoolExecutor(blockers + len(queued_params)) as pool:
        holding = []
        for i in range(blockers):  # one at a time, so that each holds an instance of its own
            holding.append(pool.submit(over_http, srv, model, -1, 1, {}))
            wait_for(lambda: held(file_gate) == i + 1, "a request held in execute")
        # 1 + 2 + 3 + 1 rows: within max_batch_size 8, so one batch
        queued = [pool.submit(send, srv, model, float(k + 1), 1 if k == 3 else k + 1, params)
                  for k, (send, params) in enumerate(queued_params)]
        wait_for(lambda: pending(srv, model) == len(queued), "the requests queued behind the held ones")
        file_gate.touch()
        answers = [f.result(timeout=120) for f in queued]
        for f in holding:
            assert f.result(timeout=120)[0] == 200
    (s0, a0), (s1, a1), (s2, a2), (s3, a3) = answers
    assert s0 == 200 and a0["OUT"] == [2.0] and json.loads(a0["P"][0]) == {"scale": 2}
    assert (s1, a1) == (400, "row one is bad (2 rows)")
    assert s2 == 200 and a2["OUT"] == [15.0, 15.0, 15.0]
    assert [json.loads(p) for p in a2["P"]] == [{"scale": 5}] * 3
    assert s3 in ("StatusCode.NOT_FOUND", 404) and a3 == "row three is missing (1 rows)"
    assert a0["N"] == [4] and a2["N"] == [4] * 3  # all four reached one execute call


@pytest.mark.parametrize("model, blockers", [("apart", 1), ("apart_workers", 2)])
def test_every_request_of_a_batch_failing_gets_its_own_error(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    file_gate.unlink(missing_ok=True)
    Path(str(file_gate) + ".held").unlink(missing_ok=True)
    with ThreadPoolExecutor(blockers + 2) as pool:
        holding = []
        for i in range(blockers):
            holding.append(pool.submit(over_http, srv, model, -1, 1, {}))
            wait_for(lambda: held(file_gate) == i + 1, "a request held in execute")
        # the same parameters: they batch together on any server
        queued = [pool.submit(over_http, srv, model, 1.0, rows, {"fail": "bad", "code": "UNAVAILABLE"})
                  for rows in (1, 2)]
        wait_for(lambda: pending(srv, model) == 2, "two requests queued behind the held ones")
        file_gate.touch()
        answers = [f.result(timeout=120) for f in queued]
        for f in holding:
            assert f.result(timeout=120)[0] == 200
    assert answers == [(503, "bad (1 rows)"), (503, "bad (2 rows)")]
