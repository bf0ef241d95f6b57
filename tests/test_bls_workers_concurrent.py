"""BLS from a worker process runs concurrently: a Triton Python model whose instances are worker
processes makes several BLS calls at once (from threads, and with async_exec under
asyncio.gather), each answered with its own response, through tritonclient; calls to a missing
model from several threads, a client that goes away, a call the model stops waiting for, and
more calls than one worker may have in flight each end cleanly."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import openinfer

from conftest import triton_http, wait_for
from test_triton_python_backend import PROLOGUE, add_model

# What the targets share (in sys.modules["bls_workers_slow"]: the server runs in the test's
# process): held and cancelled requests counted, and a meeting point: a request with parameter
# `meet` N waits (at most 20 s) until N requests of the targets have been in execute at once
# (`met`, the most seen at once; a test sets it to 0 first). Calls made one after another never meet.
MEETING = PROLOGUE + textwrap.dedent(
    """
    import sys, time, types
    seen = sys.modules.setdefault("bls_workers_slow", types.SimpleNamespace(held=0, cancelled=0, pid=0, inside=0,
                                                                            met=0, cond=threading.Condition()))

    def meet(p):
        with seen.cond:
            seen.inside += 1
            seen.met = max(seen.met, seen.inside)
            seen.cond.notify_all()
            seen.cond.wait_for(lambda: seen.met >= p.get("meet", 0), timeout=20)  # met only grows

    def leave():
        with seen.cond:
            seen.inside -= 1
    """
)
# Sleeps `sleep` seconds (a parameter; 0.3 by default) per request, or with `hold` until its
# request is cancelled, then answers OUTPUT0 = 2 * INPUT0 and ID = its request id. Eight
# instances in the server: eight requests sleep at once.
SLOW = MEETING + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                p = json.loads(r.parameters())
                meet(p)
                if p.get("hold"):
                    with seen.cond:
                        seen.held += 1
                        seen.pid = p["pid"]  # the calling worker's
                    for _ in range(600):
                        if r.is_cancelled():
                            with seen.cond:
                                seen.cancelled += 1
                            break
                        time.sleep(0.05)
                else:
                    time.sleep(p.get("sleep", 0.3))
                leave()
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2),
                    pb_utils.Tensor("ID", np.array([r.request_id().encode()], np.object_))]))
            return out
    """
)
SLOW_CONFIG = """
name: "slow"
backend: "python"
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "ID", data_type: TYPE_STRING, dims: [ 1 ] }]
instance_group [{ count: 8, kind: KIND_MODEL }]
"""

# What both fan-out models share: call i sends IN[i] to targets[i] (its request id "call<i>"),
# even calls as a view of the model's own input (named over the wire, not copied), odd ones as
# a new array; its answer is [OUTPUT0, ID] or "error <code>: <message>". The model answers OUT:
# JSON {"answers": [the n calls' answers, made at once]}.
FAN_COMMON = PROLOGUE + textwrap.dedent(
    """
    import asyncio, os
    from concurrent.futures import ThreadPoolExecutor

    def param(request, key, default):  # a list or object travels as JSON text
        value = json.loads(request.parameters()).get(key)
        return json.loads(value) if isinstance(value, str) else value or default

    def make(request, i):
        x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        value = x[i : i + 1] if i % 2 == 0 else x[i : i + 1].copy()
        params = dict(param(request, "target_params", {}), pid=os.getpid())
        return pb_utils.InferenceRequest(model_name=param(request, "targets", ["slow"] * x.size)[i],
                                         inputs=[pb_utils.Tensor("INPUT0", value)],
                                         requested_output_names=["OUTPUT0", "ID"], request_id=f"call{i}",
                                         parameters=params)

    def answer(r):
        if r.has_error():
            return f"error {r.error().code()}: {r.error().message()}"
        out = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy().tolist()
        return [out, pb_utils.get_output_tensor_by_name(r, "ID").as_numpy()[0].decode()]

    def respond(answers):
        text = json.dumps({"answers": answers})
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))])
    """
)
FAN_THREADS = FAN_COMMON + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size
                with ThreadPoolExecutor(n) as pool:
                    answers = list(pool.map(lambda i: answer(make(request, i).exec()), range(n)))
                out.append(respond(answers))
            return out
    """
)
FAN_ASYNC = FAN_COMMON + textwrap.dedent(
    """
    class TritonPythonModel:
        async def execute(self, requests):
            out = []
            for request in requests:
                p = json.loads(request.parameters())
                n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size
                if p.get("give_up_after"):  # the model stops waiting: the call is dropped unanswered
                    try:
                        await asyncio.wait_for(make(request, 0).async_exec(), p["give_up_after"])
                    except asyncio.TimeoutError:
                        pass
                    out.append(respond([]))
                    continue
                got = await asyncio.gather(*(make(request, i).async_exec() for i in range(n)))
                out.append(respond([answer(r) for r in got]))
            return out
    """
)
# Passes IN[1:3] (a view of its own request) on to `slow`, and says how the wire carried it: the
# place in the request it named (triton_wire._source), and the answer.
NAMED = FAN_COMMON + textwrap.dedent(
    """
    from openinfer import _core
    from openinfer._backends import triton_wire

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
            named = triton_wire._source(x[1:3], _core.worker_job_inputs()[1])
            r = pb_utils.InferenceRequest(model_name="slow", inputs=[pb_utils.Tensor("INPUT0", x[1:3])],
                                          requested_output_names=["OUTPUT0", "ID"], request_id="view",
                                          parameters={"sleep": 0}).exec()
            text = json.dumps({"named": named, "answer": answer(r)})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))])]
    """
)
# Decoupled: answers each request with three responses OUTPUT0 = INPUT0 + k (k = 0, 1, 2), 0.1 s
# apart, then the final flag alone.
REPEAT = MEETING + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                meet(json.loads(r.parameters()))
                leave()
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                sender = r.get_response_sender()
                for k in range(3):
                    time.sleep(0.1)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + k),
                        pb_utils.Tensor("ID", np.array([r.request_id().encode()], np.object_))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
)
REPEAT_CONFIG = SLOW_CONFIG.replace('"slow"', '"repeat"') + "model_transaction_policy { decoupled: True }\n"
# Four decoupled streams at once with async_exec(decoupled=True) under asyncio.gather, each read
# to its end; OUT: JSON {"streams": [[answer, ...], ...]}.
STREAMS = FAN_COMMON + textwrap.dedent(
    """
    class TritonPythonModel:
        async def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()

            async def stream(i):
                request = pb_utils.InferenceRequest(model_name="repeat", inputs=[pb_utils.Tensor("INPUT0", x[i : i + 1])],
                                                    requested_output_names=["OUTPUT0", "ID"], request_id=f"call{i}",
                                                    parameters={"meet": x.size})
                return [answer(r) for r in await request.async_exec(decoupled=True)
                        if r.has_error() or r.output_tensors()]

            streams = await asyncio.gather(*(stream(i) for i in range(x.size)))
            text = json.dumps({"streams": streams})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))])]
    """
)
# Sends BLS requests that name inputs the server must refuse: one past the request's inputs, and
# bytes past the end of its input; OUT: JSON list of the calls' ends.
FORGED = FAN_COMMON + textwrap.dedent(
    """
    import os
    from openinfer import _core
    from openinfer._backends import triton_wire

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
            address = x.__array_interface__["data"][0]
            head = [triton_wire.struct.pack("<IIIIQQ", 1, 1, 0, 0, 0, 0)]
            head += [triton_wire._string(s) for s in ("slow", "", "", "", "")]
            ends = []
            for places in (((0, 0),) * 5 + ((address, x.nbytes),), ((address - 4096, x.nbytes + 4096),)):
                fd = triton_wire._request(head, [("INPUT0", "FP32", x)], ["OUTPUT0"], places)
                try:
                    call = triton_wire._Call(_core.worker_bls(fd))
                finally:
                    os.close(fd)
                ends.append(call.next(30))
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(ends).encode()],
                                                                                  np.object_))])]
    """
)
# Decoupled, in workers: makes its n calls from threads and sends each call's answer as its own
# response as soon as it comes (the sends, from several threads, wait for the server's word
# while the other calls' answers arrive on the same wire).
RELAY = FAN_COMMON + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size

                def relay(i):
                    text = json.dumps(answer(make(request, i).exec()))
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))

                with ThreadPoolExecutor(n) as pool:
                    list(pool.map(relay, range(n)))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
)
FAN_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [{{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }}]
instance_group [{{ count: 2, kind: KIND_CPU }}]
"""
FANS = ["fan_threads", "fan_async"]
ONE_WORKER_LIMIT = 64  # OI_PW_MAX_BLS_CALLS


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("bls_workers")
    add_model(repo, "slow", SLOW, SLOW_CONFIG)
    add_model(repo, "fan_threads", FAN_THREADS, FAN_CONFIG.format(name="fan_threads"))
    add_model(repo, "fan_async", FAN_ASYNC, FAN_CONFIG.format(name="fan_async"))
    add_model(repo, "named", NAMED, FAN_CONFIG.format(name="named"))
    add_model(repo, "repeat", REPEAT, REPEAT_CONFIG)
    add_model(repo, "streams", STREAMS, FAN_CONFIG.format(name="streams"))
    add_model(repo, "forged", FORGED, FAN_CONFIG.format(name="forged"))
    add_model(repo, "relay", RELAY, FAN_CONFIG.format(name="relay") + "model_transaction_policy { decoupled: True }\n")
    server = openinfer.serve(repo, http_port=0, grpc_port=0, log=False)
    try:
        yield server
    finally:
        server.stop()


def fan(srv: openinfer.Server, model: str, x: np.ndarray, **params: Any) -> dict[str, Any]:
    import tritonclient.http as client

    value = client.InferInput("IN", list(x.shape), "FP32")
    value.set_data_from_numpy(x)
    sent = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in params.items()}
    result = triton_http(srv, timeout=120).infer(model, [value], parameters=sent or None)
    return json.loads(result.as_numpy("OUT")[0])


def expected(x: np.ndarray) -> list[Any]:
    return [[[float(v) * 2], f"call{i}"] for i, v in enumerate(x)]


@pytest.mark.parametrize("model", FANS)
def test_eight_bls_calls_from_one_worker_run_at_once_each_with_its_own_answer(srv: openinfer.Server,
                                                                              model: str) -> None:
    x = np.arange(1, 9, dtype=np.float32) * 1.5
    sys.modules["bls_workers_slow"].met = 0
    got = fan(srv, model, x, target_params={"meet": x.size})
    assert got["answers"] == expected(x)
    assert _seen("met") == x.size  # all eight calls were in the target at once


def test_an_input_viewing_the_workers_request_is_named_not_copied(srv: openinfer.Server) -> None:
    for size in (4, 40000):  # in the job area, and in a memfd of the request's own (64 KiB and up)
        x = np.arange(size, dtype=np.float32) + 0.5
        got = fan(srv, "named", x)
        assert got == {"named": [1, 4], "answer": [[3.0, 5.0], "view"]}, got


def test_decoupled_bls_streams_from_one_worker_at_once_each_get_their_own_responses(srv: openinfer.Server) -> None:
    x = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
    sys.modules["bls_workers_slow"].met = 0
    got = fan(srv, "streams", x)
    assert got["streams"] == [[[[v + k], f"call{i}"] for k in range(3)] for i, v in enumerate(x.tolist())]
    assert _seen("met") == x.size  # the four streams were in the target at once


def test_a_decoupled_worker_sends_each_bls_answer_as_it_comes(srv: openinfer.Server) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    from conftest import triton_grpc

    got: queue.Queue[Any] = queue.Queue()
    client = triton_grpc(srv)
    client.start_stream(callback=lambda result, error: got.put(error if error is not None else result))
    x = np.arange(8, dtype=np.float32) + 0.25
    tensor = grpcclient.InferInput("IN", [8], "FP32")
    tensor.set_data_from_numpy(x)
    client.async_stream_infer("relay", [tensor], enable_empty_final_response=True)
    answers = []
    while True:
        item = got.get(timeout=60)
        assert not isinstance(item, Exception), item
        if item.get_response().parameters["triton_final_response"].bool_param:
            break
        answers.append(json.loads(item.as_numpy("OUT")[0]))
    client.stop_stream()
    assert sorted(answers, key=lambda a: a[1]) == expected(x)


def test_a_request_naming_inputs_the_worker_does_not_have_is_refused(srv: openinfer.Server) -> None:
    got = fan(srv, "forged", np.arange(4, dtype=np.float32))
    assert got == [[400, "a BLS request from a worker was malformed"]] * 2


@pytest.mark.parametrize("model", FANS)
def test_bls_calls_to_a_missing_model_from_one_worker_at_once(srv: openinfer.Server, model: str) -> None:
    x = np.arange(8, dtype=np.float32)
    targets = ["slow" if i % 3 == 0 else "nothere" for i in range(8)]
    got = fan(srv, model, x, targets=targets)
    missing = "error 2: Request for unknown model: 'nothere' is not found"
    assert got["answers"] == [e if t == "slow" else missing for e, t in zip(expected(x), targets)]


def test_more_calls_than_one_worker_may_have_in_flight_are_refused_alone(srv: openinfer.Server) -> None:
    x = np.arange(ONE_WORKER_LIMIT + 16, dtype=np.float32)
    got = fan(srv, "fan_async", x)  # each call sleeps 0.3 s: the first 64 are still in flight
    refused = [a for a in got["answers"] if isinstance(a, str)]
    assert len(refused) == 16, got["answers"]
    assert all(f"may have {ONE_WORKER_LIMIT} BLS calls in flight at once" in a for a in refused), refused
    answered = [a for a in got["answers"] if not isinstance(a, str)]
    assert answered == [e for e, a in zip(expected(x), got["answers"]) if not isinstance(a, str)]
    assert fan(srv, "fan_async", x[:2])["answers"] == expected(x[:2])  # the worker serves on


def _seen(what: str) -> int:
    seen = sys.modules.get("bls_workers_slow")
    return getattr(seen, what) if seen is not None else 0


@pytest.mark.parametrize("model", FANS)
def test_a_client_that_goes_away_cancels_the_bls_calls_of_its_worker(srv: openinfer.Server, model: str) -> None:
    held, cancelled = _seen("held"), _seen("cancelled")
    params = json.dumps({"hold": True})
    body = json.dumps({"parameters": {"target_params": params},
                       "inputs": [{"name": "IN", "shape": [8], "datatype": "FP32", "data": list(range(8))}]}).encode()
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                 % (model.encode(), len(body), body))
    wait_for(lambda: _seen("held") > held, "the model's first call held in the target", bound=60)
    sock.close()  # that call is cancelled, and so is each of the eight the model makes next
    wait_for(lambda: _seen("cancelled") > cancelled, "the held call cancelled", bound=60)
    x = np.array([1.0, 2.0], np.float32)
    assert fan(srv, model, x)["answers"] == expected(x)  # no call left holding the worker
    wait_for(lambda: _seen("held") == _seen("cancelled"), "every held call cancelled", bound=60)


def test_a_call_the_model_stops_waiting_for_is_cancelled(srv: openinfer.Server) -> None:
    before = _seen("cancelled")
    got = fan(srv, "fan_async", np.array([1.0], np.float32), give_up_after=0.2, target_params={"hold": True})
    assert got["answers"] == []
    wait_for(lambda: _seen("cancelled") > before, "the dropped call cancelled in the target", bound=30)


def test_a_worker_killed_with_bls_calls_in_flight_fails_only_its_own_request(srv: openinfer.Server) -> None:
    import os
    import signal
    import threading

    from tritonclient.utils import InferenceServerException

    held, failed = _seen("held"), []

    def held_calls() -> None:
        try:
            fan(srv, "fan_threads", np.arange(8, dtype=np.float32), target_params={"hold": True})
        except InferenceServerException as e:
            failed.append(e)

    client = threading.Thread(target=held_calls)
    client.start()
    wait_for(lambda: _seen("held") >= held + 8, "eight calls held in the target", bound=60)
    pid = sys.modules["bls_workers_slow"].pid
    os.kill(pid, signal.SIGKILL)
    client.join(60)
    assert len(failed) == 1 and f"(pid {pid})" in str(failed[0]), failed
    wait_for(lambda: _seen("held") == _seen("cancelled"), "every held call cancelled", bound=60)
    x = np.array([1.0, 2.0], np.float32)
    assert fan(srv, "fan_threads", x)["answers"] == expected(x)  # the worker replaced, or its sibling
