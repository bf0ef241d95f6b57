"""Decoupled models as ensemble steps, as Triton's ensemble scheduler runs them: every response
of a decoupled step is a new request to the steps after it, each complete set of the ensemble's
outputs one response of the (then decoupled) ensemble over a gRPC stream (the final flag once
every step is done: none lost, no hang, zero responses allowed) and over HTTP generate_stream;
steps whose inputs come from different decoupled steps refused at load; and
`max_inflight_requests` holding a decoupled step that answers faster than the step after it."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

BOUND = 30.0  # a bound for a hung test, not a measurement


class Producer:
    """A decoupled model: N[0] responses X + k, counting those it has produced and the runs
    that have ended (all sent, or stopped by the server)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.produced = 0
        self.ended = 0

    def fn(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        try:
            for k in range(int(inputs["N"][0])):
                with self.cond:
                    self.produced += 1
                    self.cond.notify_all()
                yield {"Y": inputs["X"] + k}
        finally:
            with self.cond:
                self.ended += 1
                self.cond.notify_all()

    def wait_for(self, n: int) -> int:
        with self.cond:
            self.cond.wait_for(lambda: self.produced >= n, timeout=BOUND)
            return self.produced

    def wait_ended(self, n: int) -> int:
        with self.cond:
            self.cond.wait_for(lambda: self.ended >= n, timeout=BOUND)
            return self.ended


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def _ensemble(repo: Path, name: str, steps: list[str], scheduling: str = "", extra: str = "",
              with_n: bool = True) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        + 'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }\n'
        + ('input { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }\n' if with_n else "")
        + 'output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }\n'
        + f'{extra}\nensemble_scheduling {{ {scheduling} step [ {", ".join(steps)} ] }}\n'
    )


class Ticker:
    """A decoupled model that answers every 5 ms until it is stopped (or BOUND)."""

    def __init__(self) -> None:
        self.produced = threading.Event()
        self.closed = threading.Event()

    def fn(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        try:
            for k in range(int(BOUND / 0.005)):
                self.produced.set()
                yield {"Y": inputs["X"] + k}
                time.sleep(0.005)
        except GeneratorExit:
            self.closed.set()
            raise


def _halfway(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    yield {"Y": inputs["X"]}
    yield {"Y": inputs["X"] + 1}
    raise ValueError("the producer gave up half way")


@pytest.fixture(scope="module")
def ticker() -> Ticker:
    return Ticker()


@pytest.fixture(scope="module")
def producer() -> Producer:
    return Producer()


@pytest.fixture(scope="module")
def gate() -> threading.Event:
    return threading.Event()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, producer: Producer, gate: threading.Event,
        ticker: Ticker) -> Iterator[openinfer.Server]:
    vec = [Tensor("X", "FP32", [4])]

    def gated(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        gate.wait(BOUND)
        return {"Y": inputs["X"]}

    models = [
        Model("producer", producer.fn, inputs=[*vec, Tensor("N", "INT32", [1])], outputs=[Tensor("Y", "FP32", [4])],
              decoupled=True),
        Model("ticker", ticker.fn, inputs=[*vec, Tensor("N", "INT32", [1])], outputs=[Tensor("Y", "FP32", [4])],
              decoupled=True),
        Model("halfway", _halfway, inputs=[*vec, Tensor("N", "INT32", [1])], outputs=[Tensor("Y", "FP32", [4])],
              decoupled=True),
        Model("double", lambda i: {"Y": i["X"] * 2}, inputs=vec, outputs=[Tensor("Y", "FP32", [4])]),
        Model("gated", gated, inputs=vec, outputs=[Tensor("Y", "FP32", [4])]),
        Model("add", lambda i: {"SUM": i["A"] + i["B"]}, inputs=[Tensor("A", "FP32", [4]), Tensor("B", "FP32", [4])],
              outputs=[Tensor("SUM", "FP32", [4])]),
    ]
    fan_out = _step("producer", {"X": "IN", "N": "N"}, {"Y": "t"})
    repo = tmp_path_factory.mktemp("decoupled_ensembles")
    # IN -> producer (N responses IN + k) -> double -> OUT: N answers 2 (IN + k).
    _ensemble(repo, "fan", [fan_out, _step("double", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(repo, "fan_limited", [fan_out, _step("gated", {"X": "t"}, {"Y": "OUT"})],
              scheduling="max_inflight_requests: 1")
    _ensemble(repo, "fan_unlimited", [fan_out, _step("gated", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(repo, "ticking", [_step("ticker", {"X": "IN", "N": "N"}, {"Y": "t"}),
                                _step("double", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(repo, "failing", [_step("halfway", {"X": "IN", "N": "N"}, {"Y": "t"}),
                                _step("double", {"X": "t"}, {"Y": "OUT"})])
    # Says it is decoupled, but no step is: Triton serves it as not decoupled.
    _ensemble(repo, "says_decoupled", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("add", {"A": "t", "B": "t"},
              {"SUM": "OUT"})], extra="model_transaction_policy { decoupled: true }", with_n=False)
    # add reads a response of producer and the request's IN: Triton refuses the graph.
    _ensemble(repo, "mixed", [fan_out, _step("add", {"A": "t", "B": "IN"}, {"SUM": "OUT"})])
    s = openinfer.serve(repo, models=models, http_port=0, grpc_port=0, log=False, threads=2)
    try:
        yield s
    finally:
        gate.set()
        s.stop()


def _inputs(x: np.ndarray, n: int) -> list[tgrpc.InferInput]:
    i = tgrpc.InferInput("IN", [4], "FP32")
    i.set_data_from_numpy(x)
    c = tgrpc.InferInput("N", [1], "INT32")
    c.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [i, c]


class Stream:
    """A tritonclient gRPC stream whose results (or errors) land in a queue."""

    def __init__(self, srv: openinfer.Server) -> None:
        self.results: queue.Queue[Any] = queue.Queue()
        self.client = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        self.client.start_stream(callback=lambda result, error: self.results.put(error if error else result))

    def send(self, model: str, x: np.ndarray, n: int) -> None:
        self.client.async_stream_infer(model, _inputs(x, n), enable_empty_final_response=True)

    def until_final(self) -> list[Any]:
        """The responses up to the final one (included)."""
        got = []
        while True:
            r = self.results.get(timeout=BOUND)
            assert not isinstance(r, InferenceServerException), r
            got.append(r)
            if r.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(srv: openinfer.Server) -> Iterator[Stream]:
    s = Stream(srv)
    yield s
    s.close()


@pytest.mark.parametrize("n", [1, 5])
def test_each_response_of_a_decoupled_step_is_one_answer(stream: Stream, n: int) -> None:
    x = np.arange(4, dtype=np.float32)
    stream.send("fan", x, n)
    got = stream.until_final()
    answers = [r.as_numpy("OUT") for r in got if r.as_numpy("OUT") is not None]
    assert len(answers) == n
    for k, out in enumerate(answers):  # in the order the producer answered
        np.testing.assert_array_equal(out, 2 * (x + k))
    # The final flag comes alone, after the last answer, once every step is done.
    assert len(got) == n + 1 and got[-1].as_numpy("OUT") is None


def test_no_response_of_the_decoupled_step_ends_the_stream_cleanly(stream: Stream) -> None:
    stream.send("fan", np.zeros(4, dtype=np.float32), 0)
    got = stream.until_final()
    assert len(got) == 1 and got[0].as_numpy("OUT") is None
    # The stream still serves.
    stream.send("fan", np.ones(4, dtype=np.float32), 2)
    assert len(stream.until_final()) == 3


def test_requests_interleaved_on_one_stream(stream: Stream) -> None:
    for j in range(4):
        stream.send("fan", np.full(4, j, dtype=np.float32), 3)
    finals, answers = 0, []
    while finals < 4:
        r = stream.results.get(timeout=BOUND)
        assert not isinstance(r, InferenceServerException), r
        finals += r.get_response().parameters["triton_final_response"].bool_param
        if r.as_numpy("OUT") is not None:
            answers.append(float(r.as_numpy("OUT")[0]))
    assert sorted(answers) == sorted(2.0 * (j + k) for j in range(4) for k in range(3))


def test_unary_infer_on_a_decoupled_ensemble_is_refused(srv: openinfer.Server) -> None:
    x = np.zeros(4, dtype=np.float32)
    with thttp.InferenceServerClient(srv.url.split("//")[1], network_timeout=BOUND) as http:
        i = thttp.InferInput("IN", [4], "FP32")
        i.set_data_from_numpy(x)
        c = thttp.InferInput("N", [1], "INT32")
        c.set_data_from_numpy(np.array([1], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="decoupled"):
            http.infer("fan", [i, c])
    with tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}") as grpc:
        with pytest.raises(InferenceServerException, match="decoupled"):
            grpc.infer("fan", _inputs(x, 1))


def test_inputs_of_mixed_decoupled_origin_are_refused_at_load(srv: openinfer.Server) -> None:
    with thttp.InferenceServerClient(srv.url.split("//")[1], network_timeout=BOUND) as http:
        assert not http.is_model_ready("mixed")
        reason = {m["name"]: m.get("reason", "") for m in http.get_model_repository_index()}["mixed"]
    assert "in ensemble mixed, step of model 'add' receives inputs originated from different decoupled models" in reason


@pytest.mark.parametrize("model, held_at", [("fan_limited", 2), ("fan_unlimited", 5)])
def test_max_inflight_requests_holds_the_decoupled_step(stream: Stream, producer: Producer, gate: threading.Event,
                                                        model: str, held_at: int) -> None:
    """With max_inflight_requests: 1 and the next step held, the producer's second response
    waits for a slot (so it makes no third); without the limit it makes all five."""
    gate.clear()
    before = producer.produced
    stream.send(model, np.zeros(4, dtype=np.float32), 5)
    assert producer.wait_for(before + held_at) == before + held_at
    time.sleep(0.5)  # time for a producer that is not held to go on
    assert producer.produced == before + held_at
    gate.set()
    got = stream.until_final()
    assert len(got) == 6 and producer.produced == before + 5


def test_a_failing_decoupled_step_ends_the_stream_with_its_error(stream: Stream) -> None:
    """The answers complete before the step failed arrive (how many depends on how far the
    steps after it got: Triton makes none after a failure), then the error naming the step
    with Triton's ensemble prefix; the stream serves on."""
    stream.send("failing", np.zeros(4, dtype=np.float32), 1)
    answers = []
    while not isinstance(r := stream.results.get(timeout=BOUND), InferenceServerException):
        answers.append(float(r.as_numpy("OUT")[0]))
    assert answers == [0.0, 2.0][:len(answers)]
    assert "in ensemble 'failing', step 0 (model 'halfway')" in r.message(), r.message()
    assert "the producer gave up half way" in r.message()
    stream.send("fan", np.ones(4, dtype=np.float32), 2)
    assert len(stream.until_final()) == 3


def test_closing_the_stream_stops_the_decoupled_step(srv: openinfer.Server, ticker: Ticker) -> None:
    s = Stream(srv)
    try:
        s.send("ticking", np.zeros(4, dtype=np.float32), 1)
        assert not isinstance(s.results.get(timeout=BOUND), InferenceServerException)
    finally:
        s.close(cancel=True)  # the stream is cancelled, not just closed for writing
    assert ticker.closed.wait(BOUND), "the decoupled step ran on after its client went"
    ticker.closed.clear()
    again = Stream(srv)  # the server serves the ensemble on
    try:
        again.send("ticking", np.zeros(4, dtype=np.float32), 1)
        assert not isinstance(again.results.get(timeout=BOUND), InferenceServerException)
    finally:
        again.close(cancel=True)
    assert ticker.closed.wait(BOUND)


def test_an_ensemble_is_decoupled_when_a_step_is(srv: openinfer.Server) -> None:
    """As Triton sets it: the config reports it, whatever config.pbtxt said."""
    with thttp.InferenceServerClient(srv.url.split("//")[1], network_timeout=BOUND) as http:
        assert http.get_model_config("fan")["model_transaction_policy"] == {"decoupled": True}
        assert http.get_model_config("fan_limited")["ensemble_scheduling"]["max_inflight_requests"] == 1
        assert http.get_model_config("says_decoupled")["model_transaction_policy"] == {"decoupled": False}
        i = thttp.InferInput("IN", [4], "FP32")
        i.set_data_from_numpy(np.ones(4, dtype=np.float32))
        np.testing.assert_array_equal(http.infer("says_decoupled", [i]).as_numpy("OUT"), np.full(4, 4.0))


def test_generate_stream_sends_each_answer_as_an_event(srv: openinfer.Server) -> None:
    """HTTP's generate_stream serves a decoupled ensemble as it serves any decoupled model."""
    r = requests.post(f"{srv.url}/v2/models/fan/generate_stream", json={"IN": [1, 2, 3, 4], "N": [3]}, timeout=BOUND)
    assert r.status_code == 200, r.text
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["OUT"] for e in events] == [[2.0 * (v + k) for v in (1, 2, 3, 4)] for k in range(3)]


def test_cancel_while_held_by_max_inflight_requests(srv: openinfer.Server, producer: Producer,
                                                    gate: threading.Event) -> None:
    """A producer held for a slot is let go when its stream is cancelled, and stops."""
    gate.clear()
    before, ended = producer.produced, producer.ended
    s = Stream(srv)
    try:
        s.send("fan_limited", np.zeros(4, dtype=np.float32), 5)
        assert producer.wait_for(before + 2) == before + 2
    finally:
        s.close(cancel=True)
    try:  # the gate stays shut: only the cancellation can end the producer's run
        assert producer.wait_ended(ended + 1) == ended + 1
        assert producer.produced < before + 5
    finally:
        gate.set()
    again = Stream(srv)  # the ensemble serves on
    try:
        again.send("fan", np.zeros(4, dtype=np.float32), 1)
        assert len(again.until_final()) == 2
    finally:
        again.close()
