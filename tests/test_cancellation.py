"""Cancellation and deadlines (issue 12 item 4, issue 17 item 9): a client that goes away —
closes its HTTP connection, resets its gRPC stream, lets its gRPC deadline pass, presses
Ctrl-C in openinfer.Client — cancels its request. A queued one never reaches the model; a
running one's model sees ``request.is_cancelled()``. Triton's ``timeout`` parameter bounds the
time in the queue. Everything is proven by what the model received, not by clocks: a gate
model records each call and blocks until the test opens it (every wait bounded)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from prometheus_client import parser as prometheus_parser
from conftest import encode_request, infer_body, pending_requests, wait_for

import openinfer
from openinfer import Model, Request, Tensor

BOUND = 30.0  # no wait in these tests lasts longer; a bound for a hung test, not a measurement
# A client deadline that must pass while its request is in the model: long enough for the
# request to get there on a slow machine (under AddressSanitizer, loaded), short for a test.
DEADLINE = 5.0


class Gate:
    """A model that records the INPUT0 value of every call it receives and blocks until the
    test opens the gate. With `polls`, it also stops as soon as its request is cancelled and
    records that it saw so."""

    def __init__(self, polls: bool = True) -> None:
        self.polls = polls
        self.cond = threading.Condition()
        self.calls: list[int] = []
        self.saw_cancel: list[int] = []
        self.finished: list[int] = []
        self.gate = threading.Event()

    def fn(self, inputs: dict[str, np.ndarray], request: Request) -> dict[str, np.ndarray]:
        value = int(inputs["INPUT0"][0])
        with self.cond:
            self.calls.append(value)
            self.cond.notify_all()
        end = time.monotonic() + BOUND
        while not self.gate.wait(0.005) and time.monotonic() < end:
            if self.polls and request.is_cancelled():
                with self.cond:
                    self.saw_cancel.append(value)
                    self.cond.notify_all()
                break
        with self.cond:
            self.finished.append(value)
            self.cond.notify_all()
        return {"OUTPUT0": inputs["INPUT0"]}

    def wait(self, what: str, value: int) -> None:
        """Waits until `value` is in the list `what` (calls, saw_cancel, finished)."""
        with self.cond:
            assert self.cond.wait_for(lambda: value in getattr(self, what), BOUND), (
                f"{value} never reached {what}: calls {self.calls}, saw_cancel {self.saw_cancel}")


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def served(gate: Gate) -> Iterator[openinfer.Server]:
    srv = openinfer.serve(models=[Model("gate", gate.fn, **ONE_INT)], http_port=0, log=False, threads=2)
    try:
        yield srv
    finally:
        gate.gate.set()
        srv.stop()


def gate_request(value: int, **parameters: Any) -> bytes:
    extra = {"parameters": parameters} if parameters else {}
    return encode_request("POST", "/v2/models/gate/infer", infer_body(
        [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}], **extra))


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One whole HTTP response (Content-Length framed) from a raw socket."""
    sock.settimeout(BOUND)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(head.split()[1]), body


def send(port: int, value: int, **parameters: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    sock.sendall(gate_request(value, **parameters))
    return sock


def start_running(srv: openinfer.Server, gate: Gate, value: int = 1) -> tuple[threading.Thread, list[Any]]:
    """A client that stays: its request occupies the model's only instance until the gate
    opens. Returns its thread and where its (status, body) will be."""
    result: list[Any] = []

    def run() -> None:
        sock = send(srv.http_port, value)
        result.append(read_response(sock))
        sock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    gate.wait("calls", value)
    return t, result


def fresh_request_answered(srv: openinfer.Server, value: int) -> None:
    sock = send(srv.http_port, value)
    status, body = read_response(sock)
    sock.close()
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [value]


def settle() -> None:
    """Lets requests just written reach the server's queue. Not an assertion: a request that
    had not arrived when its client left never reaches the model either."""
    time.sleep(0.3)


# ---- HTTP/1.1 -----------------------------------------------------------------------------


def test_http_clients_that_close_never_reach_the_model(served: openinfer.Server, gate: Gate) -> None:
    """Issue 17 item 9: ten clients give up on queued requests; none of them runs, and a
    fresh request waits for at most the one running call."""
    runner, result = start_running(served, gate)
    abandoned = [send(served.http_port, 100 + i) for i in range(10)]
    settle()
    for sock in abandoned:
        sock.close()
    settle()
    gate.gate.set()
    runner.join(BOUND)
    assert result and result[0][0] == 200
    fresh_request_answered(served, 2)
    assert gate.calls == [1, 2]
    # Statistics and metrics count the ten as failures, cancelled ones, and nothing else.
    stats = served.statistics("gate")["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (2, 10)
    assert failures(served) == {"CANCELED": 10}


def failures(srv: openinfer.Server) -> dict[str, float]:
    """nv_inference_request_failure by reason, the reasons with any."""
    text = requests.get(srv.metrics_url, timeout=BOUND).text
    family = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}["nv_inference_request_failure"]
    return {s.labels["reason"]: s.value for s in family.samples if s.value}


def test_http_close_tells_the_running_model(served: openinfer.Server, gate: Gate) -> None:
    sock = send(served.http_port, 5)
    gate.wait("calls", 5)
    sock.close()
    gate.wait("saw_cancel", 5)  # the model stopped before the gate opened
    assert not gate.gate.is_set()
    gate.gate.set()  # the fresh request runs to the end at once
    fresh_request_answered(served, 6)
    assert gate.calls == [5, 6]


def test_reset_connection_mid_queue_keeps_the_server_serving(served: openinfer.Server, gate: Gate) -> None:
    """An abortive close (RST) of queued requests, and pipelined ones behind them."""
    runner, _ = start_running(served, gate)
    socks = []
    for i in range(5):
        sock = socket.create_connection(("127.0.0.1", served.http_port), timeout=BOUND)
        sock.sendall(gate_request(200 + i) + gate_request(300 + i))  # the second waits its turn
        socks.append(sock)
    settle()
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
    settle()
    gate.gate.set()
    runner.join(BOUND)
    fresh_request_answered(served, 2)
    assert gate.calls == [1, 2]


# ---- Triton's "timeout" parameter ---------------------------------------------------------


def test_json_timeout_parameter_refuses_a_request_that_waited_too_long(served: openinfer.Server, gate: Gate) -> None:
    """"timeout" (microseconds) bounds the wait in the queue: past it the request is
    answered with Triton's 503 "Request timeout expired" and never runs."""
    runner, _ = start_running(served, gate)
    waiting = send(served.http_port, 7, timeout=100_000)  # 0.1 s; the gate holds it longer
    generous = send(served.http_port, 8, timeout=600_000_000)  # 10 minutes
    wait_for(lambda: pending_requests(served, "gate") == 2, "both queued")
    time.sleep(0.5)  # from when both were seen queued, five times the short timeout: it has passed
    gate.gate.set()
    runner.join(BOUND)
    assert read_response(waiting) == (503, b'{"error":"Request timeout expired"}')
    status, body = read_response(generous)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [8]
    assert gate.calls == [1, 8]
    for s in (waiting, generous):
        s.close()
    assert failures(served) == {"REJECTED": 1}


@pytest.mark.parametrize("value, got", [('"soon"', "string"), ("-5", "-5"), ("1.5", "1.5"), ("true", "boolean")])
def test_json_timeout_parameter_of_the_wrong_type(served: openinfer.Server, value: str, got: str) -> None:
    body = ('{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[1]}],'
            '"parameters":{"timeout":%s}}' % value).encode()
    sock = socket.create_connection(("127.0.0.1", served.http_port), timeout=BOUND)
    sock.sendall(encode_request("POST", "/v2/models/gate/infer", body))
    status, reply = read_response(sock)
    assert status == 400
    message = json.loads(reply)["error"]
    assert "parameters.timeout" in message and "non-negative integer" in message and got in message, message
    # The connection that got the 400 still serves.
    sock.sendall(encode_request("GET", "/v2/health/live"))
    assert read_response(sock)[0] == 200
    sock.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_timeout_argument(served: openinfer.Server, gate: Gate, protocol: str) -> None:
    """tritonclient's infer(timeout=us) sends Triton's parameter (a JSON integer over HTTP, an
    int64_param over gRPC); it gets Triton's status and message."""
    if protocol == "http":
        import tritonclient.http as tc
        url = f"127.0.0.1:{served.http_port}"
    else:
        import tritonclient.grpc as tc  # type: ignore[no-redef]
        url = f"127.0.0.1:{served.grpc_port}"
    errors: list[Any] = []
    connected, go = threading.Event(), threading.Event()

    def late() -> None:  # tritonclient.http's client stays on the thread that made it
        client = tc.InferenceServerClient(url)
        inp = tc.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([7], dtype=np.int32))
        if client.is_server_live():  # connected before the request is sent
            connected.set()
        go.wait(BOUND)
        try:
            client.infer("gate", [inp], timeout=100_000)
        except Exception as e:  # tritonclient.utils.InferenceServerException
            errors.append(e)
        client.close()

    t = threading.Thread(target=late, daemon=True)
    t.start()
    assert connected.wait(BOUND)
    runner, _ = start_running(served, gate)
    go.set()
    wait_for(lambda: pending_requests(served, "gate") == 1, "the request queued")
    time.sleep(0.5)  # from when it was seen queued, five times the 0.1 s it may wait: it has passed
    gate.gate.set()
    runner.join(BOUND)
    t.join(BOUND)
    assert len(errors) == 1
    assert "Request timeout expired" in str(errors[0])
    assert errors[0].status() in ("503", "StatusCode.UNAVAILABLE"), errors[0].status()
    assert gate.calls == [1]


def test_grpc_timeout_parameter_of_the_wrong_type(served: openinfer.Server, gate: Gate, grpc_stubs: Any) -> None:
    gate.gate.set()
    import grpc

    pb = grpc_stubs.pb
    req = pb.ModelInferRequest(model_name="gate")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    req.parameters["timeout"].string_param = "soon"
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=BOUND)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "invalid value type for 'timeout' parameter, expected int64_param."
        gate_open(stub, req)


def gate_open(stub: Any, req: Any) -> None:
    """The same request with an int64 timeout is served (the gate has no other caller)."""
    req.parameters["timeout"].int64_param = 600_000_000
    assert stub.ModelInfer(req, timeout=BOUND).model_name == "gate"


# ---- gRPC ---------------------------------------------------------------------------------


def test_tritonclient_grpc_client_timeout_drops_queued_requests(served: openinfer.Server, gate: Gate) -> None:
    """Issue 17 item 9 over gRPC: ten tritonclient.grpc calls with client_timeout=0.5 s give
    up while queued; none runs."""
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    runner, _ = start_running(served, gate)
    outcomes: list[str] = []
    lock = threading.Lock()

    def give_up(value: int) -> None:
        client = tc.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        inp = tc.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], dtype=np.int32))
        try:
            client.infer("gate", [inp], client_timeout=0.5)
            outcome = "answered"
        except InferenceServerException as e:
            outcome = str(e.status())
        client.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=give_up, args=(100 + i,), daemon=True) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert outcomes == ["StatusCode.DEADLINE_EXCEEDED"] * 10
    settle()
    gate.gate.set()
    runner.join(BOUND)
    fresh_request_answered(served, 2)
    assert gate.calls == [1, 2]


def test_grpcio_deadline_and_cancel(served: openinfer.Server, gate: Gate, grpc_stubs: Any) -> None:
    """grpcio deadlines (grpc-timeout, answered DEADLINE_EXCEEDED by the server) and
    future.cancel() (RST_STREAM) on queued calls: none reaches the model."""
    import grpc

    pb = grpc_stubs.pb

    def request(value: int) -> Any:
        req = pb.ModelInferRequest(model_name="gate")
        req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        req.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
        return req

    runner, _ = start_running(served, gate)
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        deadlines = [stub.ModelInfer.future(request(100 + i), timeout=0.5) for i in range(5)]
        cancelled = [stub.ModelInfer.future(request(200 + i), timeout=BOUND) for i in range(5)]
        settle()
        for f in cancelled:
            assert f.cancel()
        for f in deadlines:
            with pytest.raises(grpc.RpcError) as e:
                f.result(timeout=BOUND)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        settle()
        gate.gate.set()
        runner.join(BOUND)
        assert stub.ModelInfer(request(2), timeout=BOUND).model_name == "gate"
    assert gate.calls == [1, 2]


def test_grpc_deadline_tells_the_running_model(served: openinfer.Server, gate: Gate, grpc_stubs: Any) -> None:
    import grpc

    pb = grpc_stubs.pb
    req = pb.ModelInferRequest(model_name="gate")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.array([4], dtype=np.int32).tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:  # a deadline far past the request's way to the model
            stub.ModelInfer(req, timeout=DEADLINE)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    gate.wait("saw_cancel", 4)
    assert not gate.gate.is_set()


def test_grpc_stream_reset_cancels_its_requests(served: openinfer.Server, gate: Gate, grpc_stubs: Any) -> None:
    """Cancelling a ModelStreamInfer stream (RST_STREAM) cancels every request it has in flight:
    the running one's model is told, the queued ones never run."""
    import grpc

    pb = grpc_stubs.pb

    def requests() -> Iterator[Any]:
        for value in (10, 11, 12):
            req = pb.ModelInferRequest(model_name="gate")
            req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
            req.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
            yield req
        gate.wait("saw_cancel", 10)  # keep the stream open until the end of the test

    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), timeout=BOUND)
        gate.wait("calls", 10)
        settle()
        call.cancel()
        gate.wait("saw_cancel", 10)
    gate.gate.set()
    fresh_request_answered(served, 2)
    assert gate.calls == [10, 2]


# ---- shutdown -----------------------------------------------------------------------------


def test_stop_waits_only_for_clients_still_there() -> None:
    """stop() does not wait for a model running for a client that has gone (the model ignores
    cancellation here), nor for queued requests whose clients have gone."""
    stubborn = Gate(polls=False)
    srv = openinfer.serve(models=[Model("gate", stubborn.fn, **ONE_INT)], http_port=0, log=False, threads=1)
    try:
        first = send(srv.http_port, 1)
        stubborn.wait("calls", 1)
        queued = [send(srv.http_port, 100 + i) for i in range(3)]
        settle()
        first.close()
        for sock in queued:
            sock.close()
        settle()
        stopper = threading.Thread(target=srv.stop, kwargs={"timeout": BOUND}, daemon=True)
        stopper.start()
        stopper.join(BOUND)
        assert not stopper.is_alive(), "stop() waited for a client that had gone"
        assert stubborn.finished == [] and not stubborn.gate.is_set()  # the model still ran
    finally:
        stubborn.gate.set()
        stubborn.wait("finished", 1)
        srv.stop()
    assert stubborn.calls == [1]


# ---- openinfer.Client ---------------------------------------------------------------------


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    import openinfer
    client = openinfer.Client(sys.argv[1])
    print("calling", flush=True)
    try:
        client.infer("gate", {"INPUT0": np.array([int(sys.argv[2])], dtype=np.int32)})
        print("answered", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    finally:
        # Closed before exit, as a program should: no thread of the interrupted call is still
        # winding down while LeakSanitizer stops the threads at exit (its tracer crashed once).
        client.close()
""")


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_ctrl_c_in_client_infer_raises_and_cancels(served: openinfer.Server, gate: Gate, scheme: str) -> None:
    """SIGINT to a process blocked in Client.infer: KeyboardInterrupt comes while the model
    is still blocked (not when it returns), and the connection it closes cancels the call."""
    url = served.url if scheme == "http" else f"grpc://127.0.0.1:{served.grpc_port}"
    value = 40 if scheme == "http" else 41
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(value)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        gate.wait("calls", value)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=BOUND)
    finally:
        child.kill()
    assert out.split() == ["calling", "KeyboardInterrupt"], err
    assert child.returncode == 0, err  # also: no leak report under the sanitizers
    gate.wait("saw_cancel", value)
    assert not gate.gate.is_set()


def test_client_timeout_cancels_the_request(served: openinfer.Server, gate: Gate) -> None:
    """A Client call that runs out of time closes its connection: the model is told."""
    from openinfer.client import DEFAULT_TIMEOUT

    assert openinfer.Client(served.url)._timeout == DEFAULT_TIMEOUT == 60.0
    client = openinfer.Client(served.url, timeout=DEADLINE)  # far past the request's way to the model
    with pytest.raises(TimeoutError):
        client.infer("gate", {"INPUT0": np.array([3], dtype=np.int32)})
    gate.wait("saw_cancel", 3)
    client.close()


def test_request_is_cancelled_is_false_for_a_present_client(served: openinfer.Server, gate: Gate) -> None:
    """A client that waits gets its answer; its model never saw a cancellation."""
    runner, result = start_running(served, gate, 21)
    gate.gate.set()
    runner.join(BOUND)
    assert result[0][0] == 200
    assert gate.saw_cancel == []


# ---- dynamic batching ---------------------------------------------------------------------


def test_batcher_leaves_out_requests_whose_clients_left() -> None:
    """With dynamic batching, the requests of clients that left are taken out of the queue
    and out of the batch being formed: the next batch holds only the one still awaited."""
    batches: list[list[int]] = []
    cond = threading.Condition()
    gate = threading.Event()

    def batched(inputs: dict[str, np.ndarray], request: Request) -> dict[str, np.ndarray]:
        with cond:
            batches.append([int(v) for v in inputs["INPUT0"][:, 0]])
            cond.notify_all()
        gate.wait(BOUND)
        return {"OUTPUT0": inputs["INPUT0"]}

    model = Model("gate", batched, inputs=[Tensor("INPUT0", "INT32", [-1, 1])],
                  outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])], max_batch_size=8, dynamic_batching=True)
    srv = openinfer.serve(models=[model], http_port=0, log=False, threads=2)

    def request(value: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=BOUND)
        sock.sendall(encode_request("POST", "/v2/models/gate/infer", infer_body(
            [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [value]}])))
        return sock

    try:
        first = request(1)
        with cond:
            assert cond.wait_for(lambda: batches == [[1]], BOUND)
        gone = [request(100 + i) for i in range(4)]
        stays = request(2)
        more_gone = [request(200 + i) for i in range(3)]
        settle()
        for sock in gone + more_gone:
            sock.close()
        settle()
        gate.set()
        assert read_response(first)[0] == 200
        status, body = read_response(stays)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2]
        assert batches == [[1], [2]]
        first.close()
        stays.close()
    finally:
        gate.set()
        srv.stop()


def test_request_argument_of_a_model_function() -> None:
    """Only a function with a `request` parameter gets one (keyword, beside `parameters`);
    its is_cancelled() is what the server's flag says."""
    seen: list[Any] = []

    def fn(inputs: dict[str, np.ndarray], parameters: dict[str, Any], request: Request) -> dict[str, Any]:
        seen.append((parameters, request.is_cancelled()))
        return {"OUTPUT0": inputs["INPUT0"]}

    model = Model("m", fn, **ONE_INT)
    x = np.array([1], dtype=np.int32)
    model.handler({"INPUT0": x}, b'{"timeout": 5, "k": 1}', ("OUTPUT0",), lambda: False)
    model.handler({"INPUT0": x}, None, ("OUTPUT0",), lambda: True)
    assert seen == [({"k": 1}, False), ({}, True)]  # "timeout" is Triton's, not the model's
    plain = Model("p", lambda inputs: {"OUTPUT0": inputs["INPUT0"]}, **ONE_INT)
    assert plain.handler({"INPUT0": x}, None, ("OUTPUT0",), lambda: True)["OUTPUT0"] is x
