"""The client side of Triton's generate extension (``POST /v2/models/{m}/generate`` and
``/generate_stream``): flat JSON in, flat JSON out, and the stream read as Server-Sent Events
one event at a time, so that a caller sees each response as soon as the model yields it.

Plain ``http.client`` over its own connection: generate carries small JSON documents, and a
stream holds its connection for as long as the model produces."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import numpy as np

from .errors import InferenceServerError


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _value(v: Any) -> Any:
    """A JSON value for one input: numpy arrays and scalars become lists and numbers, bytes
    become text."""
    if isinstance(v, np.ndarray):
        v = v.reshape(-1).tolist()
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8")
    return v


def request_body(inputs: Mapping[str, Any], parameters: Mapping[str, Any] | None, request_id: str | None) -> bytes:
    body: dict[str, Any] = {name: _value(v) for name, v in inputs.items()}
    if parameters:
        body["parameters"] = dict(parameters)
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body).encode()


def path(prefix: str, model: str, version: str | None, kind: str) -> str:
    p = f"{prefix}/v2/models/{quote(model, safe='')}"
    if version:
        p += f"/versions/{quote(version, safe='')}"
    return f"{p}/{kind}"


def connect(host: str, port: int, unix: bool, timeout: float | None) -> http.client.HTTPConnection:
    if unix:
        return _UnixConnection(host, timeout)
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _error(status: int, body: bytes) -> InferenceServerError:
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace") or http.client.responses.get(status, "error")
    return InferenceServerError(status, str(message))


def generate(conn: http.client.HTTPConnection, url_path: str, body: bytes) -> dict[str, Any]:
    try:
        conn.request("POST", url_path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise _error(resp.status, data)
    result: dict[str, Any] = json.loads(data)
    return result


class GenerateStream(Iterator[dict[str, Any]]):
    """The responses of one ``generate_stream`` request, each a dict as the server sent it, in
    order, as they arrive. An error the model raised after some responses ends the iteration
    with `InferenceServerError`. Closing the stream (or leaving a ``with`` block) before its end
    closes the connection, which cancels the request on the server."""

    def __init__(self, conn: http.client.HTTPConnection, url_path: str, body: bytes) -> None:
        self._conn = conn
        self._resp: http.client.HTTPResponse | None = None
        try:
            conn.request("POST", url_path, body, {"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        self._status = resp.status
        if resp.status != 200 and "text/event-stream" not in (resp.getheader("Content-Type") or ""):
            data = resp.read()
            conn.close()
            raise _error(resp.status, data)
        self._resp = resp

    def __iter__(self) -> GenerateStream:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._resp is None:
            raise StopIteration
        data: list[bytes] = []
        while True:
            line = self._resp.readline()
            if not line:  # the stream ended
                self.close()
                if data:
                    break
                raise StopIteration
            line = line.rstrip(b"\r\n")
            if line == b"":
                if data:
                    break
                continue
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
        event: dict[str, Any] = json.loads(b"\n".join(data))
        if set(event) == {"error"}:
            self.close()
            raise InferenceServerError(self._status if self._status != 200 else 500, str(event["error"]))
        return event

    def close(self) -> None:
        if self._resp is not None:
            self._resp = None
            self._conn.close()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
