"""dynamic_batching.default_queue_policy.max_queue_size: a request that finds the queue full
is refused at once, as Triton refuses it ("Exceeds maximum queue size", UNAVAILABLE: HTTP 503,
gRPC UNAVAILABLE), over HTTP and gRPC, with tritonclient. The model is held at a gate the test
opens, so the queue's fill is known; no timed assertions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Request, Tensor
from openinfer.config import DynamicBatching

from conftest import pending_requests, wait_for

BOUND = 30.0  # a bound for a hung test, not a measurement


class Gate:
    """Records each call's INPUT0 value and holds every call until the test opens the gate."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.calls: list[int] = []
        self.gate = threading.Event()

    def fn(self, inputs: dict[str, np.ndarray], request: Request) -> dict[str, np.ndarray]:
        with self.cond:
            self.calls.append(int(inputs["INPUT0"].reshape(-1)[0]))
            self.cond.notify_all()
        self.gate.wait(BOUND)
        return {"OUTPUT0": inputs["INPUT0"]}

    def wait_call(self, value: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: value in self.calls, BOUND), self.calls


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def served(gate: Gate) -> Iterator[openinfer.Server]:
    model = Model("q", gate.fn, inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])],
                  max_batch_size=1, dynamic_batching=DynamicBatching(max_queue_size=2))
    srv = openinfer.serve(models=[model], http_port=0, log=False, threads=2)
    try:
        yield srv
    finally:
        gate.gate.set()
        srv.stop()


def pending(srv: openinfer.Server) -> float:
    return pending_requests(srv, "q")


def wait_pending(srv: openinfer.Server, n: int) -> None:
    wait_for(lambda: pending(srv) == n, f"{n} pending", BOUND)


def http_infer(srv: openinfer.Server, value: int) -> Any:
    c = thttp.InferenceServerClient(srv.url.split("//")[1])
    try:
        i = thttp.InferInput("INPUT0", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return c.infer("q", [i])
    finally:
        c.close()


def grpc_infer(srv: openinfer.Server, value: int) -> Any:
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        i = tgrpc.InferInput("INPUT0", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return c.infer("q", [i])
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_full_queue_refuses_at_once_and_drains(served: openinfer.Server, gate: Gate, protocol: str) -> None:
    infer = http_infer if protocol == "http" else grpc_infer
    results: dict[int, Any] = {}

    def run(value: int) -> None:
        try:
            results[value] = int(infer(served, value).as_numpy("OUTPUT0")[0][0])
        except Exception as e:  # noqa: BLE001 - recorded for the assertion below
            results[value] = e

    threads = [threading.Thread(target=run, args=(1,))]
    threads[0].start()
    gate.wait_call(1)  # the model holds request 1: nothing runs past it
    for value in (2, 3):
        threads.append(threading.Thread(target=run, args=(value,)))
        threads[-1].start()
        wait_pending(served, value - 1)
    # The queue holds max_queue_size (2) requests: the next one is refused without waiting.
    with pytest.raises(InferenceServerException) as e:
        infer(served, 4)
    assert "Exceeds maximum queue size" in e.value.message()
    assert e.value.status() == ("503" if protocol == "http" else "StatusCode.UNAVAILABLE")
    assert pending(served) == 2
    gate.gate.set()
    for t in threads:
        t.join(BOUND)
    assert results == {1: 1, 2: 2, 3: 3}
    assert sorted(gate.calls) == [1, 2, 3]  # the refused request never reached the model
    assert int(infer(served, 5).as_numpy("OUTPUT0")[0][0]) == 5  # the queue has room again
