"""The requests of one dynamic batch of a Triton Python model stay apart as in Triton: each has its
own ``parameters()`` (requests with different parameters share a batch, as Triton batches them),
an error response fails only its own request, and each response's parameters reach its own
client, in the server process and in worker processes, over HTTP and gRPC."""

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
from test_triton_python_batching import held, holding, pending

# IN == -1 holds execute (bounded: HOLD) until the gate file exists, so that later requests queue
# and form one batch. Each request answers with its rows times its own "scale" parameter, its
# parameters as it saw them, and how many requests its execute call got, with response parameters
# naming its "tag" and row count; a "fail" parameter makes its response an error with that text
# and its row count (and code, when "code" names one).
MODEL = PROLOGUE + holding(textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                HOLD
                params = json.loads(request.parameters())
                if "fail" in params:
                    code = getattr(pb_utils.TritonError, params.get("code", "INVALID_ARG"))
                    text = f"{params['fail']} ({x.shape[0]} rows)"
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(text, code)))
                    continue
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", x * params.get("scale", 1)),
                    pb_utils.Tensor("P", np.array([[request.parameters().encode()]] * rows, np.object_)),
                    pb_utils.Tensor("N", np.full((rows, 1), len(requests), np.int32)),
                ], parameters={"tag": params.get("tag", ""), "rows": rows}))
            return responses
    """
))  # fmt: skip
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
    """One request over HTTP JSON: (status, outputs by name, and the response's parameters as
    "parameters", or the error text)."""
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [rows, 1], "data": [value] * rows}],
            "parameters": params}
    answer = requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=120)
    if answer.status_code != 200:
        return answer.status_code, answer.json()["error"]
    return 200, {**{o["name"]: o["data"] for o in answer.json()["outputs"]},
                 "parameters": answer.json().get("parameters")}


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
        given = result.get_response().parameters
        return 200, {**{name: result.as_numpy(name).reshape(-1).tolist() for name in ("OUT", "P", "N")},
                     "parameters": {key: getattr(p, p.WhichOneof("parameter_choice")) for key, p in given.items()}}
    finally:
        client.close()


def in_one_batch(srv: openinfer.Server, file_gate: Path, model: str, blockers: int,
                 queued: list[tuple[Any, float, int, dict[str, Any]]]) -> list[Any]:
    """The answers to `queued` requests ((send, value, rows, parameters), within max_batch_size
    8 rows together), sent while `blockers` requests hold every instance of `model`, so that
    they queue and run as one batch once the gate opens."""
    file_gate.unlink(missing_ok=True)
    Path(str(file_gate) + ".held").unlink(missing_ok=True)
    with ThreadPoolExecutor(blockers + len(queued)) as pool:
        holding = []
        for i in range(blockers):  # one at a time, so that each holds an instance of its own
            holding.append(pool.submit(over_http, srv, model, -1, 1, {}))
            wait_for(lambda: held(file_gate) == i + 1, "a request held in execute")
        sent = [pool.submit(send, srv, model, value, rows, params) for send, value, rows, params in queued]
        wait_for(lambda: pending(srv, model) == len(queued), "the requests queued behind the held ones")
        file_gate.touch()
        answers = [f.result(timeout=120) for f in sent]
        for f in holding:
            assert f.result(timeout=120)[0] == 200
    return answers


@pytest.mark.parametrize("model, blockers", [("apart", 1), ("apart_workers", 2)])
def test_each_request_of_a_batch_has_its_own_parameters_and_errors(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    answers = in_one_batch(srv, file_gate, model, blockers, [
        (over_http, 1.0, 1, {"scale": 2}),
        (over_http, 2.0, 2, {"fail": "row one is bad"}),
        (over_grpc, 3.0, 3, {"scale": 5}),
        (over_grpc, 4.0, 1, {"fail": "row three is missing", "code": "NOT_FOUND"}),
    ])
    (s0, a0), (s1, a1), (s2, a2), (s3, a3) = answers
    assert s0 == 200 and a0["OUT"] == [2.0] and json.loads(a0["P"][0]) == {"scale": 2}
    assert (s1, a1) == (400, "row one is bad (2 rows)")
    assert s2 == 200 and a2["OUT"] == [15.0, 15.0, 15.0]
    assert [json.loads(p) for p in a2["P"]] == [{"scale": 5}] * 3
    assert s3 in ("StatusCode.NOT_FOUND", 404) and a3 == "row three is missing (1 rows)"
    assert a0["N"] == [4] and a2["N"] == [4] * 3  # all four reached one execute call


@pytest.mark.parametrize("model, blockers", [("apart", 1), ("apart_workers", 2)])
def test_each_response_of_a_batch_carries_its_own_parameters(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    long_tag = "t" * 20000  # past one message between a worker and the server
    answers = in_one_batch(srv, file_gate, model, blockers, [
        (over_http, 1.0, 1, {"tag": "first"}),
        (over_grpc, 1.0, 3, {"tag": "second"}),
        (over_http, 1.0, 2, {"fail": "no parameters for an error"}),
        (over_grpc, 1.0, 2, {"tag": long_tag}),
    ])
    assert [status for status, _ in answers] == [200, 200, 400, 200]
    assert [a["N"][0] for status, a in answers if status == 200] == [4, 4, 4]  # one execute call
    assert answers[0][1]["parameters"] == {"tag": "first", "rows": 1}
    assert answers[1][1]["parameters"] == {"tag": "second", "rows": 3}
    assert answers[3][1]["parameters"] == {"tag": long_tag, "rows": 2}


@pytest.mark.parametrize("model, blockers", [("apart", 1), ("apart_workers", 2)])
def test_every_request_of_a_batch_failing_gets_its_own_error(
    srv: openinfer.Server, file_gate: Path, model: str, blockers: int
) -> None:
    # the same parameters: they batch together on any server
    fail = {"fail": "bad", "code": "UNAVAILABLE"}
    answers = in_one_batch(srv, file_gate, model, blockers, [(over_http, 1.0, 1, fail), (over_http, 1.0, 2, fail)])
    assert answers == [(503, "bad (1 rows)"), (503, "bad (2 rows)")]
