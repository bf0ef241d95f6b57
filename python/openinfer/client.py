"""The zero-copy numpy client for V2 servers (openinfer, Triton, anything that speaks the
binary tensor data extension over HTTP, or GRPCInferenceService over gRPC).

    client = openinfer.Client("http://127.0.0.1:8000")    # or "grpc://127.0.0.1:8001"
    out = client.infer("simple", {"INPUT0": a, "INPUT1": b})   # {"OUTPUT0": array, ...}

Requests leave from the arrays' own memory (one copy only to make a non-contiguous array
contiguous) and outputs are numpy arrays viewing the received body (HTTP) or message (gRPC);
the C core does the encoding, the socket I/O and the decoding without the GIL. Connections are
pooled and kept alive, so one Client is safe and fast to share between threads; `infer_async`
and `AsyncClient` keep many requests in flight, and over gRPC `stream_infer` pipelines a
sequence of requests on one ModelStreamInfer stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from . import _core
from .errors import InferenceServerError
from .model import datatype_of

try:
    from ml_dtypes import bfloat16 as _bfloat16  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    _bfloat16 = None

ArrayLike = Any


# gRPC status codes -> the HTTP statuses InferenceServerError carries on the HTTP side (the
# same-named pairs of DESIGN §5, the rest as the gRPC-HTTP gateway maps them).
# DEADLINE_EXCEEDED (4) raises TimeoutError instead.
_GRPC_TO_HTTP = {
    1: 499,  # CANCELLED
    2: 500,  # UNKNOWN
    3: 400,  # INVALID_ARGUMENT
    5: 404,  # NOT_FOUND
    6: 409,  # ALREADY_EXISTS
    7: 403,  # PERMISSION_DENIED
    8: 429,  # RESOURCE_EXHAUSTED
    9: 400,  # FAILED_PRECONDITION
    10: 409,  # ABORTED
    11: 400,  # OUT_OF_RANGE
    12: 501,  # UNIMPLEMENTED
    13: 500,  # INTERNAL
    14: 503,  # UNAVAILABLE
    15: 500,  # DATA_LOSS
    16: 401,  # UNAUTHENTICATED
}
_GRPC_DEADLINE_EXCEEDED = 4
_GRPC_NOT_FOUND = 5
# A ModelStreamInferResponse error carries a message and no code.
STREAM_ERROR_STATUS = 500


class Client:
    """A V2 client. `url` is ``http://host:port`` (port 8000 when absent) or
    ``grpc://host:port`` (port 8001 when absent; h2c). `timeout` (seconds) applies to each call
    unless the call gives its own; `max_connections` bounds the pool and the threads of
    `infer_async`. Every call works the same over both transports; gRPC statuses become the
    HTTP statuses of InferenceServerError (NOT_FOUND 404, INVALID_ARGUMENT 400, UNAVAILABLE 503,
    INTERNAL 500, UNIMPLEMENTED 501) and DEADLINE_EXCEEDED a TimeoutError."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float | None = None,
                 max_connections: int = 32) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "grpc"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}; expected http:// or grpc://")
        if not parts.hostname:
            raise ValueError(f"no host in URL {url!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self._grpc = parts.scheme == "grpc"
        if self._grpc and parts.path.strip("/"):
            raise ValueError(f"a gRPC URL has no path; got {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (8001 if self._grpc else 8000)
        self._prefix = "" if self._grpc else parts.path.rstrip("/")
        self.url = f"{parts.scheme}://{parts.netloc}{self._prefix}"
        self._connection_type: Any = _core.GrpcConnection if self._grpc else _core.HttpConnection
        self._timeout = timeout
        self._max = max_connections
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        # The pool: idle connections, how many exist, and who waits for one (at most
        # max_connections exist; a thread past that waits for one to come back).
        self._pool_changed = threading.Condition(self._lock)
        self._live = 0
        self._waiting = 0
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- connections ----------------------------------------------------------------------

    def _acquire(self) -> Any:
        if self._closed:
            raise RuntimeError("the client is closed")
        try:
            return self._idle.pop()  # atomic under the GIL: the common case takes no lock
        except IndexError:
            pass
        with self._pool_changed:
            while not self._idle and self._live >= self._max:
                self._waiting += 1
                self._pool_changed.wait()
                self._waiting -= 1
            if self._idle:
                return self._idle.pop()
            self._live += 1
        try:
            return self._connection_type(self._host, self._port)
        except BaseException:
            self._forget_connection()
            raise

    def _forget_connection(self) -> None:
        with self._pool_changed:
            self._live -= 1
            self._pool_changed.notify()

    def _release(self, conn: Any, healthy: bool) -> None:
        if healthy and not self._closed:
            self._idle.append(conn)
            if self._waiting:
                with self._pool_changed:
                    self._pool_changed.notify()
        else:
            conn.close()
            self._forget_connection()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        conn = self._acquire()
        healthy = False
        try:
            result = getattr(conn, method)(*args, **kwargs)
            healthy = True
            return result
        finally:
            self._release(conn, healthy)

    def _get(self, path: str, timeout: float | None) -> tuple[int, bytes]:
        return self._call("request", "GET", self._prefix + path, timeout=self._timeout_for(timeout))

    def _timeout_for(self, timeout: float | None) -> float | None:
        return self._timeout if timeout is None else timeout

    def _rpc(self, method: str, *args: Any, timeout: float | None) -> tuple[int, Any]:
        """A gRPC call: (grpc_status, value or grpc-message)."""
        return self._call(method, *args, timeout=self._timeout_for(timeout))

    # ---- health and metadata --------------------------------------------------------------

    def is_server_live(self, *, timeout: float | None = None) -> bool:
        if self._grpc:
            status, value = self._rpc("server_live", timeout=timeout)
            return status == 0 and bool(value)
        return self._get("/v2/health/live", timeout)[0] == 200

    def is_server_ready(self, *, timeout: float | None = None) -> bool:
        if self._grpc:
            status, value = self._rpc("server_ready", timeout=timeout)
            return status == 0 and bool(value)
        return self._get("/v2/health/ready", timeout)[0] == 200

    def is_model_ready(self, model: str, version: str | int | None = None, *, timeout: float | None = None) -> bool:
        if self._grpc:
            status, value = self._rpc("model_ready", model, _version(version), timeout=timeout)
            if status == _GRPC_NOT_FOUND:
                _raise_grpc(status, value)
            return status == 0 and bool(value)
        status, body = self._get(_model_path(model, version) + "/ready", timeout)
        if status == 404:
            raise InferenceServerError(status, _error_message(body))
        return status == 200

    def server_metadata(self, *, timeout: float | None = None) -> dict[str, Any]:
        if self._grpc:
            return _grpc_value(*self._rpc("server_metadata", timeout=timeout))
        return _json_or_raise(*self._get("/v2", timeout))

    def model_metadata(self, model: str, version: str | int | None = None, *,
                       timeout: float | None = None) -> dict[str, Any]:
        if self._grpc:
            return _grpc_value(*self._rpc("model_metadata", model, _version(version), timeout=timeout))
        return _json_or_raise(*self._get(_model_path(model, version), timeout))

    # ---- inference ------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None = None, *,
              version: str | int | None = None, request_id: str | None = None,
              parameters: Mapping[str, Any] | None = None, datatypes: Mapping[str, str] | None = None,
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Runs `model` on `inputs` (name -> array) and returns its outputs (name -> array),
        all of them or the `outputs` named. Datatypes follow the arrays' dtypes (object, bytes
        and str arrays are BYTES; ``ml_dtypes.bfloat16`` is BF16); `datatypes` overrides them
        by name (e.g. ``{"X": "BF16"}`` for a uint16 array of bfloat16 bits). Raises
        InferenceServerError with the server's status and message."""
        specs = [(name, *_tensor(name, value, datatypes)) for name, value in inputs.items()]
        if self._grpc:
            result = _grpc_value(*self._rpc(
                "infer", model, specs, list(outputs) if outputs is not None else None, _version(version),
                request_id, dict(parameters) if parameters else None, timeout=timeout,
            ))
            return _outputs(result)
        if parameters:
            params = dict(parameters)
            if outputs is None:
                params["binary_data_output"] = True
            params_json: bytes | None = json.dumps(params).encode()
        else:
            params_json = _ALL_BINARY if outputs is None else None
        status, result = self._call(
            "infer", self._prefix + _model_path(model, version) + "/infer", specs,
            list(outputs) if outputs is not None else None, request_id, params_json, self._timeout_for(timeout),
        )
        if status != 200:
            raise InferenceServerError(status, _error_message(result))
        return _outputs(result)

    def infer_async(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None = None,
                    **kwargs: Any) -> Future[dict[str, np.ndarray]]:
        """`infer` on the client's own threads (up to max_connections in flight); returns a
        concurrent.futures.Future."""
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self._max, thread_name_prefix="openinfer-client")
        return self._executor.submit(self.infer, model, inputs, outputs, **kwargs)

    def stream_infer(self, model: str, requests: Iterable[Mapping[str, ArrayLike]],
                     outputs: Sequence[str] | None = None, *, version: str | int | None = None,
                     parameters: Mapping[str, Any] | None = None, datatypes: Mapping[str, str] | None = None,
                     timeout: float | None = None, max_in_flight: int = 16) -> StreamResults:
        """Runs `model` on each input dict of `requests` over one gRPC ModelStreamInfer stream
        and returns an iterator of their outputs (name -> array), in the order of the
        requests, whatever order the server answers in. Up to `max_in_flight` requests are sent
        ahead of the results taken; `requests` is read lazily. A request that failed raises
        InferenceServerError (status STREAM_ERROR_STATUS: the stream carries only a message)
        from ``next()`` at its position, and iteration can go on with the next one. `timeout`
        bounds the whole stream. Use the iterator as a context manager, or call its close(), to
        end the stream early. gRPC only."""
        if not self._grpc:
            raise NotImplementedError(
                "stream_infer needs gRPC (ModelStreamInfer); HTTP has no streaming inference: "
                "use Client('grpc://host:port'), or infer_async for many requests in flight over HTTP")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        conn = self._acquire()
        try:
            stream = conn.stream(model, _version(version), list(outputs) if outputs is not None else None,
                                 dict(parameters) if parameters else None, self._timeout_for(timeout))
        except BaseException:
            self._release(conn, False)
            raise
        return StreamResults(self, conn, stream, iter(requests), datatypes, max_in_flight)

    # ---- life cycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Closes every pooled connection; calls in flight finish first."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<openinfer.Client {self.url}>"


class AsyncClient:
    """The same calls as `Client`, as coroutines (`await client.infer(...)`); the work runs on
    the client's threads, so many requests can be in flight from one event loop."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        self._client = Client(url, **kwargs)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), lambda: fn(*args, **kwargs))

    def _executor(self) -> ThreadPoolExecutor:
        c = self._client
        if c._executor is None:
            with c._lock:
                if c._executor is None:
                    c._executor = ThreadPoolExecutor(c._max, thread_name_prefix="openinfer-client")
        return c._executor

    async def infer(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None = None,
                    **kwargs: Any) -> dict[str, np.ndarray]:
        return await self._run(self._client.infer, model, inputs, outputs, **kwargs)

    async def is_server_live(self, **kwargs: Any) -> bool:
        return await self._run(self._client.is_server_live, **kwargs)

    async def is_server_ready(self, **kwargs: Any) -> bool:
        return await self._run(self._client.is_server_ready, **kwargs)

    async def is_model_ready(self, model: str, version: str | int | None = None, **kwargs: Any) -> bool:
        return await self._run(self._client.is_model_ready, model, version, **kwargs)

    async def server_metadata(self, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self._client.server_metadata, **kwargs)

    async def model_metadata(self, model: str, version: str | int | None = None, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self._client.model_metadata, model, version, **kwargs)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._client.close)

    async def stream_infer(self, model: str, requests: Iterable[Mapping[str, ArrayLike]],
                           outputs: Sequence[str] | None = None, **kwargs: Any) -> Any:
        """`Client.stream_infer` as an async iterator: ``async for out in await
        client.stream_infer(...)``; each result is awaited on the client's threads."""
        results = await self._run(self._client.stream_infer, model, requests, outputs, **kwargs)
        return _AsyncStreamResults(self, results)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class StreamResults(Iterator[dict[str, np.ndarray]]):
    """The outputs of `Client.stream_infer`, one dict per request in request order. Holds one
    pooled gRPC connection until exhausted or closed."""

    def __init__(self, client: Client, conn: Any, stream: Any, requests: Iterator[Mapping[str, ArrayLike]],
                 datatypes: Mapping[str, str] | None, max_in_flight: int) -> None:
        self._client = client
        self._conn = conn
        self._stream = stream
        self._requests = requests
        self._datatypes = datatypes
        self._window = max_in_flight
        self._sent = 0  # requests taken from `requests` (each has a position)
        self._next = 0  # the position whose result next() hands out
        self._ready: dict[int, dict[str, np.ndarray] | BaseException] = {}
        self._no_more = False  # `requests` is exhausted, or the stream can take no more
        self._ended = False  # the server's side is over

    def __iter__(self) -> StreamResults:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._conn is None:
            raise StopIteration
        try:
            while self._next not in self._ready:
                self._send_ahead()
                if self._next == self._sent and self._no_more:
                    self.close()
                    raise StopIteration
                if self._next not in self._ready:
                    self._receive()
        except (StopIteration, InferenceServerError):
            raise
        except BaseException:
            self._close(healthy=False)
            raise
        result = self._ready.pop(self._next)
        self._next += 1
        if isinstance(result, BaseException):
            raise result
        return result

    def _send_ahead(self) -> None:
        while not self._no_more and self._sent - self._next < self._window:
            if self._ended:
                self._no_more = True
                return
            try:
                inputs = next(self._requests)
            except StopIteration:
                self._no_more = True
                self._stream.close_send()
                return
            position = self._sent
            self._sent += 1
            try:
                specs = [(name, *_tensor(name, value, self._datatypes)) for name, value in inputs.items()]
                if not self._stream.send(specs, str(position)):
                    self._ended = True  # the server ended the stream: _receive settles what is left
            except (ValueError, TypeError) as e:  # this request could not be encoded: its own error
                self._ready[position] = e

    def _receive(self) -> None:
        got = self._stream.recv() if not self._ended or self._waiting() else None
        if got is None:
            self._ended = self._no_more = True
            status = self._stream.status() or (13, "the stream ended")
            for position in range(self._next, self._sent):
                if position not in self._ready:
                    self._ready[position] = _grpc_error(*status) if status[0] != 0 else InferenceServerError(
                        STREAM_ERROR_STATUS, f"the stream ended without answering request {position}")
            return
        error, result = got
        position = self._position_of(result[2])
        if position < 0:
            return  # an answer to no request of ours: dropped
        if error is not None:
            self._ready[position] = InferenceServerError(STREAM_ERROR_STATUS, error)
        else:
            self._ready[position] = _outputs(result)

    def _waiting(self) -> bool:
        return any(p not in self._ready for p in range(self._next, self._sent))

    def _position_of(self, request_id: str | None) -> int:
        """Our requests carry their position as id; an answer without one goes to the oldest
        request still waiting."""
        if request_id is not None and request_id.isdigit():
            p = int(request_id)
            if self._next <= p < self._sent and p not in self._ready:
                return p
        for p in range(self._next, self._sent):
            if p not in self._ready:
                return p
        return -1

    def _close(self, healthy: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            self._stream.close()
        finally:
            self._client._release(conn, healthy)

    def close(self) -> None:
        """Ends the stream (cancelling it when requests are still in flight) and gives the
        connection back to the client's pool."""
        self._close(healthy=True)

    def __enter__(self) -> StreamResults:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_conn", None) is not None:
            self._close(healthy=False)


class _AsyncStreamResults:
    def __init__(self, client: AsyncClient, results: StreamResults) -> None:
        self._client = client
        self._results = results

    def __aiter__(self) -> _AsyncStreamResults:
        return self

    async def __anext__(self) -> dict[str, np.ndarray]:
        # StopIteration cannot cross a Future: a sentinel marks the end instead.
        result = await self._client._run(next, self._results, None)
        if result is None:
            raise StopAsyncIteration
        return result

    async def aclose(self) -> None:
        await self._client._run(self._results.close)


def _version(version: str | int | None) -> str | None:
    return None if version in (None, "") else str(version)


def _outputs(result: tuple[Any, ...]) -> dict[str, np.ndarray]:
    """The outputs of a decoded (model_name, model_version, id, outputs, datatypes)."""
    types = result[4]
    return {name: _bf16_view(arr) if types[name] == "BF16" else arr for name, arr in result[3].items()}


def _grpc_error(status: int, message: str) -> BaseException:
    if status == _GRPC_DEADLINE_EXCEEDED:
        return TimeoutError(f"timed out: {message}" if message else "timed out (DEADLINE_EXCEEDED)")
    return InferenceServerError(_GRPC_TO_HTTP.get(status, 500), message)


def _raise_grpc(status: int, message: str) -> None:
    raise _grpc_error(status, message)


def _grpc_value(status: int, value: Any) -> Any:
    if status != 0:
        _raise_grpc(status, value)
    return value


@functools.lru_cache(maxsize=1024)  # quoting per call shows in the sequential request rate
def _model_path(model: str, version: str | int | None) -> str:
    path = "/v2/models/" + quote(model, safe="")
    return path + f"/versions/{quote(str(version), safe='')}" if version not in (None, "") else path


# Request parameters asking for every output as binary tensor data.
_ALL_BINARY = b'{"binary_data_output":true}'

# numpy dtype -> V2 datatype, filled as dtypes are seen (datatype_of is the authority).
_DATATYPE_OF: dict[np.dtype[Any], str] = {}


def _tensor(name: str, value: ArrayLike, datatypes: Mapping[str, str] | None) -> tuple[str, ArrayLike]:
    """(datatype, value) for one input; the C core makes the array contiguous (once) and
    serializes BYTES."""
    if datatypes and name in datatypes:
        return datatypes[name], value
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    dt = arr.dtype
    datatype = _DATATYPE_OF.get(dt)
    if datatype is None:
        datatype = _DATATYPE_OF[dt] = datatype_of(dt)
    return datatype, arr


def _bf16_view(bits: np.ndarray) -> np.ndarray:
    """BF16 arrives as uint16 bit patterns: viewed as ``ml_dtypes.bfloat16`` when that is
    installed (no copy), else left as the bits."""
    return bits.view(_bfloat16) if _bfloat16 is not None else bits


def _error_message(body: bytes) -> str:
    try:
        message = json.loads(body)["error"]
        return message if isinstance(message, str) else json.dumps(message)
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace") or "(empty response)"


def _json_or_raise(status: int, body: bytes) -> dict[str, Any]:
    if status != 200:
        raise InferenceServerError(status, _error_message(body))
    result: dict[str, Any] = json.loads(body)
    return result
