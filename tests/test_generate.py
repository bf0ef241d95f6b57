"""Triton's generate extension: POST .../generate (flat JSON in and out) and .../generate_stream
(Server-Sent Events), read by real clients (raw sockets, http.client through openinfer.Client),
with the model's own observations proving when events leave and when generators stop."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import Model, Tensor

from conftest import Observed
from test_cancellation import read_response

BOUND = 30.0


gated = Observed()
flood = Observed()
endless = Observed()


def _gated(inputs: dict[str, np.ndarray], request: openinfer.Request) -> Iterator[dict[str, np.ndarray]]:
    """One response, then nothing until the test opens the gate (or the client goes), then a
    second one."""
    try:
        gated.note(produced=1)
        yield {"OUTPUT0": np.array([1], dtype=np.int32)}
        deadline = time.monotonic() + BOUND
        while not gated.gate.wait(0.005) and not request.is_cancelled():
            assert time.monotonic() < deadline, "the test never opened the gate"
        gated.note(produced=2)
        yield {"OUTPUT0": np.array([2], dtype=np.int32)}
        gated.note(finished=True)
    except GeneratorExit:
        gated.note(closed=True)
        raise


def _flood(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """64 KiB responses as fast as it may, up to 20000 (1.25 GiB): only back-pressure keeps
    the server's memory small."""
    block = np.zeros(16384, dtype=np.int32)
    try:
        for i in range(20_000):
            flood.note(produced=i + 1)
            yield {"OUTPUT0": block}
        flood.note(finished=True)
    except GeneratorExit:
        flood.note(closed=True)
        raise


def _endless(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """A token every millisecond until the server closes it (or 100000 of them: a bound, so
    that even a server that never does lets the test end)."""
    try:
        for i in range(100_000):
            endless.note(produced=i + 1)
            yield {"OUTPUT0": np.array([i], dtype=np.int32)}
            time.sleep(0.001)
        endless.note(finished=True)
    except GeneratorExit:
        endless.note(closed=True)
        raise


def _halfway(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    yield {"OUTPUT0": np.array([0], dtype=np.int32)}
    yield {"OUTPUT0": np.array([1], dtype=np.int32)}
    raise ValueError("ran out of ideas")


def _fails_at_once(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    raise openinfer.InferenceServerError(422, "INPUT0 must be positive")
    yield {}  # a generator all the same


def _params(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.array([json.dumps(parameters, sort_keys=True).encode()], dtype=object)}


def _not_utf8(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.array([b"\xff"], dtype=object)}


def _not_utf8_gen(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    yield _not_utf8(inputs)


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


@pytest.fixture(scope="module")
def served() -> Iterator[openinfer.Server]:
    models = [
        Model("gated", _gated, **ONE_INT),
        Model("flood", _flood, **ONE_INT),
        Model("endless", _endless, **ONE_INT),
        Model("gen_halfway", _halfway, **ONE_INT),
        Model("gen_fails", _fails_at_once, **ONE_INT),
        Model("gen_params", _params, inputs=[Tensor("INPUT0", "INT32", [-1])],
              outputs=[Tensor("OUTPUT0", "BYTES", [1])]),
        Model("not_utf8", _not_utf8, inputs=[Tensor("INPUT0", "INT32", [-1])],
              outputs=[Tensor("OUTPUT0", "BYTES", [1])]),
        Model("not_utf8_gen", _not_utf8_gen, inputs=[Tensor("INPUT0", "INT32", [-1])],
              outputs=[Tensor("OUTPUT0", "BYTES", [1])]),
    ]
    srv = openinfer.serve(openinfer.examples_path(), models=models, http_port=0, log=False, threads=2)
    try:
        yield srv
    finally:
        gated.gate.set()
        srv.stop()


def post(port: int, path: str, body: bytes, extra: str = "") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
    return sock


class SseReader:
    """Reads a chunked Server-Sent Events answer off a raw socket, one event at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        assert self.headers["transfer-encoding"] == "chunked"
        self.body = b""
        self.ended = False

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, "the connection closed early"
        self.buf += chunk

    def _chunk(self) -> None:
        while b"\r\n" not in self.buf:
            self._fill()
        size_line, _, rest = self.buf.partition(b"\r\n")
        size = int(size_line, 16)
        while len(rest) < size + 2:
            self._fill()
            size_line, _, rest = self.buf.partition(b"\r\n")
        self.body += rest[:size]
        self.buf = rest[size + 2:]
        if size == 0:
            self.ended = True

    def event(self) -> dict[str, Any] | None:
        """The next event, or None at the end of the answer."""
        while b"\n\n" not in self.body:
            if self.ended:
                assert self.body == b""
                return None
            self._chunk()
        event, _, self.body = self.body.partition(b"\n\n")
        assert event.startswith(b"data: "), event
        return json.loads(event[6:])


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# ---- streaming ---------------------------------------------------------------------------------


def test_first_event_arrives_before_the_generator_finishes(served: openinfer.Server) -> None:
    gated.reset()
    sock = post(served.http_port, "/v2/models/gated/generate_stream", body(INPUT0=[5]))
    with sock:
        sse = SseReader(sock)
        assert sse.status == 200 and sse.headers["content-type"] == "text/event-stream; charset=utf-8"
        first = sse.event()
        # The model is held at the gate, which only the test opens: the event left before the end.
        assert first == {"OUTPUT0": 1, "model_name": "gated", "model_version": "1"}
        assert not gated.finished and gated.produced == 1
        gated.gate.set()
        assert sse.event() == {"OUTPUT0": 2, "model_name": "gated", "model_version": "1"}
        assert sse.event() is None
    gated.wait_for(lambda: gated.finished, "finished")


def test_client_generate_stream_iterates_tiny_gen(served: openinfer.Server) -> None:
    with openinfer.Client(served.url) as client:
        with client.generate_stream("tiny_gen", {"PROMPT": "it was the best of", "MAX_TOKENS": 4,
                                                 "DELAY_MS": 1}) as events:
            got = list(events)
    assert [e["INDEX"] for e in got] == [0, 1, 2, 3]
    assert "".join(e["TEXT"] for e in got) == "times it was the "
    assert all(e["model_name"] == "tiny_gen" and e["model_version"] == "1" for e in got)


def test_async_client_generate_stream(served: openinfer.Server) -> None:
    async def run() -> list[dict[str, Any]]:
        async with openinfer.AsyncClient(served.url) as client:
            stream = await client.generate_stream("repeat_int32", {"IN": [7, 8, 9], "DELAY": [0, 0, 0], "WAIT": 0})
            return [event async for event in stream]

    got = asyncio.run(run())
    assert [(e["IDX"], e["OUT"]) for e in got] == [(0, 7), (1, 8), (2, 9)]


def test_a_generator_that_raises_half_way_streams_then_sends_the_error_event(served: openinfer.Server) -> None:
    with post(served.http_port, "/v2/models/gen_halfway/generate_stream", body(INPUT0=[1])) as sock:
        sse = SseReader(sock)
        assert sse.status == 200
        assert sse.event()["OUTPUT0"] == 0
        assert sse.event()["OUTPUT0"] == 1
        error = sse.event()
        assert error is not None and set(error) == {"error"}
        assert "ValueError: ran out of ideas" in error["error"]
        assert sse.event() is None
    with openinfer.Client(served.url) as client, pytest.raises(openinfer.InferenceServerError) as err:
        list(client.generate_stream("gen_halfway", {"INPUT0": [1]}))
    assert "ran out of ideas" in err.value.message


def test_an_error_before_any_response_is_the_status_of_the_stream(served: openinfer.Server) -> None:
    with post(served.http_port, "/v2/models/gen_fails/generate_stream", body(INPUT0=[1])) as sock:
        sse = SseReader(sock)
        assert sse.status == 422
        assert sse.event() == {"error": "INPUT0 must be positive"}
        assert sse.event() is None


def test_closing_the_connection_closes_the_generator(served: openinfer.Server) -> None:
    gated.reset()
    sock = post(served.http_port, "/v2/models/gated/generate_stream", body(INPUT0=[1]))
    assert SseReader(sock).event() is not None
    sock.close()  # the model sees it, goes on to its next yield, and is closed there
    gated.wait_for(lambda: gated.closed, "closed")
    assert not gated.finished


def test_a_client_that_never_reads_holds_the_generator_back(served: openinfer.Server) -> None:
    """A client that sends its request and reads nothing: the model is paused at its yield once
    the socket's buffers and the server's bound are full, rather than filling the server's
    memory with 20000 x 64 KiB. Then the client leaves, and the generator is closed."""
    flood.reset()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(BOUND)
    sock.connect(("127.0.0.1", served.http_port))
    payload = body(INPUT0=[1])
    sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    # Wait for production to stall (it must, long before the 20000th response).
    deadline, last, still = time.monotonic() + BOUND, -1, 0
    while time.monotonic() < deadline and still < 4 and not flood.finished:
        time.sleep(0.25)
        still = still + 1 if flood.produced == last else 0
        last = flood.produced
    assert not flood.finished and still >= 4, f"the generator never paused: {flood.produced} produced"
    # Kernel buffers on both ends plus the server's 1 MiB bound: a few MiB of 64 KiB responses.
    assert flood.produced < 1000, flood.produced
    sock.close()
    flood.wait_for(lambda: flood.closed, "closed")
    with openinfer.Client(served.url) as client:
        assert client.is_server_live()


# ---- generate (one response) ------------------------------------------------------------------


def test_generate_answers_a_flat_object(served: openinfer.Server) -> None:
    a = list(range(16))
    with openinfer.Client(served.url) as client:
        got = client.generate("simple", {"INPUT0": a, "INPUT1": np.ones(16, dtype=np.int32)}, request_id="r1")
    assert got == {"OUTPUT0": [x + 1 for x in a], "OUTPUT1": [x - 1 for x in a], "id": "r1",
                   "model_name": "simple", "model_version": "1"}


def test_generate_maps_other_keys_to_parameters(served: openinfer.Server) -> None:
    with openinfer.Client(served.url) as client:
        got = client.generate("gen_params", {"INPUT0": 3, "temperature": 0.5, "mode": "fast", "greedy": True},
                              parameters={"top_k": 4}, version=1)
    assert json.loads(got["OUTPUT0"]) == {"greedy": True, "mode": "fast", "temperature": 0.5, "top_k": 4}


def test_generate_on_a_decoupled_model_needs_exactly_one_response(served: openinfer.Server) -> None:
    with openinfer.Client(served.url) as client:
        assert client.generate("repeat_int32", {"IN": [4], "DELAY": [0], "WAIT": 0})["OUT"] == 4
        with pytest.raises(openinfer.InferenceServerError) as err:
            client.generate("repeat_int32", {"IN": [4, 5], "DELAY": [0, 0], "WAIT": 0})
    assert err.value.status == 500
    assert err.value.message == ("generate expects model to produce exactly 1 response, use generate stream for "
                                 "model that generates various number of responses")


NOT_ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
           "various number of responses")


def test_generate_fails_at_the_second_response_and_closes_the_generator(served: openinfer.Server) -> None:
    """Issue 29 item 6: /generate on a model that keeps producing is answered Triton's error as
    soon as a second response shows there cannot be exactly one, and the model is cancelled
    rather than left to run to its end; the connection serves on."""
    endless.reset()
    with post(served.http_port, "/v2/models/endless/generate", body(INPUT0=[1])) as sock:
        status, answer = read_response(sock)
        assert (status, json.loads(answer)) == (500, {"error": NOT_ONE})
        endless.wait_for(lambda: endless.closed, "closed")
        assert not endless.finished
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200


def test_generate_on_tiny_gen_with_huge_max_tokens_frees_its_instance(served: openinfer.Server) -> None:
    """2^31 - 1 tokens of tiny_gen (its one instance held for weeks had the generator run to
    its end): the error comes at once, the instance is free for the next request, and
    generate_stream still streams every token; one token through /generate still works."""
    huge = {"PROMPT": "it was the best of", "MAX_TOKENS": 2**31 - 1, "DELAY_MS": 1}
    with openinfer.Client(served.url, timeout=BOUND) as client:
        with pytest.raises(openinfer.InferenceServerError) as err:
            client.generate("tiny_gen", huge)
        assert (err.value.status, err.value.message) == (500, NOT_ONE)
        with client.generate_stream("tiny_gen", {**huge, "MAX_TOKENS": 6}) as events:
            assert [e["INDEX"] for e in events] == [0, 1, 2, 3, 4, 5]
        one = client.generate("tiny_gen", {**huge, "MAX_TOKENS": 1})
    assert (one["INDEX"], one["TEXT"]) == (0, "times ")


NOT_UTF8 = ("output 'OUTPUT0': BYTES element 0 is not valid UTF-8 and cannot be sent as JSON; request the output "
            "with \"binary_data\": true")


@pytest.mark.parametrize("model", ["not_utf8", "not_utf8_gen"])
def test_a_response_that_cannot_be_json_is_answered_with_why(served: openinfer.Server, model: str) -> None:
    """The one response of /generate fails to encode: the client gets that error, not a
    complaint about the number of responses."""
    with openinfer.Client(served.url) as client, pytest.raises(openinfer.InferenceServerError) as err:
        client.generate(model, {"INPUT0": [1]})
    assert (err.value.status, err.value.message) == (400, NOT_UTF8)
    with post(served.http_port, f"/v2/models/{model}/generate_stream", body(INPUT0=[1])) as sock:
        sse = SseReader(sock)
        assert sse.status == 400
        assert sse.event() == {"error": NOT_UTF8}
        assert sse.event() is None


@pytest.mark.parametrize("payload, status, message", [
    (b'{"IN": [1], "DELAY": [1], "WAIT": 1, "extra": [1, 2]}', 400,
     "parameter 'extra' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"IN": [1], "DELAY": [1], "WAIT": 1, "extra": {"a": 1}}', 400,
     "parameter 'extra' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"IN": ["one"], "DELAY": [1], "WAIT": 1}', 400, "input 'IN': element 0: expected a number for INT32, got string"),
    (b'{"IN": [[1]], "DELAY": [1], "WAIT": 1}', 400,
     "input 'IN': expected a value or a flat array of values, got a nested array"),
    (b'{"IN": [1], "DELAY": [1], "WAIT": [1, 2]}', 400,
     "The schema can not convert input 'WAIT' to tensor with proper shape"),
    (b'{"IN": [1], "DELAY": [1], "WAIT": 1, "parameters": 3}', 400,
     "Expected JSON object for keyword: 'parameters', got a number"),
    (b'{"IN": [1], "DELAY": [1], "WAIT": 1, "parameters": {"p": null}}', 400,
     "Converting keyword: 'parameters': parameter 'p' has invalid type. It should be either 'int', 'bool', or "
     "'string'."),
    (b'{"IN": [1], "DELAY": [1]', 400, "failed to parse the generate request: malformed JSON"),
    (b'[1, 2]', 400, "the generate request must be a JSON object, got an array"),
])
@pytest.mark.parametrize("kind", ["generate", "generate_stream"])
def test_bad_generate_requests_are_400_naming_the_field(served: openinfer.Server, payload: bytes, status: int,
                                                        message: str, kind: str) -> None:
    with post(served.http_port, f"/v2/models/repeat_int32/{kind}", payload) as sock:
        head, _, rest = b"", b"", b""
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += sock.recv(65536)
        assert int(head.split()[1]) == status
        assert json.loads(rest) == {"error": message}
        # The connection stays usable.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_missing_inputs_and_wrong_methods(served: openinfer.Server) -> None:
    with openinfer.Client(served.url) as client:
        with pytest.raises(openinfer.InferenceServerError) as err:
            client.generate("repeat_int32", {"IN": [1]})
        assert err.value.status == 400 and "DELAY" in err.value.message
        with pytest.raises(openinfer.InferenceServerError) as err:
            client.generate("no_such_model", {"IN": [1]})
        assert err.value.status == 404
    with post(served.http_port, "/v2/models/repeat_int32/generate", b"{}", "Content-Encoding: gzip\r\n") as sock:
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400") and b"Unsupported content-encoding" in answer
    sock = socket.create_connection(("127.0.0.1", served.http_port), timeout=BOUND)
    with sock:
        sock.sendall(b"GET /v2/models/repeat_int32/generate HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 405")


def test_a_grpc_client_cannot_generate(served: openinfer.Server) -> None:
    with openinfer.Client(f"grpc://127.0.0.1:{served.grpc_port}") as client, pytest.raises(ValueError, match="HTTP"):
        client.generate("simple", {})


def test_an_http10_client_gets_the_events_until_the_connection_closes(served: openinfer.Server) -> None:
    payload = body(IN=[3, 4], DELAY=[0, 0], WAIT=0)
    sock = socket.create_connection(("127.0.0.1", served.http_port), timeout=BOUND)
    with sock:
        sock.sendall(b"POST /v2/models/repeat_int32/generate_stream HTTP/1.0\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head and b"chunked" not in head
    events = [json.loads(e[6:]) for e in rest.split(b"\n\n") if e]
    assert [(e["IDX"], e["OUT"]) for e in events] == [(0, 3), (1, 4)]
