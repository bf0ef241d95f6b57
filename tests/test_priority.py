"""dynamic_batching priorities and queue policies, as Triton's: a request's "priority" picks its
level (1 the highest; 0 or past priority_levels: default_priority_level), a backlog runs level
by level; a request that waits past its queue timeout is refused (REJECT: "Request timeout
expired", HTTP 503 / gRPC UNAVAILABLE) or runs after the timely ones of its level (DELAY); the
request's "timeout" replaces the policy's only with allow_timeout_override; max_queue_size is
per level. Through tritonclient.http and .grpc. The model is held at a gate the test opens and
records the order it ran requests in: the assertions are on order and counts, not durations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor
from openinfer.config import ConfigError, DynamicBatching, QueuePolicy

from conftest import pending_requests, wait_for
from test_queue_policy import Gate

BOUND = 30.0  # a bound for a hung test, not a measurement
OUTWAIT = 1.0  # seconds a request is left queued so that a 0.1 s queue timeout passes


class Batches:
    """A batching model that records the INPUT0 values of each batch it runs and holds every
    batch until the test opens the gate."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []
        self.gate = threading.Event()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seen.append([int(v) for v in inputs["INPUT0"].reshape(-1)])
        self.gate.wait(BOUND)
        return {"OUTPUT0": inputs["INPUT0"]}


@contextmanager
def gated(batching: DynamicBatching, max_batch_size: int = 1) -> Iterator[tuple[openinfer.Server, Gate]]:
    gate = Gate()
    model = Model("q", gate.fn, inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])],
                  max_batch_size=max_batch_size, dynamic_batching=batching)
    srv = openinfer.serve(models=[model], http_port=0, log=False, threads=2)
    try:
        yield srv, gate
    finally:
        gate.gate.set()
        srv.stop()


def pending(srv: openinfer.Server) -> float:
    return pending_requests(srv, "q")


def wait_pending(srv: openinfer.Server, n: int) -> None:
    wait_for(lambda: pending(srv) == n, f"{n} requests pending")


def http_infer(srv: openinfer.Server, value: int, **kw: Any) -> Any:
    c = thttp.InferenceServerClient(srv.url.split("//")[1], network_timeout=BOUND)
    try:
        i = thttp.InferInput("INPUT0", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return c.infer("q", [i], **kw)
    finally:
        c.close()


def grpc_infer(srv: openinfer.Server, value: int, **kw: Any) -> Any:
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        i = tgrpc.InferInput("INPUT0", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return c.infer("q", [i], client_timeout=BOUND, **kw)
    finally:
        c.close()


INFER = {"http": http_infer, "grpc": grpc_infer}
UNAVAILABLE = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}


class Backlog:
    """Requests sent one at a time, each in its own thread, each queued (seen in the pending
    count) before the next is sent, so that the queue's order is known."""

    def __init__(self, srv: openinfer.Server, infer: Callable[..., Any]) -> None:
        self.srv, self.infer = srv, infer
        self.results: dict[int, Any] = {}
        self.threads: list[threading.Thread] = []
        self.queued = 0

    def _run(self, value: int, kw: dict[str, Any]) -> None:
        try:
            self.results[value] = int(self.infer(self.srv, value, **kw).as_numpy("OUTPUT0")[0][0])
        except Exception as e:  # noqa: BLE001 - recorded for the assertions
            self.results[value] = e

    def send(self, value: int, *, queued: bool = True, **kw: Any) -> None:
        self.threads.append(threading.Thread(target=self._run, args=(value, kw)))
        self.threads[-1].start()
        if queued:
            self.queued += 1
            wait_pending(self.srv, self.queued)

    def join(self) -> dict[int, Any]:
        for t in self.threads:
            t.join(BOUND)
        assert not any(t.is_alive() for t in self.threads)
        return self.results


def hold(srv: openinfer.Server, gate: Gate, infer: Callable[..., Any]) -> Backlog:
    """A backlog behind request 1, which the model holds at the gate."""
    b = Backlog(srv, infer)
    b.send(1, queued=False)
    gate.wait_call(1)
    return b


def refused(result: Any, protocol: str, message: str) -> bool:
    return (isinstance(result, InferenceServerException) and result.status() == UNAVAILABLE[protocol]
            and message in result.message())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_priorities_reorder_a_queued_backlog(protocol: str) -> None:
    with gated(DynamicBatching(priority_levels=3, default_priority_level=2)) as (srv, gate):
        b = hold(srv, gate, INFER[protocol])
        # Sent lowest first; 0 and 7 (past priority_levels) queue at the default level, 2.
        for value, priority in [(31, 3), (21, 0), (11, 1), (22, 2), (23, 7), (12, 1)]:
            b.send(value, priority=priority)
        gate.gate.set()
        results = b.join()
    assert gate.calls == [1, 11, 12, 21, 22, 23, 31]
    assert results == {v: v for v in (1, 11, 12, 21, 22, 23, 31)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_priorities_with_batching_take_the_highest_level_first(protocol: str) -> None:
    """With batches of up to 2, the first batch after the held one is the two level-1 requests."""
    batches = Batches()
    model = Model("q", batches, inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])],
                  max_batch_size=2, dynamic_batching=DynamicBatching(priority_levels=2, default_priority_level=2))
    with openinfer.serve(models=[model], http_port=0, log=False, threads=2) as srv:
        b = Backlog(srv, INFER[protocol])
        b.send(1, queued=False)
        wait_for(lambda: bool(batches.seen), "the first request at the model")
        for value, priority in [(21, 2), (22, 2), (11, 1), (12, 1)]:
            b.send(value, priority=priority)
        batches.gate.set()
        results = b.join()
    assert batches.seen == [[1], [11, 12], [21, 22]]
    assert results == {v: v for v in (1, 11, 12, 21, 22)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_of_different_priorities_and_timeouts_share_a_batch(protocol: str) -> None:
    """priority and timeout are the scheduler's own parameters: as in Triton, requests that
    differ only in them go in one batch (highest level first); another parameter still parts them."""
    batches = Batches()
    model = Model("q", batches, inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])],
                  max_batch_size=8, dynamic_batching=DynamicBatching(
                      priority_levels=2, default_priority_level=2,
                      default_queue_policy=QueuePolicy(allow_timeout_override=True)))
    with openinfer.serve(models=[model], http_port=0, log=False, threads=2) as srv:
        b = Backlog(srv, INFER[protocol])
        b.send(1, queued=False)
        wait_for(lambda: bool(batches.seen), "the first request at the model")
        for value, kw in [(21, {"priority": 2}), (22, {"priority": 2, "timeout": 600_000_000}),
                          (11, {"priority": 1}), (23, {"priority": 2, "parameters": {"tag": "x"}}),
                          (12, {"priority": 1, "timeout": 500_000_000})]:
            b.send(value, **kw)
        batches.gate.set()
        results = b.join()
    assert batches.seen == [[1], [11, 12, 21, 22], [23]]
    assert results == {v: v for v in (1, 11, 12, 21, 22, 23)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_reject_refuses_a_request_that_outwaited_its_queue_timeout(protocol: str) -> None:
    batching = DynamicBatching(
        priority_levels=2, default_priority_level=2,
        default_queue_policy=QueuePolicy(default_timeout_microseconds=100_000),  # REJECT after 0.1 s
        priority_queue_policy=((1, QueuePolicy()),),  # level 1: no timeout
    )
    with gated(batching) as (srv, gate):
        b = hold(srv, gate, INFER[protocol])
        b.send(2)
        b.send(3, priority=1)
        time.sleep(OUTWAIT)
        gate.gate.set()
        results = b.join()
        assert gate.calls == [1, 3]  # the refused request never reached the model
        assert results[1] == 1 and results[3] == 3
        assert refused(results[2], protocol, "Request timeout expired"), results[2]
        assert int(INFER[protocol](srv, 4).as_numpy("OUTPUT0")[0][0]) == 4  # the model still serves


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_delay_runs_a_request_that_outwaited_its_timeout_after_the_timely_ones(protocol: str) -> None:
    batching = DynamicBatching(default_queue_policy=QueuePolicy(
        timeout_action="DELAY", default_timeout_microseconds=100_000, allow_timeout_override=True))
    with gated(batching) as (srv, gate):
        b = hold(srv, gate, INFER[protocol])
        b.send(2)  # the policy's 0.1 s: it will have outwaited it
        time.sleep(OUTWAIT)
        b.send(3, timeout=600_000_000)  # its own 10 minutes (the override is allowed): timely
        gate.gate.set()
        results = b.join()
    assert gate.calls == [1, 3, 2]
    assert results == {1: 1, 2: 2, 3: 3}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("allow", [None, False, True])
def test_request_timeout_applies_only_with_allow_timeout_override(protocol: str, allow: bool | None) -> None:
    """None: dynamic_batching without a queue policy, whose default does not allow the override."""
    batching = DynamicBatching(default_queue_policy=None if allow is None else QueuePolicy(allow_timeout_override=allow))
    with gated(batching) as (srv, gate):
        b = hold(srv, gate, INFER[protocol])
        b.send(2, timeout=100_000)  # 0.1 s of its own
        time.sleep(OUTWAIT)
        gate.gate.set()
        results = b.join()
    if allow:
        assert gate.calls == [1] and refused(results[2], protocol, "Request timeout expired"), results
    else:  # the policy has no timeout and the request may not set one: it runs
        assert gate.calls == [1, 2] and results == {1: 1, 2: 2}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_max_queue_size_is_per_level(protocol: str) -> None:
    batching = DynamicBatching(priority_levels=2, default_priority_level=2,
                               priority_queue_policy=((1, QueuePolicy(max_queue_size=1)),))
    with gated(batching) as (srv, gate):
        b = hold(srv, gate, INFER[protocol])
        b.send(11, priority=1)
        with pytest.raises(InferenceServerException) as e:  # level 1 is full: refused at once
            INFER[protocol](srv, 12, priority=1)
        assert refused(e.value, protocol, "Exceeds maximum queue size"), e.value
        for value in (21, 22, 23):  # level 2 has no limit
            b.send(value, priority=2)
        gate.gate.set()
        results = b.join()
    assert gate.calls == [1, 11, 21, 22, 23]
    assert results == {v: v for v in (1, 11, 21, 22, 23)}


def test_priority_parameter_of_the_wrong_type_is_refused_naming_it() -> None:
    with gated(DynamicBatching(priority_levels=2, default_priority_level=1)) as (srv, gate):
        gate.gate.set()
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [5]}]}
        for bad in ("high", -1, 1.5, True):
            r = requests.post(srv.url + "/v2/models/q/infer", json={**body, "parameters": {"priority": bad}},
                              timeout=BOUND)
            assert r.status_code == 400 and "priority" in r.json()["error"], (bad, r.text)
        r = requests.post(srv.url + "/v2/models/q/infer", json={**body, "parameters": {"priority": 2}}, timeout=BOUND)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [5]
        # gRPC: Triton takes an int64_param or a uint64_param, nothing else.
        import grpc
        from tritonclient.grpc import service_pb2

        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
            call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                  request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                  response_deserializer=service_pb2.ModelInferResponse.FromString)
            req = service_pb2.ModelInferRequest(model_name="q")
            t = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1])
            t.contents.int_contents.append(5)
            req.parameters["priority"].string_param = "high"
            with pytest.raises(grpc.RpcError) as e:
                call(req, timeout=BOUND)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == ("invalid value type for 'priority' parameter, expected int64_param or "
                                         "uint64_param.")
            for set_ in (lambda p: setattr(p, "int64_param", 1), lambda p: setattr(p, "uint64_param", 2)):
                set_(req.parameters["priority"])
                assert list(call(req, timeout=BOUND).outputs[0].shape) == [1, 1]


@pytest.mark.parametrize(
    "batching, field",
    [
        (DynamicBatching(priority_levels=2), "dynamic_batching.default_priority_level"),
        (DynamicBatching(priority_levels=2, default_priority_level=3), "dynamic_batching.default_priority_level"),
        (DynamicBatching(priority_levels=2, default_priority_level=1, priority_queue_policy=((3, QueuePolicy()),)),
         "dynamic_batching.priority_queue_policy"),
        (DynamicBatching(priority_levels=-1), "dynamic_batching.priority_levels"),
        (DynamicBatching(default_queue_policy=QueuePolicy(timeout_action="LATER")),
         "dynamic_batching.default_queue_policy.timeout_action"),
        (DynamicBatching(default_queue_policy=QueuePolicy(default_timeout_microseconds=-5)),
         "dynamic_batching.default_queue_policy.default_timeout_microseconds"),
    ],
)
def test_bad_python_model_batching_is_refused_naming_the_field(batching: DynamicBatching, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Model("q", lambda inputs: inputs, inputs=[Tensor("INPUT0", "INT32", [-1, 1])],
              outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])], max_batch_size=1, dynamic_batching=batching)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_holds_a_later_answer_behind_an_earlier_one(protocol: str, preserve: bool) -> None:
    """Two instances: request 1 is held in one while request 2 runs and returns in the other.
    With preserve_ordering, 2's answer leaves only after 1's; without it, 2 is answered first."""
    started = {1: threading.Event(), 2: threading.Event()}
    returned_2 = threading.Event()
    release_1 = threading.Event()

    def fn(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        value = int(inputs["INPUT0"].reshape(-1)[0])
        started[value].set()
        if value == 1:
            release_1.wait(BOUND)
        else:
            returned_2.set()
        return {"OUTPUT0": inputs["INPUT0"]}

    model = Model("q", fn, inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])],
                  max_batch_size=1, instances=2, dynamic_batching=DynamicBatching(preserve_ordering=preserve))
    answered: list[int] = []
    with openinfer.serve(models=[model], http_port=0, log=False, threads=2) as srv:
        def run(value: int) -> None:
            answered.append(int(INFER[protocol](srv, value).as_numpy("OUTPUT0")[0][0]))

        threads = [threading.Thread(target=run, args=(v,)) for v in (1, 2)]
        threads[0].start()
        assert started[1].wait(BOUND)
        threads[1].start()
        assert returned_2.wait(BOUND)
        if preserve:
            time.sleep(0.5)  # room for a wrongly early answer to 2 to arrive (not a measurement)
        else:
            threads[1].join(BOUND)  # 2 is answered while 1 is still held
        answered_while_1_held = list(answered)
        release_1.set()
        for t in threads:
            t.join(BOUND)
    assert answered_while_1_held == ([] if preserve else [2])
    assert sorted(answered) == [1, 2]


def test_python_model_reports_its_queue_policies_in_its_config() -> None:
    batching = DynamicBatching(priority_levels=2, default_priority_level=1, preserve_ordering=True,
                               default_queue_policy=QueuePolicy("REJECT", 5, True, 3),
                               priority_queue_policy=((2, QueuePolicy(max_queue_size=1)),))
    with gated(batching) as (srv, gate):
        db = requests.get(srv.url + "/v2/models/q/config", timeout=BOUND).json()["dynamic_batching"]
        assert db["priority_levels"] == 2 and db["default_priority_level"] == 1 and db["preserve_ordering"] is True
        assert db["default_queue_policy"] == {"timeout_action": "REJECT", "default_timeout_microseconds": 5,
                                              "allow_timeout_override": True, "max_queue_size": 3}
        assert db["priority_queue_policy"]["2"]["max_queue_size"] == 1
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        try:
            pb = c.get_model_config("q").config.dynamic_batching
        finally:
            c.close()
        assert pb.priority_levels == 2 and pb.priority_queue_policy[2].max_queue_size == 1


def test_many_priority_levels() -> None:
    with gated(DynamicBatching(priority_levels=1000, default_priority_level=1000)) as (srv, gate):
        b = hold(srv, gate, http_infer)
        for value, priority in [(14, 1000), (13, 999), (15, 0), (12, 500), (11, 1)]:
            b.send(value, priority=priority)
        gate.gate.set()
        results = b.join()
    assert gate.calls == [1, 11, 12, 13, 14, 15]
    assert results == {v: v for v in (1, 11, 12, 13, 14, 15)}
