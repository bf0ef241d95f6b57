"""Serving: registers models with the C core (`openinfer._core`) and wraps its server.

This is the only module that imports the extension, so scanning, config parsing and models
stay usable (and testable) without it. The core's event loops run on native threads, which is
why `serve()` returns a running server at once, also in a notebook cell.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

from . import __version__, _core
from .config import DynamicBatching
from .model import Model, Tensor
from .repository import LoadedModel, examples_path, scan
from .torch_model import TorchModel

logger = logging.getLogger("openinfer")

# What GET /v2 lists: exactly the protocol extensions this server implements. The
# shared-memory ones are listed only where clients may register regions (see serve()).
EXTENSIONS = ("binary_tensor_data",)
SHM_EXTENSIONS = ("system_shared_memory", "cuda_shared_memory")

class _Default:
    """The type of `_DEFAULT`: "grpc_port not given"."""

    def __repr__(self) -> str:
        return "default"


# grpc_port when not given: 8001, or a free port when http_port=0 (so that servers started on
# free ports for tests and notebooks never collide on 8001).
_DEFAULT = _Default()
_GRPC_PORT = 8001

# --grpc-infer-response-compression-level, as tritonserver spells it, to the core's number.
_COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}

# The version a model is registered under when it failed before any version directory could
# be chosen: the core needs one to answer "not ready" with the reason.
_FAILED_MODEL_VERSION = 1


def serve(
    repo: str | os.PathLike[str] | None = None,
    *,
    models: Model | Iterable[Model] | None = None,
    host: str = "127.0.0.1",
    http_port: int | None = 8000,
    grpc_port: int | None | _Default = _DEFAULT,
    threads: int = 0,
    log: bool = True,
    allow_shared_memory: bool | None = None,
    http_unix: str | os.PathLike[str] | None = None,
    grpc_unix: str | os.PathLike[str] | None = None,
    unix_socket_mode: int = 0o660,
    grpc_infer_response_compression_level: str = "none",
    **limits: int,
) -> Server:
    """Serves the models of repository `repo` and the given `models`, and returns the running
    server at once. With neither, serves the example repository. ``http_port=0`` picks a free
    port (see `Server.http_port`). gRPC is served on `grpc_port` (default 8001; 0 picks a free
    port, also the default when ``http_port=0``; None serves no gRPC). Clients on this host may
    register shared-memory regions (system and CUDA) when `allow_shared_memory` is True; None
    (the default) allows it only when `host` is a loopback address.

    `http_unix` and `grpc_unix` also serve HTTP and gRPC on Unix-domain sockets at those paths,
    the recommended transport on one host: each request acts with the connecting process's own
    user and groups (shared memory it names is opened with its rights). ``http_port=None``
    serves HTTP on `http_unix` only (gRPC then defaults to `grpc_unix` only). The socket files
    get permission bits `unix_socket_mode` (default 0o660: the server's user and group may
    connect); a stale socket left by a dead server is replaced, any other file at the path is
    refused, and the files are removed at stop.

    `grpc_infer_response_compression_level` ("none", "low", "medium" or "high", as
    tritonserver's flag) compresses ModelInfer and ModelStreamInfer responses for clients that
    accept gzip or deflate (grpc-accept-encoding); the level picks among the algorithms the
    client accepts the way gRPC does (low: gzip first; medium and high: deflate where accepted).
    Compressed requests (grpc-encoding gzip or deflate) are always accepted. `limits` go to the
    core:
    max_body_bytes, max_header_bytes, max_connections, max_connections_per_peer,
    first_byte_timeout_ms, header_timeout_ms, body_timeout_ms, idle_timeout_ms, max_json_depth,
    grpc_max_message_bytes, grpc_max_queued_bytes."""
    server = Server(
        repo,
        models=models,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        threads=threads,
        log=log,
        allow_shared_memory=allow_shared_memory,
        http_unix=http_unix,
        grpc_unix=grpc_unix,
        unix_socket_mode=unix_socket_mode,
        grpc_infer_response_compression_level=grpc_infer_response_compression_level,
        **limits,
    )
    server.start()
    return server


class Server:
    """A V2 inference server; `serve()` builds and starts one. Stops on leaving a ``with``
    block, so tests and notebooks never leak a listening port."""

    def __init__(
        self,
        repo: str | os.PathLike[str] | None = None,
        *,
        models: Model | Iterable[Model] | None = None,
        host: str = "127.0.0.1",
        http_port: int | None = 8000,
        grpc_port: int | None | _Default = _DEFAULT,
        threads: int = 0,
        log: bool = True,
        allow_shared_memory: bool | None = None,
        http_unix: str | os.PathLike[str] | None = None,
        grpc_unix: str | os.PathLike[str] | None = None,
        unix_socket_mode: int = 0o660,
        grpc_infer_response_compression_level: str = "none",
        **limits: int,
    ) -> None:
        level = _COMPRESSION_LEVELS.get(grpc_infer_response_compression_level)
        if level is None:
            raise ValueError(
                "grpc_infer_response_compression_level must be one of "
                f"{', '.join(_COMPRESSION_LEVELS)}; got {grpc_infer_response_compression_level!r}"
            )
        if http_port is None and http_unix is None:
            raise ValueError("http_port=None serves HTTP on a Unix socket only: give http_unix too")
        if isinstance(grpc_port, _Default):
            grpc_port = None if http_port is None else 0 if http_port == 0 else _GRPC_PORT
        self._http_unix = None if http_unix is None else os.path.abspath(os.fspath(http_unix))
        self._grpc_unix = None if grpc_unix is None else os.path.abspath(os.fspath(grpc_unix))
        self._host = host
        self._port = http_port
        self._grpc_port = grpc_port
        self._log = log
        self._started = False
        self._stopped = threading.Event()
        self._entries = _collect(repo, models)
        self._core = _core.Server(
            host,
            -1 if http_port is None else http_port,
            threads=threads,
            grpc_port=-1 if grpc_port is None else grpc_port,
            allow_shared_memory=allow_shared_memory,
            http_unix=self._http_unix,
            grpc_unix=self._grpc_unix,
            unix_socket_mode=unix_socket_mode,
            grpc_infer_compression_level=level,
            **limits,
        )
        extensions = EXTENSIONS + (SHM_EXTENSIONS if self._core.shared_memory else ())
        self._core.set_metadata(
            _json({"name": "openinfer", "version": __version__, "extensions": list(extensions)})
        )
        self._register()

    def _register(self) -> None:
        numbers: dict[str, list[int]] = {}
        for entry in self._entries:
            numbers.setdefault(entry.name, []).append(_version(entry))
        versions = {name: [str(v) for v in sorted(vs)] for name, vs in numbers.items()}
        for index, entry in enumerate(self._entries):
            model = entry.model
            if isinstance(model, TorchModel):
                error = self._core.add_model(
                    entry.name,
                    model.version,
                    inputs=_specs(model.inputs),
                    outputs=_specs(model.outputs),
                    max_batch_size=model.max_batch_size,
                    metadata_json=_model_metadata(
                        entry.name, versions[entry.name], model.platform, model.inputs, model.outputs
                    ),
                    instances=model.instances,
                    torch=model.spec,
                    dynamic_batching=_batching(model.max_batch_size, model.dynamic_batching),
                )
                if error is not None:  # the module failed to load: unavailable, with the reason
                    self._entries[index] = LoadedModel(
                        entry.name, entry.version, None, error, entry.config
                    )
            elif model is not None:
                self._core.add_model(
                    entry.name,
                    model.version,
                    inputs=_specs(model.inputs),
                    outputs=_specs(model.outputs),
                    max_batch_size=model.max_batch_size,
                    metadata_json=_model_metadata(
                        entry.name,
                        versions[entry.name],
                        model.platform,
                        model.inputs,
                        model.outputs,
                    ),
                    handler=model.handler,
                    instances=model.instances,
                    dynamic_batching=_batching(model.max_batch_size, model.dynamic_batching),
                )
            else:
                platform = entry.config.get("platform") or entry.config.get("backend")
                self._core.add_model(
                    entry.name,
                    _version(entry),
                    inputs=(),
                    outputs=(),
                    max_batch_size=0,
                    metadata_json=_model_metadata(
                        entry.name,
                        versions[entry.name],
                        platform if isinstance(platform, str) else "",
                        (),
                        (),
                    ),
                    handler=None,
                    error=entry.error,
                )

    def start(self) -> Server:
        """Binds and starts the event loops; returns at once. Raises OSError when the port
        cannot be bound."""
        self._core.start()
        self._started = True
        if self._port is not None:
            self._port = self._core.port
        if self._grpc_port is not None:
            self._grpc_port = self._core.grpc_port
        if self._log:
            urls = [u for u in (self.url, self.grpc_url) if u is not None]
            if self._http_unix is not None and self._port is not None:
                urls.append(f"unix://{self._http_unix}")
            if self._grpc_unix is not None and self._grpc_port is not None:
                urls.append(f"grpc+unix://{self._grpc_unix}")
            logger.info("openinfer %s listening on %s", __version__, " and ".join(urls))
            for entry in self._entries:
                if entry.model is not None:
                    logger.info("model %s version %d ready", entry.name, entry.version)
                elif entry.version is None:
                    logger.warning("model %s failed to load: %s", entry.name, entry.error)
                else:
                    logger.warning(
                        "model %s version %d failed to load: %s",
                        entry.name,
                        entry.version,
                        entry.error,
                    )
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stops accepting connections, lets in-flight requests finish for up to `timeout`
        seconds, then closes everything. Requests still in flight after `timeout` are
        answered with 503 (gRPC UNAVAILABLE) and this returns, even while a model still
        runs (it finishes in the background and its answer is dropped). Idempotent."""
        try:
            self._core.stop(timeout)
        finally:  # wait() must return even if stopping failed
            if self._started and not self._stopped.is_set() and self._log:
                logger.info("openinfer on %s stopped", self.url)
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server is stopped (from another thread or a signal handler), or
        `timeout` seconds pass; returns whether it stopped."""
        return self._stopped.wait(timeout)

    @property
    def host(self) -> str:
        return self._host

    @property
    def http_port(self) -> int | None:
        """The bound port once started (the one picked for ``http_port=0``), else the one
        asked for; None when HTTP is served on `http_unix` only."""
        return self._port

    @property
    def grpc_port(self) -> int | None:
        """The bound gRPC port once started (the one picked for 0), else the one asked for;
        None when the server serves no gRPC over TCP."""
        return self._grpc_port

    @property
    def http_unix(self) -> str | None:
        """The absolute path of the HTTP Unix socket, or None."""
        return self._http_unix

    @property
    def grpc_unix(self) -> str | None:
        """The absolute path of the gRPC Unix socket, or None."""
        return self._grpc_unix

    @property
    def grpc_url(self) -> str | None:
        """``grpc://host:port`` reaching the gRPC service from this machine (tritonclient.grpc
        takes the part after ``grpc://``); ``grpc+unix:///path`` when gRPC is served on a Unix
        socket only (grpcio and tritonclient.grpc take the part after ``grpc+``); None
        without gRPC."""
        if self._grpc_port is None:
            return None if self._grpc_unix is None else f"grpc+unix://{self._grpc_unix}"
        host = self._reach_host()
        return f"grpc://[{host}]:{self._grpc_port}" if ":" in host else f"grpc://{host}:{self._grpc_port}"

    def _reach_host(self) -> str:
        return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)

    @property
    def url(self) -> str:
        """A URL that reaches the server from this machine, also when bound to a wildcard;
        ``unix:///path`` when HTTP is served on a Unix socket only (`Client` takes either)."""
        if self._port is None:
            return f"unix://{self._http_unix}"
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        return f"http://[{host}]:{self._port}" if ":" in host else f"http://{host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._core.running

    @property
    def models(self) -> dict[str, tuple[int, ...]]:
        """Model name -> ready versions (ascending), for every model with one ready."""
        ready: dict[str, list[int]] = {}
        for entry in self._entries:
            if entry.model is not None:
                ready.setdefault(entry.name, []).append(entry.model.version)
        return {name: tuple(sorted(v)) for name, v in sorted(ready.items())}

    @property
    def failed(self) -> dict[str, dict[int, str]]:
        """Model name -> {version: reason} for every version that failed to load."""
        failed: dict[str, dict[int, str]] = {}
        for entry in self._entries:
            if entry.model is None:
                failed.setdefault(entry.name, {})[_version(entry)] = entry.error or ""
        return failed

    def __enter__(self) -> Server:
        if not self._started:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "" if self._started and not self._stopped.is_set() else " (not running)"
        return f"<openinfer.Server {self.url}{state} models=[{', '.join(self.models)}]>"


def _collect(
    repo: str | os.PathLike[str] | None, models: Model | Iterable[Model] | None
) -> list[LoadedModel]:
    """The model versions to serve: the repository's (the examples when neither argument is
    given), then `models`. Two definitions of one name and version are a ValueError, caught
    here rather than as the core's RuntimeError so the message says which."""
    if repo is None and models is None:
        repo = examples_path()
    entries = scan(repo, optional_torch=_is_examples(repo)) if repo is not None else []
    given = [models] if isinstance(models, Model) else list(models or ())
    for model in given:
        if not isinstance(model, Model):
            raise TypeError(f"models must hold openinfer.Model instances, got {model!r}")
        entries.append(LoadedModel(model.name, model.version, model, None))
    seen: set[tuple[str, int]] = set()
    for entry in entries:
        key = (entry.name, _version(entry))
        if key in seen:
            raise ValueError(f"model {entry.name!r} version {key[1]} is defined twice")
        seen.add(key)
    return entries


def _is_examples(repo: str | os.PathLike[str]) -> bool:
    """The bundled examples serve everywhere: their TorchScript models only where torch is."""
    try:
        return Path(repo).resolve() == examples_path().resolve()
    except FileNotFoundError:  # an installation without them serves other repositories
        return False


def _version(entry: LoadedModel) -> int:
    return _FAILED_MODEL_VERSION if entry.version is None else entry.version


def _batching(
    max_batch_size: int, batching: DynamicBatching | None
) -> tuple[tuple[int, ...], int] | None:
    """add_model's dynamic_batching: (preferred sizes, max queue delay in µs), or None."""
    if max_batch_size <= 0 or batching is None:
        return None
    return (batching.preferred_batch_size, batching.max_queue_delay_microseconds)


def _specs(tensors: Sequence[Tensor]) -> list[tuple[str, str, tuple[int, ...] | None]]:
    return [(t.name, t.datatype, t.shape) for t in tensors]


def _model_metadata(
    name: str,
    versions: list[str],
    platform: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
) -> bytes:
    """The body of GET /v2/models/{name}[/versions/{v}], as the V2 protocol defines it."""

    def tensors(ts: Sequence[Tensor]) -> list[dict[str, object]]:
        # V2 metadata cannot say "any rank"; [-1] is the nearest shape it can.
        return [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": [-1] if t.shape is None else list(t.shape),
            }
            for t in ts
        ]

    return _json(
        {
            "name": name,
            "versions": versions,
            "platform": platform,
            "inputs": tensors(inputs),
            "outputs": tensors(outputs),
        }
    )


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
