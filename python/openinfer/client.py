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

On the same host (a loopback URL, and a server that lists the system_shared_memory extension)
large tensors skip the socket: inputs are staged in shared-memory regions the client registers
once, and outputs come back as arrays viewing those regions. Arrays that already live in a
registered `SharedMemoryRegion` are read where they are, and `out=` names arrays there that
outputs are written into. Anything else (a remote server, a refusal) takes the socket path.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import ipaddress
import json
import math
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from . import _core, _display
from . import generate as _gen
from . import shm as _shm
from .errors import InferenceServerError
from .model import datatype_of, numpy_dtype
from .shm import SharedMemoryRegion

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
# A ModelStreamInferResponse error carries a message and no code.
STREAM_ERROR_STATUS = 500

# Seconds a call may take when neither the Client nor the call says: tritonclient.http's
# network timeout. A call never waits forever on a server that does not answer.
DEFAULT_TIMEOUT = 60.0
# How long `Client._repr_html_` waits for the server: a notebook cell must not hang on one.
_DISPLAY_TIMEOUT = 2.0


class Client:
    """A V2 client. `url` is ``http://host:port`` (port 8000 when absent) or
    ``grpc://host:port`` (port 8001 when absent; h2c), or a server's Unix-domain socket:
    ``unix:PATH`` / ``unix:///abs/path`` for HTTP, ``grpc+unix:PATH`` for gRPC (the recommended
    transport on one host: the server acts with this process's own user and groups). `timeout`
    (seconds, `DEFAULT_TIMEOUT` = 60 unless given; None for no limit) applies to each call
    unless the call gives its own: a call that runs out of time raises TimeoutError and closes
    its connection, which cancels the request on the server (dropped from the queue, or the
    model told). Ctrl-C in a blocking call raises KeyboardInterrupt at once and cancels the
    request the same way. `max_connections` bounds the pool and the threads of
    `infer_async`. Every call works the same over both transports; gRPC statuses become the
    HTTP statuses of InferenceServerError (NOT_FOUND 404, INVALID_ARGUMENT 400, UNAVAILABLE 503,
    INTERNAL 500, UNIMPLEMENTED 501) and DEADLINE_EXCEEDED a TimeoutError. `shared_memory`: None
    (the default) uses system shared memory when the URL's host is a loopback address and the
    server offers it; True tries it whatever the host; False never does.

    ``https://`` and ``grpcs://`` URLs speak TLS (1.2 or later): the server's certificate is
    checked against `ca_file` (PEM; the system's CAs when None) and must name the URL's host,
    unless `verify` is False; `cert_file` and `key_file` (PEM; the key may be in `cert_file`)
    are the client certificate a mutual-TLS server asks for."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float | None = DEFAULT_TIMEOUT,
                 max_connections: int = 32, shared_memory: bool | None = None,
                 ca_file: str | os.PathLike[str] | None = None, cert_file: str | os.PathLike[str] | None = None,
                 key_file: str | os.PathLike[str] | None = None, verify: bool = True) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        unix = _unix_url(url)
        if unix is not None:  # a Unix socket: the server is on this host by definition
            self._grpc, self._host = unix
            self._port = 0
            self._prefix = ""
            self.url = f"{'grpc+' if self._grpc else ''}unix://{self._host}"
            tls = False
        else:
            parts = urlsplit(url if "://" in url else "http://" + url)
            if parts.scheme not in ("http", "grpc", "https", "grpcs"):
                raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}; expected http://, https://, "
                                 "grpc://, grpcs://, unix:PATH or grpc+unix:PATH")
            if not parts.hostname:
                raise ValueError(f"no host in URL {url!r}")
            self._grpc = parts.scheme in ("grpc", "grpcs")
            tls = parts.scheme in ("https", "grpcs")
            if self._grpc and parts.path.strip("/"):
                raise ValueError(f"a gRPC URL has no path; got {url!r}")
            self._host = parts.hostname
            self._port = parts.port or (8001 if self._grpc else 8000)
            self._prefix = "" if self._grpc else parts.path.rstrip("/")
            self.url = f"{parts.scheme}://{parts.netloc}{self._prefix}"
        if not tls and (ca_file or cert_file or key_file):
            raise ValueError(f"ca_file, cert_file and key_file are for https:// and grpcs:// URLs; got {url!r}")
        paths = [None if p is None else os.fspath(p) for p in (ca_file, cert_file, key_file)]
        # Given to every connection of the pool: (CA, certificate, key, verify), or None.
        self._conn_kw: dict[str, Any] = {"tls": (*paths, bool(verify))} if tls else {}
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
        self._shm_mode = shared_memory
        self._shm_pool: _shm.Pool | bool | None = None  # None: not decided yet; False: not used
        self._regions: dict[str, SharedMemoryRegion] = {}  # registered explicitly, by name
        self._owned: list[SharedMemoryRegion] = []  # made by shared_memory(), closed with us
        self._io: dict[tuple[str, str], dict[str, Any]] = {}  # model metadata, for outputs
        self._out_bytes: dict[tuple[str, str, str], int] = {}  # largest output seen
        self._cuda: bool | None = None  # None: not decided yet
        self._cuda_regions: dict[bytes, str] = {}  # CUDA IPC handle -> registered region name
        _clients.add(self)

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
            return self._connection_type(self._host, self._port, **self._conn_kw)
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
        """False also for a model or version the server does not serve (as Triton answers)."""
        if self._grpc:
            status, value = self._rpc("model_ready", model, _version(version), timeout=timeout)
            return status == 0 and bool(value)
        return self._get(_model_path(model, version) + "/ready", timeout)[0] == 200

    def server_metadata(self, *, timeout: float | None = None) -> dict[str, Any]:
        if self._grpc:
            return _grpc_value(*self._rpc("server_metadata", timeout=timeout))
        return _json_or_raise(*self._get("/v2", timeout))

    def model_metadata(self, model: str, version: str | int | None = None, *,
                       timeout: float | None = None) -> dict[str, Any]:
        if self._grpc:
            return _grpc_value(*self._rpc("model_metadata", model, _version(version), timeout=timeout))
        return _json_or_raise(*self._get(_model_path(model, version), timeout))

    def repository_index(self, ready: bool = False, *, timeout: float | None = None) -> list[dict[str, str]]:
        """The server's model repository index (``POST /v2/repository/index``, gRPC
        RepositoryIndex): one dict per model version with name, version, state and reason (a
        model with no version loaded: name only); `ready` keeps only READY versions."""
        if self._grpc:
            value = _grpc_value(*self._rpc("unary", _shm.GRPC_SERVICE + "RepositoryIndex",
                                           b"\x10\x01" if ready else b"", timeout=timeout))
            return _decode_index(value)
        body = json.dumps({"ready": ready}).encode()
        status, reply = self._call("request", "POST", self._prefix + "/v2/repository/index", body,
                                   "Content-Type: application/json\r\n", timeout=self._timeout_for(timeout))
        if status != 200:
            raise InferenceServerError(status, _error_message(reply))
        result: list[dict[str, str]] = json.loads(reply)
        return result

    # ---- inference ------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None = None, *,
              version: str | int | None = None, request_id: str | None = None,
              parameters: Mapping[str, Any] | None = None, datatypes: Mapping[str, str] | None = None,
              timeout: float | None = None, out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Runs `model` on `inputs` (name -> array) and returns its outputs (name -> array),
        all of them or the `outputs` named. Datatypes follow the arrays' dtypes (object, bytes
        and str arrays are BYTES; ``ml_dtypes.bfloat16`` is BF16); `datatypes` overrides them
        by name (e.g. ``{"X": "BF16"}`` for a uint16 array of bfloat16 bits). `out` names
        arrays in registered shared-memory regions that outputs are written into (the result
        then views those regions). Raises InferenceServerError with the server's status and
        message."""
        # Whether shared memory may serve this client is asked of the server on the first call
        # large enough to gain from it (small calls never pay for the question).
        shm = self._shm_pool is not False and self._shm_mode is not False
        if (out or self._regions or any(_is_cuda_tensor(v) for v in inputs.values())
                or (shm and self._worth_shm(model, version, inputs) and self._use_shm())):
            result = self._infer_shm(model, inputs, outputs, version, request_id, parameters, datatypes,
                                     timeout, out or {})
            if result is not None:
                return result
        specs = [(name, *_tensor(name, _host_value(value), datatypes)) for name, value in inputs.items()]
        if self._grpc:
            result = _grpc_value(*self._rpc(
                "infer", model, specs, list(outputs) if outputs is not None else None, _version(version),
                request_id, dict(parameters) if parameters else None, timeout=timeout,
            ))
            arrays = _outputs(result)
            if shm or out:
                self._learn(model, version, arrays, out or {})
            return arrays
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
        arrays = _outputs(result)
        if shm or out:
            self._learn(model, version, arrays, out or {})
        return arrays

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
        bounds the whole stream (no limit unless given here: a stream may live long). Use the iterator as a context manager, or call its close(), to
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
                                 dict(parameters) if parameters else None, timeout)
        except BaseException:
            self._release(conn, False)
            raise
        return StreamResults(self, conn, stream, iter(requests), datatypes, max_in_flight)

    # ---- shared memory --------------------------------------------------------------------

    def generate(self, model: str, inputs: Mapping[str, Any], *, version: str | int | None = None,
                 parameters: Mapping[str, Any] | None = None, request_id: str | None = None,
                 timeout: float | None = None) -> dict[str, Any]:
        """Triton's generate extension: `inputs` maps input names to values (scalars, lists or
        numpy arrays; the server shapes them from the model's declaration), `parameters` go to
        the model as request parameters. Returns the flat answer: each output by name (a
        single element as a value, else a list) with model_name and model_version. HTTP only."""
        conn = self._generate_connection(timeout)
        return _gen.generate(conn, _gen.path(self._prefix, model, _version(version), "generate"),
                             _gen.request_body(inputs, parameters, request_id))

    def generate_stream(self, model: str, inputs: Mapping[str, Any], *, version: str | int | None = None,
                        parameters: Mapping[str, Any] | None = None, request_id: str | None = None,
                        timeout: float | None = None) -> _gen.GenerateStream:
        """`generate` over ``generate_stream``: an iterator of the answers, each as soon as the
        model (a decoupled one: many answers per request) produces it. Close it, or leave its
        ``with`` block, to stop early: the server then closes the model's generator."""
        conn = self._generate_connection(timeout)
        return _gen.GenerateStream(conn, _gen.path(self._prefix, model, _version(version), "generate_stream"),
                                   _gen.request_body(inputs, parameters, request_id))

    def _generate_connection(self, timeout: float | None) -> Any:
        if self._grpc:
            raise ValueError(f"generate is an HTTP extension; this client speaks gRPC ({self.url})")
        return _gen.connect(self._host, self._port, self._port == 0, self._timeout_for(timeout))

    def register(self, region: SharedMemoryRegion) -> SharedMemoryRegion:
        """Registers `region` with the server under region.name; arrays viewing it are then
        passed in place. Raises InferenceServerError when the server refuses."""
        self._shm_call("/register", region.name, {"key": region.key, "offset": 0, "byte_size": region.byte_size})
        with self._lock:
            self._regions[region.name] = region
        return region

    def unregister(self, region: SharedMemoryRegion | str) -> None:
        """Unregisters a region (by object or name) from the server."""
        name = region if isinstance(region, str) else region.name
        with self._lock:
            self._regions.pop(name, None)
        self._shm_call("/unregister", name, None)

    def shared_memory(self, byte_size: int, *, name: str | None = None) -> SharedMemoryRegion:
        """A new `SharedMemoryRegion` of `byte_size` bytes, registered with the server; closed
        (and unregistered) with the client."""
        region = SharedMemoryRegion(byte_size, name=name)
        try:
            self.register(region)
        except BaseException:
            region.close()
            raise
        with self._lock:
            self._owned.append(region)
        return region

    def shared_memory_status(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """The server's system shared-memory regions (every client's): name, key, offset and
        byte_size of each."""
        if self._grpc:
            value = _grpc_value(*self._rpc("unary", _shm.GRPC_SERVICE + "SystemSharedMemoryStatus", b"",
                                           timeout=timeout))
            return _shm.decode_status(value)
        status, body = self._get("/v2/systemsharedmemory/status", timeout)
        if status != 200:
            raise InferenceServerError(status, _error_message(body))
        result: list[dict[str, Any]] = json.loads(body)
        return result

    def _grpc_unary(self, method: str, payload: bytes, timeout: float | None) -> tuple[int, Any]:
        """A unary call by name with a message given as bytes: (grpc status, reply or message).
        After close() (a pooled region released late) on a connection of its own."""
        if not self._closed:
            return self._call("unary", _shm.GRPC_SERVICE + method, payload, timeout=timeout)
        conn = _core.GrpcConnection(self._host, self._port, **self._conn_kw)
        try:
            return conn.unary(_shm.GRPC_SERVICE + method, payload, timeout=timeout)
        finally:
            conn.close()

    def _shm_call(self, action: str, name: str, body: dict[str, Any] | None) -> None:
        if self._grpc:
            if action == "/register":
                assert body is not None
                payload = _shm.encode_register(name, body["key"], body["offset"], body["byte_size"])
                method = "SystemSharedMemoryRegister"
            else:
                payload, method = _shm.encode_name(name), "SystemSharedMemoryUnregister"
            _grpc_value(*self._grpc_unary(method, payload, self._timeout))
            return
        path = f"{self._prefix}/v2/systemsharedmemory/region/{quote(name, safe='')}{action}"
        data = json.dumps(body).encode() if body is not None else b""
        headers = "Content-Type: application/json\r\n"
        if self._closed:  # a pooled region released after close(): a connection of its own
            conn = _core.HttpConnection(self._host, self._port, **self._conn_kw)
            try:
                status, reply = conn.request("POST", path, data, headers, timeout=self._timeout)
            finally:
                conn.close()
        else:
            status, reply = self._call("request", "POST", path, data, headers, timeout=self._timeout)
        if status != 200:
            raise InferenceServerError(status, _error_message(reply))

    def _use_shm(self) -> bool:
        """Decides once whether the pool is used: a loopback host (or shared_memory=True), this
        Python able to make shm, and a server that lists the extension."""
        if self._shm_pool is None:
            decided = self._decide_shm()  # calls the server: not under the lock
            with self._lock:
                if self._shm_pool is None:
                    self._shm_pool, decided = decided, None
            if isinstance(decided, _shm.Pool):  # another thread decided first
                decided.close()
        return self._shm_pool is not False

    def _worth_shm(self, model: str, version: str | int | None, inputs: Mapping[str, ArrayLike]) -> bool:
        """Whether the pool pays off for this call: small tensors cost less through the socket
        (the C path) than through the pool's bookkeeping in Python."""
        total = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
        if total >= SHM_MIN_BYTES:
            return True
        key = (model, str(version or ""))
        return any(n >= SHM_MIN_BYTES for k, n in self._out_bytes.items() if k[:2] == key)

    def _decide_shm(self) -> _shm.Pool | bool:
        if self._shm_mode is False or not _shm.available():
            return False
        if self._shm_mode is None and not _is_loopback(self._host):
            return False
        try:
            extensions = self.server_metadata().get("extensions", [])
        except (InferenceServerError, OSError, ValueError):
            return False
        if "system_shared_memory" not in extensions:
            return False
        return _shm.Pool(lambda n, k, size: self._shm_call("/register", n, {"key": k, "offset": 0, "byte_size": size}),
                         lambda n: self._shm_call("/unregister", n, None), self._max + 8)

    def _disable_shm(self) -> None:
        """The server refused the pool's regions (or lost them): socket path from now on."""
        with self._lock:
            pool, self._shm_pool = self._shm_pool, False
        if isinstance(pool, _shm.Pool):
            pool.close()

    def _model_io(self, model: str, version: str | int | None, timeout: float | None) -> dict[str, Any]:
        key = (model, str(version or ""))
        meta = self._io.get(key)
        if meta is None:
            meta = self.model_metadata(model, version, timeout=timeout)
            self._io[key] = meta
        return meta

    def _region_of(self, arr: np.ndarray) -> tuple[SharedMemoryRegion, int] | None:
        for region in list(self._regions.values()):
            off = region.offset_of(arr)
            if off is not None:
                return region, off
        return None

    def _infer_shm(self, model: str, inputs: Mapping[str, ArrayLike], outputs: Sequence[str] | None,
                   version: str | int | None, request_id: str | None, parameters: Mapping[str, Any] | None,
                   datatypes: Mapping[str, str] | None, timeout: float | None,
                   out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """infer through shared memory; None when this call must take the socket path."""
        pool = self._shm_pool if isinstance(self._shm_pool, _shm.Pool) else None
        tensors: list[dict[str, Any]] = []
        staged: list[tuple[dict[str, Any], Any, int]] = []  # (tensor, data, nbytes)
        for name, value in inputs.items():
            if _is_cuda_tensor(value):
                params = self._cuda_params(value)
                if params is not None:  # read by the server from the GPU, through CUDA IPC
                    tensors.append({"name": name, "datatype": (datatypes or {}).get(name) or _torch_datatype(value),
                                    "shape": list(value.shape), "parameters": params})
                    continue
            datatype, arr = _tensor(name, _host_value(value), datatypes)
            arr = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
            t: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
            tensors.append(t)
            where = self._region_of(arr) if datatype != "BYTES" else None
            if where is not None:
                t["parameters"] = _shm_params(where[0].name, arr.nbytes, where[1])
            elif pool is None:
                return None
            elif datatype == "BYTES":
                data = _shm.serialize_bytes(arr)
                staged.append((t, data, len(data)))
            else:
                data = np.ascontiguousarray(arr)
                staged.append((t, data, data.nbytes))
        meta = self._model_io(model, version, timeout)
        names = list(outputs) if outputs is not None else [o["name"] for o in meta.get("outputs", [])]
        types = {o["name"]: o.get("datatype") for o in meta.get("outputs", [])}
        requested: list[dict[str, Any]] = []
        placed: dict[str, tuple[int, int]] = {}  # outputs in the pool slot: name -> (offset, bytes)
        want: list[tuple[dict[str, Any], str, int]] = []
        total_in = sum(n for _, _, n in staged)
        for name in names:
            o: dict[str, Any] = {"name": name}
            requested.append(o)
            if name in out:
                target = out[name]
                where = self._region_of(target) if isinstance(target, np.ndarray) else None
                if where is None:
                    raise ValueError(f"out[{name!r}] must be an array in a registered SharedMemoryRegion")
                o["parameters"] = _shm_params(where[0].name, target.nbytes, where[1])
            elif pool is None:
                return None
            else:
                want.append((o, name, self._estimate(model, version, name, meta, inputs, total_in)))
        # Outputs reuse the inputs' space (inputs are dead once the model has run, and the
        # server copies aside whatever still reads from a window before writing it); an output
        # that is its input, at the same offset, is then not copied at all.
        need = max(sum(_align(n) for _, _, n in staged), sum(_align(n) for _, _, n in want))
        slot = None
        if staged or want:
            assert pool is not None
            try:
                slot = pool.acquire(need)
            except InferenceServerError:
                self._disable_shm()  # the server refuses registrations: never mind
                return None
            if slot is None:
                return None
        try:
            off = 0
            for t, data, n in staged:
                assert slot is not None
                dst = slot.region.array((n,), np.uint8, off)
                if isinstance(data, np.ndarray):
                    np.copyto(dst, data.reshape(-1).view(np.uint8))
                else:
                    dst[:] = np.frombuffer(data, dtype=np.uint8)
                t["parameters"] = _shm_params(slot.region.name, n, off)
                off += _align(n)
            off = 0
            for o, name, n in want:
                assert slot is not None
                o["parameters"] = _shm_params(slot.region.name, n, off)
                placed[name] = (off, n)
                off += _align(n)
            body: dict[str, Any] = {"inputs": tensors, "outputs": requested}
            if request_id is not None:
                body["id"] = request_id
            if parameters:
                body["parameters"] = dict(parameters)
            try:
                if self._grpc:
                    status, reply = self._grpc_unary(
                        "ModelInfer", _shm.encode_infer_request(body, model, str(version or "")),
                        self._timeout_for(timeout))
                    if status != 0:  # as over HTTP below; a deadline raises here
                        error = _grpc_error(status, reply)
                        if isinstance(error, TimeoutError):
                            raise error
                        status, reply = error.status, json.dumps({"error": error.message}).encode()  # type: ignore[attr-defined]
                    else:
                        status, reply = 200, _shm.decode_infer_response(reply)
                else:
                    status, reply = self._call("request", "POST", self._prefix + _model_path(model, version) + "/infer",
                                               json.dumps(body).encode(), "Content-Type: application/json\r\n",
                                               timeout=self._timeout_for(timeout))
            except BaseException:
                # No answer (a timeout, a lost connection): the server may still write this
                # call's outputs into the slot later, so it never serves another call.
                if slot is not None and pool is not None:
                    pool.discard(slot)
                    slot = None
                raise
            if status != 200:
                message = _error_message(reply)
                if status == 400 and "do not fit shared_memory_byte_size" in message:
                    return None  # an output outgrew its guess: this call goes by socket, and teaches us
                if status == 400 and slot is not None and f"Unable to find shared memory region: '{slot.region.name}'" in message:
                    self._disable_shm()  # the server lost our regions (restarted?)
                    return None
                raise InferenceServerError(status, message)
            return self._shm_outputs(reply if isinstance(reply, dict) else json.loads(reply), model, version, pool,
                                     slot, placed, out, types)
        finally:
            if slot is not None and pool is not None:
                pool.release(slot)

    def _shm_outputs(self, reply: dict[str, Any], model: str, version: str | int | None, pool: _shm.Pool | None,
                     slot: _shm.Slot | None, placed: dict[str, tuple[int, int]], out: Mapping[str, np.ndarray],
                     types: dict[str, Any]) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = {}
        for o in reply.get("outputs", []):
            name, datatype, shape = o["name"], o["datatype"], tuple(o["shape"])
            count = math.prod(shape)
            # What was written into shared memory: the answer names its datatype and shape (as
            # tritonserver's does), which give its size, except for BYTES (then the space set aside).
            reserved = out[name].nbytes if name in out else placed[name][1] if name in placed else 0
            nbytes = reserved if datatype == "BYTES" else count * numpy_dtype(datatype).itemsize
            key = (model, str(version or ""), name)
            self._out_bytes[key] = max(self._out_bytes.get(key, 0), nbytes)
            if (name not in out and name not in placed) or "raw" in o or "data" in o:  # in the reply
                if datatype == "BYTES":
                    arr = (_shm.deserialize_bytes(o["raw"], count) if "raw" in o
                           else np.array([x.encode() if isinstance(x, str) else x for x in o.get("data", [])],
                                         dtype=object))
                elif "raw" in o:
                    arr = np.frombuffer(o["raw"], dtype=numpy_dtype(datatype))
                else:
                    arr = np.array(o.get("data", []), dtype=numpy_dtype(datatype))
                arr = arr.reshape(shape)
                result[name] = _bf16_view(arr) if datatype == "BF16" else arr
                continue
            if name in out:
                region, off = self._region_of(out[name])  # type: ignore[misc]
                src_region, src_off, src_pool = region, off, None
            else:
                assert slot is not None and pool is not None
                src_region, src_off, src_pool = slot.region, placed[name][0], pool
            if datatype == "BYTES":
                view = src_region.array((nbytes,), np.uint8, src_off)
                result[name] = _shm.deserialize_bytes(view, count).reshape(shape)
                continue
            dtype = numpy_dtype(datatype)
            if src_pool is not None and slot is not None:
                arr = src_pool.view(slot, src_off, dtype, shape)
            else:
                arr = src_region.array(shape, dtype, src_off)
            result[name] = _bf16_view(arr) if datatype == "BF16" else arr
        return result

    def _estimate(self, model: str, version: str | int | None, name: str, meta: dict[str, Any],
                  inputs: Mapping[str, ArrayLike], total_in: int) -> int:
        """Bytes to set aside for an output: the most of what its declared shape holds (a
        variable first dimension taken as the inputs' batch; when it cannot tell, what the
        inputs take) and the largest seen so far. A call that outgrows it goes by socket once,
        and teaches."""
        seen = self._out_bytes.get((model, str(version or ""), name), 0)
        spec = next((o for o in meta.get("outputs", []) if o.get("name") == name), None)
        if spec is not None and spec.get("datatype") not in (None, "BYTES"):
            dims = list(spec.get("shape") or [])
            first = next(iter(inputs.values()), None)
            batch = np.shape(first)[0] if first is not None and np.ndim(first) > 0 else None
            if dims and dims[0] == -1 and batch is not None:
                dims[0] = batch
            if dims and all(d >= 0 for d in dims):
                return max(seen, math.prod(dims) * numpy_dtype(spec["datatype"]).itemsize)
        return max(seen, total_in, 64 << 10)

    def _learn(self, model: str, version: str | int | None, arrays: dict[str, np.ndarray],
               out: Mapping[str, np.ndarray]) -> None:
        """After a call that went by socket: output sizes for the next guesses, and the outputs
        asked into `out` copied there."""
        for name, arr in arrays.items():
            n = len(_shm.serialize_bytes(arr)) if arr.dtype == object else arr.nbytes
            key = (model, str(version or ""), name)
            self._out_bytes[key] = max(self._out_bytes.get(key, 0), n)
            target = out.get(name)
            if target is not None and arr.dtype != object and target.nbytes >= arr.nbytes:
                where = self._region_of(target)
                if where is not None:
                    view = where[0].array(arr.shape, arr.dtype, where[1])
                    np.copyto(view, arr)
                    arrays[name] = view

    def _cuda_params(self, tensor: Any) -> dict[str, Any] | None:
        """Shared-memory parameters for a contiguous torch tensor on a GPU, its allocation
        registered with the server as a CUDA region (once per allocation); None when CUDA
        shared memory cannot be used (then the tensor comes to the host)."""
        if self._cuda is None:
            self._cuda = self._decide_cuda()
        if not self._cuda or not tensor.is_contiguous():
            return None
        try:
            base, size, handle = _cuda_ipc().export(tensor.data_ptr())
        except OSError:
            return None
        name = self._cuda_regions.get(handle)
        if name is None:
            name = f"oi_cuda_{os.getpid()}_{uuid.uuid4().hex[:12]}"
            import base64

            device = tensor.device.index or 0
            if self._grpc:
                status, _ = self._grpc_unary("CudaSharedMemoryRegister",
                                             _shm.encode_cuda_register(name, handle, device, size), self._timeout)
                status = 200 if status == 0 else status
            else:
                path = f"{self._prefix}/v2/cudasharedmemory/region/{quote(name, safe='')}/register"
                body = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": device,
                        "byte_size": size}
                status, _ = self._call("request", "POST", path, json.dumps(body).encode(),
                                       "Content-Type: application/json\r\n", timeout=self._timeout)
            if status != 200:
                self._cuda = False  # refused (no GPU there, say): host copies from now on
                return None
            with self._lock:
                self._cuda_regions[handle] = name
            if len(self._cuda_regions) > _CUDA_REGIONS_MAX:  # allocations come and go: forget the oldest
                old = next(iter(self._cuda_regions))
                self._cuda_unregister(self._cuda_regions.pop(old))
        import torch

        torch.cuda.current_stream(tensor.device).synchronize()  # the server reads what is there now
        return _shm_params(name, tensor.numel() * tensor.element_size(), tensor.data_ptr() - base)

    def _decide_cuda(self) -> bool:
        if self._shm_mode is False or (self._shm_mode is None and not _is_loopback(self._host)):
            return False
        try:
            if "cuda_shared_memory" not in self.server_metadata().get("extensions", []):
                return False
            _cuda_ipc()
            return True
        except (InferenceServerError, OSError, ValueError):
            return False

    def _cuda_unregister(self, name: str) -> None:
        path = f"{self._prefix}/v2/cudasharedmemory/region/{quote(name, safe='')}/unregister"
        try:
            if self._grpc:
                self._grpc_unary("CudaSharedMemoryUnregister", _shm.encode_name(name), self._timeout)
            elif self._closed:
                conn = _core.HttpConnection(self._host, self._port, **self._conn_kw)
                try:
                    conn.request("POST", path, b"", None, timeout=self._timeout)
                finally:
                    conn.close()
            else:
                self._call("request", "POST", path, b"", None, timeout=self._timeout)
        except Exception:  # noqa: BLE001 - best effort: the server may be gone
            pass

    def _close_shm(self, at_exit: bool = False) -> None:
        with self._lock:
            cuda, self._cuda_regions = self._cuda_regions, {}
        for name in cuda.values():
            self._cuda_unregister(name)
        with self._lock:
            pool, self._shm_pool = self._shm_pool, False
        if isinstance(pool, _shm.Pool):
            pool.close(busy_too=at_exit)
        with self._lock:
            regions, self._regions = self._regions, {}
            owned, self._owned = self._owned, []
        for name in regions:
            try:
                self._shm_call("/unregister", name, None)
            except Exception:  # noqa: BLE001 - closing: the server may be gone already
                pass
        for region in owned:
            region.close()

    # ---- life cycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Closes every pooled connection and unregisters this client's shared-memory
        regions; calls in flight finish first. Arrays returned from shared memory stay valid."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if not self._closed:
            self._close_shm()
        self._closed = True
        _clients.discard(self)
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
        return f"<openinfer.Client {self.url}{' (closed)' if self._closed else ''}>"

    def _repr_html_(self) -> str:
        """The URL and the server's models with their state, asked with a short timeout; the
        error instead where the server cannot answer."""
        title = f"openinfer.Client{' (closed)' if self._closed else ''}"
        urls = [("URL", self.url)]
        if self._closed:
            return _display.html(title, urls, None)
        timeout = min(self._timeout, _DISPLAY_TIMEOUT) if self._timeout is not None else _DISPLAY_TIMEOUT
        try:
            meta = self.server_metadata(timeout=timeout)
            urls.append(("server", f"{meta.get('name', '?')} {meta.get('version', '')}".strip()))
            return _display.html(title, urls, self.repository_index(timeout=timeout))
        except Exception as e:  # shown, not raised: a display must not fail
            return _display.html(title, urls, None, f"{type(e).__name__}: {e}")


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

    async def generate(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        return await self._run(self._client.generate, model, inputs, **kwargs)

    async def generate_stream(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> Any:
        """`Client.generate_stream` as an async iterator: ``async for event in await
        client.generate_stream(...)``; each event is awaited on the client's threads."""
        stream = await self._run(self._client.generate_stream, model, inputs, **kwargs)
        return _AsyncStreamResults(self, stream)

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
    def __init__(self, client: AsyncClient, results: StreamResults | _gen.GenerateStream) -> None:
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


def _decode_index(data: bytes) -> list[dict[str, str]]:
    """RepositoryIndexResponse as the HTTP index body: repeated ModelIndex (1) of name (1),
    version (2), state (3), reason (4); empty strings left out, as Triton's HTTP index does."""
    out = []
    for num, _, entry in _shm._fields(data):
        if num == 1:
            keys = {1: "name", 2: "version", 3: "state", 4: "reason"}
            fields = {keys[k]: v.decode() for k, _, v in _shm._fields(entry) if k in keys}
            out.append({k: v for k, v in fields.items() if v})
    return out


def _grpc_value(status: int, value: Any) -> Any:
    if status != 0:
        _raise_grpc(status, value)
    return value



# Below this many tensor bytes (inputs, or the largest output a model gave) a call takes the
# socket even where shared memory is available: it is faster there (see S4 with shared memory).
SHM_MIN_BYTES = 256 << 10

# Clients whose shared-memory regions are unregistered at exit if they were not closed.
_clients: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_clients() -> None:
    for client in list(_clients):
        try:
            client._timeout = min(client._timeout or 2.0, 2.0)  # a hung server must not hang the exit
            client._close_shm(at_exit=True)
        except Exception:  # noqa: BLE001 - at exit, best effort
            pass


def _unix_url(url: str) -> tuple[bool, str] | None:
    """(is gRPC, absolute socket path) for a Unix-socket URL, None for any other. The path is
    written as gRPC names Unix targets: ``unix:PATH`` (relative or absolute) or
    ``unix:///ABSOLUTE``; ``http+unix:`` is HTTP too, and ``grpc+unix:`` selects gRPC."""
    for prefix, grpc in (("unix:", False), ("http+unix:", False), ("grpc+unix:", True)):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            if rest.startswith("//"):
                if not rest.startswith("///"):
                    raise ValueError(f"a {prefix}// URL names an absolute path ({prefix}///path); got {url!r}")
                rest = rest[2:]
            if not rest:
                raise ValueError(f"no socket path in URL {url!r}")
            path = os.path.abspath(rest)
            if len(os.fsencode(path)) > 107:
                raise ValueError(f"Unix socket path is over 107 bytes: {path!r}")
            return grpc, path
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.startswith("/"):  # a name for this host, or a Unix socket
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _align(n: int) -> int:
    return -(-n // _shm.ALIGN) * _shm.ALIGN


def _shm_params(region: str, byte_size: int, offset: int) -> dict[str, Any]:
    p: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        p["shared_memory_offset"] = offset
    return p


def _is_cuda_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_cuda", False))


def _host_value(value: ArrayLike) -> ArrayLike:
    """A torch tensor on a GPU comes to the host for the socket and system shared memory."""
    if _is_cuda_tensor(value):
        return value.detach().cpu().numpy()
    return value


def _torch_datatype(tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    table = {"bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32",
             "int64": "INT64", "float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "float64": "FP64",
             "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64"}
    if name not in table:
        raise ValueError(f"torch dtype {tensor.dtype} has no V2 datatype")
    return table[name]


# How many CUDA allocations stay registered per client (the caching allocator reuses few).
_CUDA_REGIONS_MAX = 64


class _CudaIpc:
    """cudaIpcGetMemHandle and cuMemGetAddressRange through ctypes: the IPC handle of the
    allocation that holds a device pointer, and where the allocation starts. (torch's own
    sharing, storage._share_cuda_(), keeps a reference count for a torch consumer that a
    server does not run.)"""

    def __init__(self) -> None:
        import ctypes

        def load(names: tuple[str, ...]) -> Any:
            for n in names:
                try:
                    return ctypes.CDLL(n)
                except OSError:
                    continue
            raise OSError(f"none of {', '.join(names)} could be loaded")

        self._ct = ctypes
        self._rt = load(("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"))
        self._drv = load(("libcuda.so.1", "libcuda.so"))

    def export(self, ptr: int) -> tuple[int, int, bytes]:
        """(allocation base, allocation size, 64-byte IPC handle) for device pointer `ptr`."""
        ct = self._ct
        base, size = ct.c_uint64(), ct.c_size_t()
        if self._drv.cuMemGetAddressRange_v2(ct.byref(base), ct.byref(size), ct.c_uint64(ptr)) != 0:
            raise OSError("cuMemGetAddressRange failed")
        handle = ct.create_string_buffer(64)
        if self._rt.cudaIpcGetMemHandle(handle, ct.c_void_p(base.value)) != 0:
            raise OSError("cudaIpcGetMemHandle failed (memory not from cudaMalloc?)")
        return base.value, size.value, handle.raw


_cuda_ipc_lib: _CudaIpc | None = None


def _cuda_ipc() -> _CudaIpc:
    global _cuda_ipc_lib
    if _cuda_ipc_lib is None:
        _cuda_ipc_lib = _CudaIpc()
    return _cuda_ipc_lib



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
