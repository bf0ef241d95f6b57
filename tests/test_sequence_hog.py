"""Issue 29 item 5: one client's flood of sequences cannot take a sequence model from the others.
Past `max_sequence_backlog` sequences waiting for a slot, a new sequence is refused at once with
503 / UNAVAILABLE; the sequences of a client that has gone (its gRPC stream cancelled, its HTTP
request abandoned) are released at once, their slot and places in the backlog handed on, rather
than held until max_sequence_idle_microseconds (an hour here: nothing waits for it). Through
tritonclient.grpc (streaming and unary), tritonclient.http and raw sockets; every wait bounded."""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import START_AND_SUM_STATE, encode_request, infer_body
from test_cancellation import read_response, settle
from tritonclient.utils import InferenceServerException

import openinfer

BOUND = 20.0  # a bound for a hung test, far below the idle release it must not wait for
IDLE_US = 3_600_000_000
BACKLOG = 3
FULL = ("sequence backlog full: 3 sequences already wait for a sequence slot of model '{model}', the most "
        "--max-sequence-backlog allows")
MODELS = ["acc_oldest", "acc_direct"]


class Acc:
    """A running sum as implicit state; records the INPUT0 value of every call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: list[int] = []

    def fn(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.values.append(int(inputs["INPUT0"][0]))
        total = np.where(inputs["START"] != 0, inputs["INPUT0"], inputs["SUM_IN"] + inputs["INPUT0"])
        return {"OUTPUT0": total, "SUM_OUT": total}


def _model(name: str, acc: Acc) -> openinfer.Model:
    # One slot either way: Oldest with one candidate sequence, Direct with one instance of
    # max_batch_size 0.
    strategy = {"oldest": {"max_candidate_sequences": 1}} if name == "acc_oldest" else {"direct": {}}
    return openinfer.Model(
        name, acc.fn, inputs=[("INPUT0", "INT32", [1])], outputs=[("OUTPUT0", "INT32", [1])],
        sequence_batching={
            **strategy,
            "max_sequence_idle_microseconds": IDLE_US,
            **START_AND_SUM_STATE,
        },
    )  # fmt: skip


@pytest.fixture
def acc() -> Acc:
    return Acc()


@pytest.fixture
def served(acc: Acc) -> Iterator[openinfer.Server]:
    srv = openinfer.serve(models=[_model(m, acc) for m in MODELS], http_port=0, grpc_port=0, log=False,
                          threads=2, max_sequence_backlog=BACKLOG)  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def _grpc_inputs(value: int) -> list[Any]:
    i = grpcclient.InferInput("INPUT0", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [i]


def _http_inputs(value: int) -> list[Any]:
    i = httpclient.InferInput("INPUT0", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [i]


def _grpc(srv: openinfer.Server) -> Any:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")


def _http(srv: openinfer.Server) -> Any:
    return httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}", network_timeout=BOUND,
                                            connection_timeout=BOUND)  # fmt: skip


def _hog_stream(srv: openinfer.Server, model: str, n: int) -> tuple[Any, queue.Queue[Any]]:
    """A stream that starts sequences 1..n with one START-only request each and never ends them."""
    results: queue.Queue[Any] = queue.Queue()
    hog = _grpc(srv)
    hog.start_stream(callback=lambda result, error: results.put((result, error)))
    for seq in range(1, n + 1):
        hog.async_stream_infer(model, _grpc_inputs(seq), request_id=str(seq), sequence_id=seq, sequence_start=True)
    return hog, results


def _first_answer(results: queue.Queue[Any]) -> int:
    result, error = results.get(timeout=BOUND)
    assert error is None, error
    return int(result.as_numpy("OUTPUT0")[0])


def _start_when_room(srv: openinfer.Server, model: str, seq: int, value: int) -> int:
    """START (and END) sequence `seq` from a new client, again while the backlog is still full
    (a cancellation reaches the server after the client's cancel() returns)."""
    deadline = time.monotonic() + BOUND
    with _grpc(srv) as client:
        while True:
            try:
                r = client.infer(model, _grpc_inputs(value), sequence_id=seq, sequence_start=True,
                                 sequence_end=True, client_timeout=BOUND)  # fmt: skip
                return int(r.as_numpy("OUTPUT0")[0])
            except InferenceServerException as e:
                assert e.message() == FULL.format(model=model) and time.monotonic() < deadline, e
                time.sleep(0.05)


@pytest.mark.parametrize("model", MODELS)
def test_grpc_hog_stream_is_refused_past_the_backlog_and_released_when_cancelled(
    served: openinfer.Server, acc: Acc, model: str
) -> None:
    hog, results = _hog_stream(served, model, 1 + BACKLOG + 2)
    # Sequence 1 runs in the one slot, BACKLOG more wait for it, the last two are refused at once.
    got = [results.get(timeout=BOUND) for _ in range(3)]
    assert [int(r.as_numpy("OUTPUT0")[0]) for r, e in got if e is None] == [1]
    assert [e.message() for r, e in got if e is not None] == [FULL.format(model=model)] * 2
    # Another client meanwhile: refused as clearly, not left waiting past its deadline.
    with _grpc(served) as other, pytest.raises(InferenceServerException) as err:
        other.infer(model, _grpc_inputs(100), sequence_id=100, sequence_start=True, client_timeout=BOUND)
    assert (err.value.status(), err.value.message()) == ("StatusCode.UNAVAILABLE", FULL.format(model=model))
    hog.stop_stream(cancel_requests=True)
    hog.close()
    # The hog's sequences went with its stream: the one that held the slot (idle, not ended)
    # and those in the backlog, which never reach the model.
    assert _start_when_room(served, model, 100, 100) == 100
    assert acc.values == [1, 100]
    with _grpc(served) as other, pytest.raises(InferenceServerException) as err:
        other.infer(model, _grpc_inputs(5), sequence_id=1, client_timeout=BOUND)
    assert err.value.message() == (f"inference request for sequence 1 to model '{model}' must specify the START "
                                   "flag on the first request of the sequence")


@pytest.mark.parametrize("model", MODELS)
def test_a_cancelled_stream_releases_its_sequences_at_once(served: openinfer.Server, acc: Acc, model: str) -> None:
    """Below the bound: a new client's sequence, behind a cancelled stream's sequence that holds
    the slot and two of its sequences in the backlog, is served within its deadline."""
    hog, results = _hog_stream(served, model, 3)
    assert _first_answer(results) == 1
    hog.stop_stream(cancel_requests=True)
    hog.close()
    with _grpc(served) as client:
        r = client.infer(model, _grpc_inputs(7), sequence_id=70, sequence_start=True, sequence_end=True,
                         client_timeout=BOUND)  # fmt: skip
    assert int(r.as_numpy("OUTPUT0")[0]) == 7
    assert acc.values == [1, 7]


def test_a_stream_that_ends_normally_keeps_its_sequences(served: openinfer.Server, acc: Acc) -> None:
    """Only a cancelled stream is a client gone: one closed in order leaves its sequences to be
    continued on another call, with their state."""
    hog, results = _hog_stream(served, "acc_oldest", 1)
    assert _first_answer(results) == 1
    hog.stop_stream()
    hog.close()
    with _grpc(served) as client:
        r = client.infer("acc_oldest", _grpc_inputs(5), sequence_id=1, sequence_end=True, client_timeout=BOUND)
    assert int(r.as_numpy("OUTPUT0")[0]) == 6


# ---- HTTP ----------------------------------------------------------------------------------------


def _send_start(srv: openinfer.Server, model: str, seq: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=BOUND)
    sock.sendall(encode_request("POST", f"/v2/models/{model}/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [seq]}],
        parameters={"sequence_id": seq, "sequence_start": True})))
    return sock


def _leave(sock: socket.socket) -> None:
    """The client goes: it ends its side, and waits for the server to close the connection,
    which it does as it cancels what the connection had in flight."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(BOUND)
    while sock.recv(65536):
        pass
    sock.close()


def _http_infer(client: Any, model: str, value: int, **sequence: Any) -> int:
    return int(client.infer(model, _http_inputs(value), **sequence).as_numpy("OUTPUT0")[0])


@pytest.mark.parametrize("model", MODELS)
def test_http_clients_that_leave_release_their_sequences(served: openinfer.Server, acc: Acc, model: str) -> None:
    with _http(served) as a, _http(served) as b:
        assert _http_infer(a, model, 1, sequence_id=1, sequence_start=True) == 1  # holds the slot
        hog = [_send_start(served, model, seq) for seq in (10, 11)]  # wait in the backlog
        settle()
        for sock in hog:
            _leave(sock)
        assert _http_infer(a, model, 2, sequence_id=1, sequence_end=True) == 3  # the slot frees
        # The slot goes to the new client, not to an abandoned sequence that would hold it
        # until its idle release.
        assert _http_infer(b, model, 20, sequence_id=20, sequence_start=True, sequence_end=True) == 20
    assert acc.values == [1, 2, 20]


def test_http_sequences_past_the_backlog_get_503(served: openinfer.Server, acc: Acc) -> None:
    model = "acc_oldest"
    with _http(served) as a, _http(served) as b:
        assert _http_infer(a, model, 1, sequence_id=1, sequence_start=True) == 1
        hog = [_send_start(served, model, seq) for seq in range(10, 10 + BACKLOG + 2)]
        # Whatever order they arrive in, BACKLOG of them wait and the other two are refused.
        answered: dict[socket.socket, tuple[int, bytes]] = {}
        while len(answered) < 2:
            ready, _, _ = select.select([s for s in hog if s not in answered], [], [], BOUND)
            assert ready, "no hog request was refused"
            for sock in ready:
                answered[sock] = read_response(sock)
        assert sorted((status, json.loads(body)["error"]) for status, body in answered.values()) == [
            (503, FULL.format(model=model))] * 2
        with pytest.raises(InferenceServerException) as err:
            _http_infer(b, model, 20, sequence_id=20, sequence_start=True)
        assert (err.value.status(), err.value.message()) == ("503", FULL.format(model=model))
        for sock in hog:
            _leave(sock)
        assert _http_infer(a, model, 2, sequence_id=1, sequence_end=True) == 3
        assert _http_infer(b, model, 20, sequence_id=20, sequence_start=True, sequence_end=True) == 20
    assert acc.values == [1, 2, 20]
