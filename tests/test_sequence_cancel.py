"""Cancellation of sequence requests (issue 12 items 1 and 4, issue 29 item 5): a client that
goes away while its sequence request waits behind the sequence's earlier requests, in the
backlog, or in the scheduler's queue is dropped and never reaches the model; its sequence is
cancelled with it, as Triton cancels it (released as if idle: a later request without START is
refused with Triton's error, one with START begins afresh). Proven by what a gate model
received (every wait bounded)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from conftest import START_AND_SUM_STATE, encode_request, infer_body
from test_cancellation import BOUND, failures, read_response, settle

import openinfer

BLOCK = 100  # the value whose call waits for the gate


class SeqGate:
    """A running sum as implicit state; records (value, state in) of every call and holds the
    call for BLOCK until the test opens the gate."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.calls: list[tuple[int, int]] = []
        self.gate = threading.Event()

    def fn(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        value, state = int(inputs["INPUT0"][0]), int(inputs["SUM_IN"][0])
        with self.cond:
            self.calls.append((value, state))
            self.cond.notify_all()
        if value == BLOCK:
            assert self.gate.wait(BOUND)
        total = np.where(inputs["START"] != 0, inputs["INPUT0"], inputs["SUM_IN"] + inputs["INPUT0"])
        return {"OUTPUT0": total, "SUM_OUT": total}

    def wait_called(self, value: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: any(v == value for v, _ in self.calls), BOUND), self.calls

    def values(self) -> list[int]:
        return [v for v, _ in self.calls]


def _model(name: str, gate: SeqGate, candidates: int) -> openinfer.Model:
    strategy = {"direct": {}} if candidates == 0 else {"oldest": {"max_candidate_sequences": candidates}}
    return openinfer.Model(
        name, gate.fn, inputs=[("INPUT0", "INT32", [1])], outputs=[("OUTPUT0", "INT32", [1])],
        sequence_batching={**strategy, **START_AND_SUM_STATE},
    )  # fmt: skip


@pytest.fixture
def gate() -> SeqGate:
    return SeqGate()


@pytest.fixture
def served(gate: SeqGate) -> Iterator[openinfer.Server]:
    # "two": two sequences at once on one instance, so a second sequence's request waits in the
    # scheduler's queue; "one": one sequence at once, the next waits in the backlog; "direct":
    # the Direct strategy, one slot.
    srv = openinfer.serve(models=[_model("two", gate, 2), _model("one", gate, 1), _model("direct", gate, 0)],
                          http_port=0, grpc_port=0, log=False, threads=2)  # fmt: skip
    try:
        yield srv
    finally:
        gate.gate.set()
        srv.stop()


def _request(model: str, value: int, **parameters: Any) -> bytes:
    return encode_request("POST", f"/v2/models/{model}/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}], parameters=parameters))


def _send(srv: openinfer.Server, model: str, value: int, **parameters: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=BOUND)
    sock.sendall(_request(model, value, **parameters))
    return sock


def _answer(srv: openinfer.Server, model: str, value: int, **parameters: Any) -> int:
    sock = _send(srv, model, value, **parameters)
    try:
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status == 200, body
    return int(json.loads(body)["outputs"][0]["data"][0])


def _not_started(srv: openinfer.Server, model: str, seq: int) -> None:
    """The sequence was released: a request without START gets Triton's 400."""
    sock = _send(srv, model, 1, sequence_id=seq)
    try:
        status, body = read_response(sock)
    finally:
        sock.close()
    assert (status, json.loads(body)["error"]) == (400, (
        f"inference request for sequence {seq} to model '{model}' must specify the START flag on the first "
        "request of the sequence"))


def _running(srv: openinfer.Server, gate: SeqGate, model: str, **parameters: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        sock = _send(srv, model, BLOCK, **parameters)
        result.append(read_response(sock))
        sock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    gate.wait_called(BLOCK)
    return t, result


def test_http_close_drops_requests_behind_the_sequence_and_in_the_scheduler(
    served: openinfer.Server, gate: SeqGate
) -> None:
    runner, result = _running(served, gate, "two", sequence_id=1, sequence_start=True)
    behind = _send(served, "two", 5, sequence_id=1)  # waits behind BLOCK in sequence 1
    queued = _send(served, "two", 7, sequence_id=2, sequence_start=True)  # in the scheduler's queue
    settle()
    behind.close()
    queued.close()
    settle()
    gate.gate.set()
    runner.join(BOUND)
    assert result and result[0][0] == 200  # the running request's own client stayed
    # Both sequences were cancelled with their requests: released, as Triton releases them.
    _not_started(served, "two", 1)
    _not_started(served, "two", 2)
    assert _answer(served, "two", 3, sequence_id=1, sequence_start=True, sequence_end=True) == 3
    assert _answer(served, "two", 9, sequence_id=2, sequence_start=True, sequence_end=True) == 9
    assert gate.values() == [BLOCK, 3, 9]
    assert gate.calls[2] == (9, 0)


def test_a_cancelled_request_cancels_the_rest_of_its_sequence(served: openinfer.Server, gate: SeqGate) -> None:
    """Issue 29 item 5: the sequence of a request whose client left is over, as in Triton: its
    other waiting requests are answered 499 at once instead of running on a state that
    missed a step; the request running meanwhile finishes for its own client."""
    runner, result = _running(served, gate, "two", sequence_id=30, sequence_start=True)
    gone = _send(served, "two", 5, sequence_id=30)
    stays = _send(served, "two", 6, sequence_id=30)
    settle()
    gone.close()
    try:
        status, body = read_response(stays)
    finally:
        stays.close()
    assert (status, json.loads(body)) == (499, {"error": "the sequence was cancelled"})
    gate.gate.set()
    runner.join(BOUND)
    assert result and result[0][0] == 200
    _not_started(served, "two", 30)
    assert gate.values() == [BLOCK]


def test_http_close_drops_a_sequence_waiting_in_the_backlog(served: openinfer.Server, gate: SeqGate) -> None:
    runner, result = _running(served, gate, "one", sequence_id=10, sequence_start=True)
    waiting = _send(served, "one", 5, sequence_id=11, sequence_start=True, sequence_end=True)
    settle()
    waiting.close()
    settle()
    gate.gate.set()
    runner.join(BOUND)
    assert result and result[0][0] == 200
    assert _answer(served, "one", 1, sequence_id=10, sequence_end=True) == BLOCK + 1
    # Sequence 11 ended (its END was dropped): its id starts afresh, and the slot is free.
    assert _answer(served, "one", 6, sequence_id=11, sequence_start=True, sequence_end=True) == 6
    assert gate.values() == [BLOCK, 1, 6]


def test_grpc_stream_reset_drops_its_sequence_requests(served: openinfer.Server, gate: SeqGate) -> None:
    def req(value: int, seq: int, start: bool = False) -> Any:
        r = service_pb2.ModelInferRequest(model_name="two")
        r.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        r.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
        r.parameters["sequence_id"].int64_param = seq
        r.parameters["sequence_start"].bool_param = start
        return r

    opened = threading.Event()

    def stream() -> Iterator[Any]:
        yield req(BLOCK, 20, start=True)
        yield req(5, 20)  # behind BLOCK in its sequence
        yield req(7, 21, start=True)  # in the scheduler's queue
        opened.wait(BOUND)  # the stream stays open until the test resets it

    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(stream(), timeout=BOUND)
        gate.wait_called(BLOCK)
        settle()
        call.cancel()
        settle()
        opened.set()
    gate.gate.set()
    # The stream's sequences went with it: their next request needs START again.
    _not_started(served, "two", 20)
    _not_started(served, "two", 21)
    assert _answer(served, "two", 3, sequence_id=20, sequence_start=True, sequence_end=True) == 3
    assert gate.values() == [BLOCK, 3]


@pytest.mark.parametrize("model", ["two", "one", "direct"])
def test_grpc_cancel_of_a_queued_request_answers_the_sequence_cancelled(served: openinfer.Server, gate: SeqGate,
                                                                       model: str) -> None:
    """Triton's L0_request_cancellation (scheduler_test.py, _test_sequence_batch_scheduler_
    queued_request_cancellation), Oldest and Direct alike: of two requests queued behind a
    running one of their sequence, the client cancels the first (tritonclient's future.cancel());
    the second is answered CANCELLED, both count as failures of reason CANCELED, and the
    sequence is over."""
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    answers: list[dict[str, Any]] = [{"done": threading.Event()} for _ in range(3)]

    def callback(k: int) -> Any:
        def done(result: Any, error: Any) -> None:
            answers[k].update(result=result, error=error)
            answers[k]["done"].set()
        return done

    def inputs(value: int) -> list[Any]:
        i = tgrpc.InferInput("INPUT0", [1], "INT32")
        i.set_data_from_numpy(np.array([value], dtype=np.int32))
        return [i]

    try:
        client.async_infer(model, inputs(BLOCK), callback(0), sequence_id=40, sequence_start=True)
        gate.wait_called(BLOCK)
        queued = [client.async_infer(model, inputs(5 + k), callback(1 + k), sequence_id=40) for k in range(2)]
        settle()
        assert not answers[1]["done"].is_set() and not answers[2]["done"].is_set()
        queued[0].cancel()
        assert answers[2]["done"].wait(BOUND)
        error = answers[2]["error"]
        assert answers[2]["result"] is None and error is not None
        assert (error.status(), error.message()) == ("StatusCode.CANCELLED", "the sequence was cancelled")
        assert answers[1]["done"].wait(BOUND) and answers[1]["error"].status() == "StatusCode.CANCELLED"
        # Both count as cancelled failures, as Triton's test expects of Direct (its metric +2).
        deadline = time.monotonic() + BOUND
        while failures(served) != {"CANCELED": 2} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failures(served) == {"CANCELED": 2}
        gate.gate.set()
        assert answers[0]["done"].wait(BOUND) and answers[0]["error"] is None
    finally:
        gate.gate.set()
        client.close()
    _not_started(served, model, 40)
    assert gate.values() == [BLOCK]
