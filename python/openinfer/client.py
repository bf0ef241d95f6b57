"""The zero-copy numpy client for V2 servers (openinfer, Triton, anything that speaks the
binary tensor data extension).

    client = openinfer.Client("http://127.0.0.1:8000")
    out = client.infer("simple", {"INPUT0": a, "INPUT1": b})   # {"OUTPUT0": array, ...}

Requests leave from the arrays' own memory (one copy only to make a non-contiguous array
contiguous) and outputs are numpy arrays viewing the received body; the C core does the
encoding, the socket I/O and the decoding without the GIL. Connections are pooled and kept
alive, so one Client is safe and fast to share between threads; `infer_async` and
`AsyncClient` keep many requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
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


class Client:
    """A V2 HTTP client. `url` is ``http://host:port`` (port 8000 when absent). `timeout`
    (seconds) applies to each call unless the call gives its own; `max_connections` bounds
    the pool and the threads of `infer_async`."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float | None = None,
                 max_connections: int = 32) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme != "http":
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}; expected http://")
        if not parts.hostname:
            raise ValueError(f"no host in URL {url!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self._host = parts.hostname
        self._port = parts.port or 8000
        self._prefix = parts.path.rstrip("/")
        self.url = f"http://{parts.netloc}{self._prefix}"
        self._timeout = timeout
        self._max = max_connections
        self._idle: list[_core.HttpConnection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- connections ----------------------------------------------------------------------

    def _acquire(self) -> _core.HttpConnection:
        if self._closed:
            raise RuntimeError("the client is closed")
        self._slots.acquire()
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            return _core.HttpConnection(self._host, self._port)
        except BaseException:
            self._slots.release()
            raise

    def _release(self, conn: _core.HttpConnection, healthy: bool) -> None:
        if healthy and not self._closed:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

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

    # ---- health and metadata --------------------------------------------------------------

    def is_server_live(self, *, timeout: float | None = None) -> bool:
        return self._get("/v2/health/live", timeout)[0] == 200

    def is_server_ready(self, *, timeout: float | None = None) -> bool:
        return self._get("/v2/health/ready", timeout)[0] == 200

    def is_model_ready(self, model: str, version: str | int | None = None, *, timeout: float | None = None) -> bool:
        status, body = self._get(_model_path(model, version) + "/ready", timeout)
        if status == 404:
            raise InferenceServerError(status, _error_message(body))
        return status == 200

    def server_metadata(self, *, timeout: float | None = None) -> dict[str, Any]:
        return _json_or_raise(*self._get("/v2", timeout))

    def model_metadata(self, model: str, version: str | int | None = None, *,
                       timeout: float | None = None) -> dict[str, Any]:
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
        params = dict(parameters or {})
        if outputs is None:
            params["binary_data_output"] = True
        status, result = self._call(
            "infer", self._prefix + _model_path(model, version) + "/infer", specs,
            list(outputs) if outputs is not None else None, request_id,
            json.dumps(params).encode() if params else None, self._timeout_for(timeout),
        )
        if status != 200:
            raise InferenceServerError(status, _error_message(result))
        types = result[4]
        return {name: _bf16_view(arr) if types[name] == "BF16" else arr for name, arr in result[3].items()}

    def infer_async(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None = None,
                    **kwargs: Any) -> Future[dict[str, np.ndarray]]:
        """`infer` on the client's own threads (up to max_connections in flight); returns a
        concurrent.futures.Future."""
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self._max, thread_name_prefix="openinfer-client")
        return self._executor.submit(self.infer, model, inputs, outputs, **kwargs)

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

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _model_path(model: str, version: str | int | None) -> str:
    path = "/v2/models/" + quote(model, safe="")
    return path + f"/versions/{quote(str(version), safe='')}" if version not in (None, "") else path


def _tensor(name: str, value: ArrayLike, datatypes: Mapping[str, str] | None) -> tuple[str, ArrayLike]:
    """(datatype, value) for one input; the C core makes the array contiguous (once) and
    serializes BYTES."""
    if datatypes and name in datatypes:
        return datatypes[name], value
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    return datatype_of(arr.dtype), arr


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
