"""Serving: registers models with the C core (`openinfer._core`) and wraps its server.

This is the only module that imports the extension, so scanning, config parsing and models
stay usable (and testable) without it. The core's event loops run on native threads, which is
why `serve()` returns a running server at once, also in a notebook cell.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _core, _display, _pt2_build
from ._backends import triton_metrics
from ._backends.chat_template import ChatTemplates
from ._backends.model_file import forget_model
from ._net import reachable
from ._tls import tls_specs
from ._version import __version__
from ._control.cache import cache_bytes
from ._control.control import DEFAULT_POLL_SECS, IndexEntry, ModelControl
from ._control.logsettings import LogSettings
from ._control.namespaces import NamespacedControl
from ._control.restricted import grpc_restricted, http_restricted, open_to_anyone, reached_by_strangers
from ._control.tracesettings import TraceSettings, level_mask, trace_options
from .config import ConfigError, load_model_config
from .errors import InferenceServerError
from .model import Model
from ._repository.repository import examples_path

logger = logging.getLogger("openinfer")

# What GET /v2 lists: exactly the protocol extensions this server implements. The
# shared-memory ones are listed only where clients may register regions (see serve()).
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "statistics",
    "trace",
)
SHM_EXTENSIONS = ("system_shared_memory", "cuda_shared_memory")

# Every started server until its stop(): a server stays up while unreferenced (a notebook's
# `openinfer.serve(...)` whose result is not kept), and one still running at interpreter
# exit is stopped then. Insertion order is start order.
_running: dict[int, Server] = {}
_running_lock = threading.Lock()


def servers() -> list[Server]:
    """The servers started in this process and not yet stopped, oldest first."""
    with _running_lock:
        return list(_running.values())


@atexit.register
def _stop_running() -> None:
    for server in reversed(servers()):
        server.stop(_EXIT_STOP_TIMEOUT)


# Seconds a server still running at interpreter exit gives in-flight requests.
_EXIT_STOP_TIMEOUT = 5.0


class _FallbackHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the ``openinfer`` logger's records to the current standard error (a notebook's
    cell output) when nothing else would: installed by the first serve() of a process whose
    logging is not configured, it stays quiet once the application adds handlers of its own
    (on the logger or an ancestor it propagates to), so no line appears twice."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it; sys.stderr is read at emit
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if not _other_handlers(self):
            super().emit(record)


def _other_handlers(mine: logging.Handler | None) -> bool:
    """Whether a record of the ``openinfer`` logger reaches a handler other than `mine`."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(h is not mine for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def _ensure_log_handler() -> None:
    """Installs the fallback handler once, where logging has no handler for our records."""
    with _running_lock:  # two servers starting at once install one
        if not any(isinstance(h, _FallbackHandler) for h in logger.handlers) and not _other_handlers(None):
            logger.addHandler(_FallbackHandler())


class _Default:
    """The type of `_DEFAULT`: "grpc_port not given"."""

    def __repr__(self) -> str:
        return "default"


# grpc_port and metrics_port when not given: 8001 and 8002, or free ports when http_port=0 (so
# that servers started on free ports for tests and notebooks never collide on them).
_DEFAULT = _Default()
_GRPC_PORT = 8001
_METRICS_PORT = 8002

# tritonserver's --metrics-config settings: name -> the core's keyword.
_METRICS_SETTINGS: dict[str, str] = {
    "counter_latencies": "metrics_counter_latencies",
    "histogram_latencies": "metrics_histogram_latencies",
    "summary_latencies": "metrics_summary_latencies",
    "summary_quantiles": "metrics_summary_quantiles",
}

# --grpc-infer-response-compression-level, as tritonserver spells it, to the core's number.
_COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def serve(
    repo: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    *,
    models: Model | Iterable[Model] | None = None,
    host: str = "127.0.0.1",
    http_port: int | None = 8000,
    grpc_port: int | None | _Default = _DEFAULT,
    threads: int = 0,
    log: bool = True,
    allow_shared_memory: bool | None = None,
    model_control_mode: str = "none",
    load_models: Iterable[str] = (),
    repository_poll_secs: float = DEFAULT_POLL_SECS,
    max_instances: int | None = None,
    model_unload_timeout: float | None = 30.0,
    backend_directory: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    statistics: bool = True,
    metrics_port: int | None | _Default = _DEFAULT,
    metrics_config: Mapping[str, object] | Iterable[str] | None = None,
    allow_cpu_metrics: bool = True,
    allow_gpu_metrics: bool = True,
    metrics_address: str | None = None,
    metrics_interval_ms: int = 2000,
    http_unix: str | os.PathLike[str] | None = None,
    grpc_unix: str | os.PathLike[str] | None = None,
    unix_socket_mode: int = 0o660,
    grpc_infer_response_compression_level: str = "none",
    log_file: str | None = None,
    log_verbose: int = 0,
    log_format: str = "default",
    access_log: str | os.PathLike[str] | None = None,
    trace_file: str | os.PathLike[str] | None = None,
    trace_config: Mapping[str, object] | Iterable[str] | None = None,
    trace_level: str | Iterable[str] | None = None,
    trace_rate: int | str | None = None,
    trace_count: int | str | None = None,
    trace_log_frequency: int | str | None = None,
    sockets: Mapping[str, socket.socket | int] | None = None,
    cache_config: Mapping[str, object] | Iterable[str] | None = None,
    response_cache_byte_size: int | None = None,
    http_restricted_api: str | Iterable[str] | None = None,
    grpc_restricted_protocol: str | Iterable[str] | None = None,
    grpc_address: str | None = None,
    strict_readiness: bool = True,
    model_namespacing: bool = False,
    server_id: str = "openinfer",
    http_header_forward_pattern: str | None = None,
    grpc_header_forward_pattern: str | None = None,
    ssl: Mapping[str, Any] | None = None,
    **limits: int,
) -> Server:
    """Serves the models of repository `repo` and the given `models`, and returns the running
    server at once (`repo` may be a list of repositories, as tritonserver's repeated
    ``--model-repository``: a model that two of them have is not served, with tritonserver's
    reason). With neither, serves the example repository. ``http_port=0`` picks a free
    port (see `Server.http_port`). gRPC is served on `grpc_port` (default 8001; 0 picks a free
    port, also the default when ``http_port=0``; None serves no gRPC). Clients on this host may
    register shared-memory regions (system and CUDA) when `allow_shared_memory` is True; None
    (the default) allows it only when `host` is a loopback address. `model_control_mode` is
    tritonserver's: "none" (load the whole repository, no loading API), "poll" (also rescan it
    every `repository_poll_secs`) or "explicit" (load only `load_models`, "*" for all, and let
    clients load and unload); see `openinfer._control.control`. `max_instances` bounds the model
    instances (executor threads, worker processes) of every loaded model version together: a
    load request that would pass it is refused (default: 4 per usable CPU, at least 64;
    ``--max-instances``); the models the server loads itself (at start, by polling) count
    toward it but are never refused. Loads and unloads of different models run at once. An
    unload (or a reload) waits at most `model_unload_timeout` seconds (None: as long as it
    takes; ``--model-unload-timeout-secs``) for the requests of the versions that leave; then
    their worker processes are killed, and a version whose execute still runs in the server is
    abandoned to it and logged. A model whose config.pbtxt names a backend none of openinfer's
    serves runs that Python-based backend's model.py (Triton's: ``NAME/model.py``), found in
    `backend_directory` (one folder or several, searched in order; ``--backend-directory``) and
    then in the folder openinfer ships, which holds Triton's vLLM backend (docs/llm.md).

    Inferences are counted per model version (Triton's statistics extension,
    `Server.statistics`) unless `statistics` is False. Prometheus metrics are served at
    ``/metrics`` on `metrics_port` (default 8002, a free port when ``http_port=0``; 0 or None:
    no metrics listener) with Triton's metric names; `metrics_config` takes tritonserver's
    ``--metrics-config`` settings (``{"histogram_latencies": True}`` or
    ``["histogram_latencies=true"]``; also ``summary_latencies=true`` with
    ``summary_quantiles=0.5:0.05,0.9:0.01``), and `allow_cpu_metrics` / `allow_gpu_metrics` its
    ``--allow-cpu-metrics`` / ``--allow-gpu-metrics``. `metrics_address` is
    ``--metrics-address`` (the metrics listener's host; default `host`) and
    `metrics_interval_ms` ``--metrics-interval-ms`` (how often CPU and GPU readings are
    refreshed: every half of it, as in tritonserver; default 2000).

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
    Compressed requests (grpc-encoding gzip or deflate) are always accepted.

    `log_file` (records of the
    ``openinfer`` logger go there instead of to the application's handlers), `log_verbose`
    and `log_format` ("default" or "ISO8601", for `log_file`) are tritonserver's
    ``--log-file`` / ``--log-verbose`` / ``--log-format``; clients read and change them
    through the logging extension (see `openinfer._control.logsettings`). `access_log` (a path, or
    "-" for standard output; off by default) gets one line per answered request::

        TIME PEER PROTOCOL METHOD|RPC PATH|MODEL VERSION STATUS BYTES_IN BYTES_OUT DURATIONus

    (UTC time; "-" for a field that does not apply), written by a thread of its own: when it
    falls behind, lines are dropped and counted in a "# access log: N lines dropped" line
    rather than slowing requests. `trace_file` is tritonserver's ``--trace-file``: where the
    trace extension writes the traces of sampled requests (Triton's JSON); clients turn tracing
    on and tune it with ``/v2/trace/setting`` (see `openinfer._control.tracesettings`). Tracing can also
    start on: `trace_config` takes tritonserver's ``--trace-config`` entries
    (``["level=TIMESTAMPS", "rate=1", "count=100", "triton,file=/tmp/t.json",
    "triton,log-frequency=50"]``, or a mapping such as ``{"level": ["TIMESTAMPS", "TENSORS"],
    "triton,file": path}``), and `trace_level` / `trace_rate` / `trace_count` /
    `trace_log_frequency` its older ``--trace-level`` ... flags, which ``--trace-config``
    overrides as in tritonserver.

    `sockets` maps "http", "grpc" and "metrics" to listening TCP sockets (socket objects or
    descriptors) to serve instead of binding `host` and the port: the server listens on
    duplicates, so the caller may close its own once this returns. It is how the worker
    processes of ``openinfer serve --workers`` share their parent's ports, and how a caller
    that must own the port (a supervisor, a test) hands it over.

    `cache_config` takes tritonserver's ``--cache-config`` entries for the response cache
    (``["local,size=1048576"]``; only the ``local`` cache) and `response_cache_byte_size` its
    deprecated ``--response-cache-byte-size``: models with ``response_cache { enable: true }``
    (or ``Model(..., response_cache=True)``) then answer a request identical to an earlier one
    from the cache, without running.

    `grpc_address` is tritonserver's ``--grpc-address``: the host the gRPC listener binds
    (default `host`, which is then ``--http-address``). `strict_readiness` is its
    ``--strict-readiness``: True (the default) makes the server ready only while every model
    is; False, once it serves, whatever its models' state. `model_namespacing` is its
    ``--model-namespacing``: each repository of `repo` is a namespace, so that several may hold
    a model of one name (see `openinfer._control.namespaces`); without it such a model is served
    from none. `server_id` is its ``--id``: the
    ``name`` of the server metadata (default "openinfer").
    `http_header_forward_pattern` and `grpc_header_forward_pattern` are its
    ``--http-header-forward-pattern`` and ``--grpc-header-forward-pattern``: an inference
    request's HTTP headers (gRPC metadata) whose names the pattern matches anywhere,
    case-insensitively, reach the model as string request parameters (a POSIX extended regular
    expression here, RE2 in tritonserver: the two agree on the usual ``^x-.*``, ``azure|aws``);
    a matching name that Triton reserves (``sequence_id``, ``priority``, ``triton_*``, ...) is
    refused with 400 / INVALID_ARGUMENT in tritonserver's words.

    `limits` go to the core:
    max_body_bytes, max_header_bytes, max_connections, max_connections_per_peer,
    first_byte_timeout_ms, header_timeout_ms, body_timeout_ms, body_min_rate, idle_timeout_ms,
    max_json_depth, grpc_max_message_bytes, grpc_max_queued_bytes, max_inflight_body_bytes,
    max_inflate_ratio, max_sequence_backlog (sequences that may wait for a slot of one sequence
    model: 1000 by default, 0 for no limit).

    `http_restricted_api` and `grpc_restricted_protocol` take tritonserver's
    ``--http-restricted-api`` / ``--grpc-restricted-protocol`` values (one string or several),
    ``"<group>[,<group>...]:<header>=<value>"``: the named groups (health, metadata, inference,
    shared-memory, model-config, model-repository, statistics, trace, logging; and openinfer's
    openai, the /v1 API: see --openai-api-key) then answer
    only requests carrying that header with that value (gRPC: metadata
    ``triton-grpc-protocol-<header>``), others get HTTP 403 or gRPC UNAVAILABLE with
    tritonserver's words. The legacy v1 API and the generate extension are covered too; see
    `openinfer._control.restricted`. A server on a non-loopback `host` whose model control,
    shared memory or settings answer anyone logs one warning that names them.

    `ssl` serves HTTP (and the metrics port) and gRPC over TLS (1.2 or later; gRPC with ALPN
    h2), as tritonserver's ``--grpc-use-ssl`` flags: ``{"server_cert": path, "server_key":
    path, "root_cert": path, "mutual": False}`` for both protocols, or ``{"http": {...},
    "grpc": {...}}`` for each its own. ``mutual=True`` refuses clients without a certificate
    signed by ``root_cert``. Unix-domain sockets stay plain text. `Server.reload_tls` loads
    the files again."""
    server = Server(
        repo,
        models=models,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        threads=threads,
        log=log,
        allow_shared_memory=allow_shared_memory,
        model_control_mode=model_control_mode,
        load_models=load_models,
        repository_poll_secs=repository_poll_secs,
        max_instances=max_instances,
        model_unload_timeout=model_unload_timeout,
        backend_directory=backend_directory,
        statistics=statistics,
        metrics_port=metrics_port,
        metrics_config=metrics_config,
        allow_cpu_metrics=allow_cpu_metrics,
        allow_gpu_metrics=allow_gpu_metrics,
        metrics_address=metrics_address,
        metrics_interval_ms=metrics_interval_ms,
        http_unix=http_unix,
        grpc_unix=grpc_unix,
        unix_socket_mode=unix_socket_mode,
        grpc_infer_response_compression_level=grpc_infer_response_compression_level,
        log_file=log_file,
        log_verbose=log_verbose,
        log_format=log_format,
        access_log=access_log,
        trace_file=trace_file,
        trace_config=trace_config,
        trace_level=trace_level,
        trace_rate=trace_rate,
        trace_count=trace_count,
        trace_log_frequency=trace_log_frequency,
        sockets=sockets,
        cache_config=cache_config,
        response_cache_byte_size=response_cache_byte_size,
        http_restricted_api=http_restricted_api,
        grpc_restricted_protocol=grpc_restricted_protocol,
        grpc_address=grpc_address,
        strict_readiness=strict_readiness,
        model_namespacing=model_namespacing,
        server_id=server_id,
        http_header_forward_pattern=http_header_forward_pattern,
        grpc_header_forward_pattern=grpc_header_forward_pattern,
        ssl=ssl,
        **limits,
    )
    server.start()
    return server


class Server:
    """A V2 inference server; `serve()` builds and starts one. Stops on leaving a ``with``
    block, so tests and notebooks never leak a listening port."""

    def __init__(
        self,
        repo: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        *,
        models: Model | Iterable[Model] | None = None,
        host: str = "127.0.0.1",
        http_port: int | None = 8000,
        grpc_port: int | None | _Default = _DEFAULT,
        threads: int = 0,
        log: bool = True,
        allow_shared_memory: bool | None = None,
        model_control_mode: str = "none",
        load_models: Iterable[str] = (),
        repository_poll_secs: float = DEFAULT_POLL_SECS,
        max_instances: int | None = None,
        model_unload_timeout: float | None = 30.0,
        backend_directory: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        statistics: bool = True,
        metrics_port: int | None | _Default = _DEFAULT,
        metrics_config: Mapping[str, object] | Iterable[str] | None = None,
        allow_cpu_metrics: bool = True,
        allow_gpu_metrics: bool = True,
        metrics_address: str | None = None,
        metrics_interval_ms: int = 2000,
        http_unix: str | os.PathLike[str] | None = None,
        grpc_unix: str | os.PathLike[str] | None = None,
        unix_socket_mode: int = 0o660,
        grpc_infer_response_compression_level: str = "none",
        log_file: str | None = None,
        log_verbose: int = 0,
        log_format: str = "default",
        access_log: str | os.PathLike[str] | None = None,
        trace_file: str | os.PathLike[str] | None = None,
        trace_config: Mapping[str, object] | Iterable[str] | None = None,
        trace_level: str | Iterable[str] | None = None,
        trace_rate: int | str | None = None,
        trace_count: int | str | None = None,
        trace_log_frequency: int | str | None = None,
        sockets: Mapping[str, socket.socket | int] | None = None,
        cache_config: Mapping[str, object] | Iterable[str] | None = None,
        response_cache_byte_size: int | None = None,
        http_restricted_api: str | Iterable[str] | None = None,
        grpc_restricted_protocol: str | Iterable[str] | None = None,
        grpc_address: str | None = None,
        strict_readiness: bool = True,
        model_namespacing: bool = False,
        server_id: str = "openinfer",
        http_header_forward_pattern: str | None = None,
        grpc_header_forward_pattern: str | None = None,
        ssl: Mapping[str, Any] | None = None,
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
        if isinstance(metrics_port, _Default):
            metrics_port = 0 if http_port == 0 else _METRICS_PORT
        elif metrics_port == 0:
            metrics_port = None
        listen_fds = _listening_sockets(sockets or {})
        ports = {k: port for k, (_, port) in listen_fds.items()}
        http_port = ports.get("http", http_port)
        grpc_port = ports.get("grpc", grpc_port)
        metrics_port = ports.get("metrics", metrics_port)
        self._http_unix = None if http_unix is None else os.path.abspath(os.fspath(http_unix))
        self._grpc_unix = None if grpc_unix is None else os.path.abspath(os.fspath(grpc_unix))
        self._host = host
        self._port = http_port
        self._grpc_port = grpc_port
        self._metrics_port = metrics_port
        self._metrics_host = host if metrics_address is None else metrics_address
        self._grpc_host = host if grpc_address is None else grpc_address
        self._log = log
        self._started = False
        self._stopped = threading.Event()
        # One start or stop at a time: a stop or drain from another thread while start() runs
        # (a signal as the ports open) acts once the ports are open, on a started server.
        self._stop_lock = threading.Lock()
        self._drain_cut = threading.Event()  # ends a drain's grace period early
        self._pt2_stop = threading.Event()  # ends the wait for the PT2 examples' packages
        repo_path, given = _sources(repo, models)
        load_models = [load_models] if isinstance(load_models, str) else list(load_models)
        tracing = trace_options(
            trace_config,
            trace_file=None if trace_file is None else os.fspath(trace_file),
            trace_level=trace_level,
            trace_rate=trace_rate,
            trace_count=trace_count,
            trace_log_frequency=trace_log_frequency,
        )
        trace_path: str | None = tracing.pop("trace_file")
        restricted = (http_restricted(http_restricted_api), grpc_restricted(grpc_restricted_protocol))
        self._restricted = tuple({group for group, _, _ in r} for r in restricted)
        self._model_control_mode = model_control_mode
        tls = tls_specs(ssl)
        self._tls = tls
        self._core = _core.Server(
            host,
            -1 if http_port is None else http_port,
            threads=threads,
            grpc_port=-1 if grpc_port is None else grpc_port,
            allow_shared_memory=allow_shared_memory,
            statistics=statistics,
            metrics_port=-1 if metrics_port is None else metrics_port,
            metrics_cpu=allow_cpu_metrics,
            metrics_gpu=allow_gpu_metrics,
            metrics_address=metrics_address,
            metrics_interval_ms=metrics_interval_ms,
            access_log=None if access_log is None else os.fspath(access_log),
            trace_file=trace_path,
            **_metrics_settings(metrics_config),
            http_unix=self._http_unix,
            grpc_unix=self._grpc_unix,
            unix_socket_mode=unix_socket_mode,
            grpc_infer_compression_level=level,
            **{f"{k}_listen_fd": fd for k, (fd, _) in listen_fds.items()},
            response_cache_bytes=cache_bytes(cache_config, response_cache_byte_size),
            http_restricted=restricted[0],
            grpc_restricted=restricted[1],
            grpc_address=grpc_address,
            strict_readiness=strict_readiness,
            http_header_forward_pattern=http_header_forward_pattern,
            grpc_header_forward_pattern=grpc_header_forward_pattern,
            http_tls=tls.get("http"),
            grpc_tls=tls.get("grpc"),
            **limits,
        )
        if metrics_port is not None:  # Triton models' pb_utils.MetricFamily, from their initialize on
            triton_metrics.add_sink(id(self), self._core.set_custom_metrics)
        extensions = tuple(e for e in EXTENSIONS if statistics or e != "statistics")
        extensions += SHM_EXTENSIONS if self._core.shared_memory else ()
        self._core.set_metadata(
            _json({"name": server_id, "version": __version__, "extensions": list(extensions)})
        )
        # The examples that import heavy modules load after start-up, unless asked for by name.
        self._deferred_examples = (
            _heavy_examples(repo_path)
            if isinstance(repo_path, Path) and _is_examples(repo_path)
            and (model_control_mode != "explicit" or "*" in load_models)
            else []
        )
        try:
            # --model-namespacing: each repository a namespace of its own (_control.namespaces)
            namespaces = ([repo_path] if isinstance(repo_path, Path) else repo_path or []) if model_namespacing else []
            control = NamespacedControl if namespaces else ModelControl
            self._control: ModelControl | NamespacedControl = control(
                self._core,
                namespaces or repo_path,
                given,
                mode=model_control_mode,
                load_models=load_models,
                poll_secs=repository_poll_secs,
                optional_torch=isinstance(repo_path, Path) and _is_examples(repo_path),
                deferred=self._deferred_examples,
                max_json_depth=limits.get("max_json_depth", 0),
                max_instances=max_instances,
                unload_timeout=model_unload_timeout,
                backend_directories=_paths(backend_directory),
                load_code=not reached_by_strangers(
                    [(h, r) for h, r, port in self._tcp_restrictions(http_port, grpc_port) if port is not None],
                    "model-repository",
                ),
            )
            self._logging = LogSettings(
                log_file=log_file, log_verbose_level=log_verbose, log_format=log_format
            )
            self._tracing = TraceSettings(
                trace_file=trace_path,
                on_change=self._trace_changed if trace_path is not None else None,
                count_of=self._core.trace_count if trace_path is not None else None,
                **tracing,
            )
        except BaseException:
            triton_metrics.remove_sink(id(self))
            self._core.stop(0)
            raise
        self._core.set_repository(self._handle)
        # OpenAI's chat completions: prompts from the model folder's chat template.
        self._core.set_chat_renderer(ChatTemplates(self._control.model_dir).render)
        self._pt2_examples: list[tuple[str, Path]] = []
        if isinstance(repo_path, Path) and _is_examples(repo_path):
            loading = set(load_models) if model_control_mode == "explicit" and "*" not in load_models else None
            self._pt2_examples = _pt2_left_out(repo_path, loading, self._control.loaded())

    def _handle(
        self,
        op: str,
        model: str | None,
        body: bytes | None,
        params: dict[str, Any] | None,
        ready: bool,
        stop: Any = None,
    ) -> Any:
        """The core's control handler: the logging and trace extensions here, the rest is
        the repository's (`stop`: set once the client has gone)."""
        if op == "logging":
            return self._logging.handle(body, params)
        if op == "trace":
            return self._tracing.handle(model, body, params)
        return self._control.handle(op, model, body, params, ready, stop)

    def _trace_changed(self, model: str | None, values: dict[str, Any]) -> None:
        """The trace settings' hook: the core samples with `values` (none: the model's own
        settings are cleared)."""
        if not values:
            self._core.trace_set(model, True, 0, 0, -1, 0)
            return
        self._core.trace_set(
            model,
            False,
            level_mask(values["trace_level"]),
            values["trace_rate"],
            values["trace_count"],
            values["log_frequency"],
        )

    def _tcp_restrictions(self, http_port: int | None, grpc_port: int | None) -> list[tuple[str, set[str], int | None]]:
        """Each protocol's host, the API groups it restricts and its port (None: no TCP listener).
        A protocol that asks every client for a certificate (mutual TLS) answers no stranger."""
        everything = set(_core.RESTRICTED_APIS)
        return [
            (host, everything if self._tls.get(proto, (None, None, None, False))[3] else r, port)
            for proto, host, r, port in zip(
                ("http", "grpc"), (self._host, self._grpc_host), self._restricted, (http_port, grpc_port)
            )
        ]

    def _warn_if_open(self) -> None:
        """One warning when clients beyond this host may reach the control APIs unchecked."""
        tcp = [r for _, r, port in self._tcp_restrictions(self._port, self._grpc_port) if port is not None]
        what = open_to_anyone(
            self._host,
            tcp,
            model_control=self._model_control_mode == "explicit",
            shared_memory=bool(self._core.shared_memory),
        )
        if what:
            logging.getLogger("openinfer.exposure").warning(
                "openinfer listens on %s, beyond this host, and these APIs answer anyone who reaches it: "
                "%s; restrict them (--http-restricted-api, --grpc-restricted-protocol), ask clients for "
                "certificates (--http-use-ssl-mutual, --grpc-use-ssl-mutual) or listen on 127.0.0.1",
                self._host,
                ", ".join(what),
            )

    def start(self) -> Server:
        """Binds and starts the event loops; returns at once. Raises OSError when the port
        cannot be bound. A server stopped before it started stays stopped: nothing opens."""
        with self._stop_lock:
            if not self._stopped.is_set():
                self._start()
        return self

    def _start(self) -> None:
        self._core.start()
        self._started = True
        with _running_lock:
            _running[id(self)] = self
        self._logging.install()
        self._tracing.push()
        self._control.start()
        if self._port is not None:
            self._port = self._core.port
        if self._grpc_port is not None:
            self._grpc_port = self._core.grpc_port
        if self._metrics_port is not None:
            self._metrics_port = self._core.metrics_port
        if self._log:
            _ensure_log_handler()
            urls = [u for u in (self.url, self.grpc_url) if u is not None]
            if self._http_unix is not None and self._port is not None:
                urls.append(f"unix://{self._http_unix}")
            if self._grpc_unix is not None and self._grpc_port is not None:
                urls.append(f"grpc+unix://{self._grpc_unix}")
            logger.info("openinfer %s listening on %s", __version__, " and ".join(urls))
            if self._metrics_port is not None:
                logger.info("metrics at %s", self.metrics_url)
            for entry in self._control.loaded():
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
        self._warn_if_open()
        if self._pt2_examples:
            _pt2_build.serve_when_built(self._pt2_examples, self._pt2_stop, self._load_built_example)
        if self._deferred_examples:
            threading.Thread(target=self._load_deferred_examples, name="openinfer-heavy-examples", daemon=True).start()

    def _load_deferred_examples(self) -> None:
        for name in self._deferred_examples:
            if self._pt2_stop.is_set():
                return
            self._load_built_example(name)

    def _load_built_example(self, name: str) -> None:
        """Loads an example after start-up (a PT2 example whose package was built, one that
        imports heavy modules), as a poll loads a model that changed (the model control has no
        other way in for model_control_mode none)."""
        control = self._control
        try:
            if not control.load_later(name):
                return
        except InferenceServerError as e:
            logger.warning("%s", e.message)
            return
        except OSError as e:  # its folder unreadable now (out of descriptors): the rest serve on
            logger.warning("example %s is not served: %s", name, e.strerror or e)
            return
        if self._log:
            for entry in control.loaded():
                if entry.name == name and entry.model is not None:
                    logger.info("model %s version %d ready", entry.name, entry.version)

    def stop(self, timeout: float = 30.0) -> None:
        """Stops accepting connections, lets in-flight requests finish for up to `timeout`
        seconds, then closes everything. Requests still in flight after `timeout` are
        answered with 503 (gRPC UNAVAILABLE) and this returns, even while a model still
        runs (it finishes in the background and its answer is dropped). Idempotent and safe
        from any thread: a second call returns once the first is done."""
        self._drain_cut.set()
        self._pt2_stop.set()
        with self._stop_lock:
            try:
                self._control.close(timeout)
                triton_metrics.remove_sink(id(self))
                self._core.stop(timeout)
                for entry in self._control.loaded():  # a Triton Python model's finalize()
                    close = getattr(entry.model, "close", None)
                    if close is not None:
                        close()
                    forget_model(entry.model)  # its model.py's modules leave sys.modules
            finally:  # wait() must return even if stopping failed
                if self._started and not self._stopped.is_set() and self._log:
                    logger.info("openinfer on %s stopped", self.url)
                if self._started:
                    self._logging.uninstall()
                self._stopped.set()
                with _running_lock:
                    _running.pop(id(self), None)

    def drain(self, grace: float, timeout: float = 30.0) -> None:
        """Stops the server the way a rolling update needs: readiness turns false at once
        (`/v2/health/ready` answers 400, gRPC ServerReady false, grpc.health.v1 NOT_SERVING) so
        load balancers take this replica out, while new connections are still accepted and
        every request served for `grace` seconds (the time endpoints take to notice); then
        `stop(timeout)`. A `stop()` from another thread ends the grace early. Called while
        another thread is in `start()`, it drains once the ports are open. Returns once
        stopped."""
        with self._stop_lock:  # a start() under way finishes first
            serving = self._started and not self._stopped.is_set()
            try:
                if serving:
                    self._core.drain()
            except RuntimeError:  # stopped meanwhile
                serving = False
        if serving:
            if self._log:
                logger.info("openinfer on %s draining: not ready, serving for %gs more", self.url, grace)
            self._drain_cut.wait(max(grace, 0.0))
        self.stop(timeout)

    def reload_tls(self) -> None:
        """Loads the ``ssl`` certificates and keys again (``openinfer serve`` does on SIGHUP):
        connections made from now on get them, those open finish with theirs. ValueError
        naming the file when one cannot be loaded; the ones in use then stay."""
        self._core.reload_tls()

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
        scheme = "grpcs" if "grpc" in self._tls else "grpc"
        return f"{scheme}://{reachable(self._grpc_host, self._grpc_port)}"

    @property
    def metrics_port(self) -> int | None:
        """The bound Prometheus metrics port once started (the one picked for a free port),
        else the one asked for; None without metrics."""
        return self._metrics_port

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` reaching the metrics from this machine; None without."""
        if self._metrics_port is None:
            return None
        scheme = "https" if "http" in self._tls else "http"
        return f"{scheme}://{reachable(self._metrics_host, self._metrics_port)}/metrics"

    def statistics(self, model: str | None = None, version: int | str | None = None) -> dict[str, Any]:
        """Inference statistics in Triton's shape, as ``GET /v2/models[/{model}[/versions/
        {version}]]/stats`` answers them: ``{"model_stats": [{"name", "version",
        "last_inference", "inference_count", "execution_count", "inference_stats",
        "response_stats", "batch_stats", "memory_usage"}]}`` for every ready version of every
        model, of `model`, or that `version`. Raises InferenceServerError (400 for an unknown
        or unready model or version, 503 when the server counts no statistics)."""
        if model is None and version is not None:
            raise ValueError("statistics(version=...) needs a model")
        status, body = self._core.statistics(model or "", "" if version is None else str(version))
        if status != 200:
            raise InferenceServerError(status, str(body))
        result: dict[str, Any] = json.loads(body)
        return result

    @property
    def url(self) -> str:
        """A URL that reaches the server from this machine, also when bound to a wildcard;
        ``unix:///path`` when HTTP is served on a Unix socket only (`Client` takes either)."""
        if self._port is None:
            return f"unix://{self._http_unix}"
        scheme = "https" if "http" in self._tls else "http"
        return f"{scheme}://{reachable(self._host, self._port)}"

    @property
    def running(self) -> bool:
        return self._core.running

    def load_model(
        self,
        name: str,
        config: str | dict[str, object] | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Loads model `name`, or reloads it, as a client's repository load does (the server
        must run with model_control_mode="explicit"). `config` (a JSON string or a dict in
        Triton's JSON model configuration) replaces its config.pbtxt; `files` maps
        ``"file:<version>/<name>"`` (or ``"<version>/<name>"``) to contents that make up the
        whole model directory (then `config` is required). Returns once the new versions
        serve and requests on the old ones are answered. Raises InferenceServerError."""
        text = json.dumps(config) if isinstance(config, dict) else config
        given = None
        if files is not None:
            given = {k[5:] if k.startswith("file:") else k: bytes(v) for k, v in files.items()}
        self._control.load(name, text, given)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unloads every version of `name` once the requests admitted to them are answered
        (model_control_mode="explicit"). Raises InferenceServerError."""
        self._control.unload(name, unload_dependents)

    def repository_index(self, ready: bool = False) -> list[dict[str, str]]:
        """The repository index as ``POST /v2/repository/index`` answers it: one dict per model
        version (name, version, state, reason), or per model with no version loaded (name
        only); `ready` keeps only READY versions."""
        return [_index_dict(e) for e in self._control.index(ready)]

    @property
    def models(self) -> dict[str, tuple[int, ...]]:
        """Model name -> ready versions (ascending), for every model with one ready."""
        ready: dict[str, list[int]] = {}
        for entry in self._control.loaded():
            if entry.model is not None:
                ready.setdefault(entry.name, []).append(entry.model.version)
        return {name: tuple(sorted(v)) for name, v in sorted(ready.items())}

    @property
    def failed(self) -> dict[str, dict[int, str]]:
        """Model name -> {version: reason} for every version that failed to load."""
        failed: dict[str, dict[int, str]] = {}
        for entry in self._control.loaded():
            if entry.model is None:
                version = 1 if entry.version is None else entry.version
                failed.setdefault(entry.name, {})[version] = entry.error or ""
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

    def _urls(self) -> list[tuple[str, str]]:
        """(label, URL) of every listener, for displays."""
        urls = [("HTTP", self.url)]
        if self._http_unix is not None and self._port is not None:
            urls.append(("HTTP", f"unix://{self._http_unix}"))
        if self.grpc_url is not None:
            urls.append(("gRPC", self.grpc_url))
        if self._grpc_unix is not None and self._grpc_port is not None:
            urls.append(("gRPC", f"grpc+unix://{self._grpc_unix}"))
        if self.metrics_url is not None:
            urls.append(("metrics", self.metrics_url))
        return urls

    def __repr__(self) -> str:
        state = "" if self._started and not self._stopped.is_set() else " (not running)"
        grpc = f" {self.grpc_url}" if self.grpc_url is not None else ""
        return f"<openinfer.Server {self.url}{grpc}{state} models=[{', '.join(self.models)}]>"

    def _repr_html_(self) -> str:
        """The URLs and every model version with its state (the repository index)."""
        running = self._started and not self._stopped.is_set()
        title = f"openinfer {__version__} server{'' if running else ' (not running)'}"
        return _display.html(title, self._urls(), self.repository_index())


def _sources(
    repo: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
    models: Model | Iterable[Model] | None,
) -> tuple[Path | list[Path] | None, list[Model]]:
    """The repository to serve (the examples when neither argument is given; a list when
    `repo` names several, as tritonserver's repeated --model-repository) and the given models.
    Two definitions of one name and version are a ValueError, caught here rather than as the
    core's RuntimeError so the message says which."""
    if repo is None and models is None:
        repo = examples_path()
    several = repo is not None and not isinstance(repo, (str, os.PathLike))
    roots = [] if repo is None else [Path(r) for r in (repo if several else [repo])]  # type: ignore[union-attr]
    for root in roots:
        if not root.is_dir():
            raise NotADirectoryError(f"model repository {os.fspath(root)!r} is not a directory")
    given = [models] if isinstance(models, Model) else list(models or ())
    seen: set[tuple[str, int]] = set()
    for model in given:
        if not isinstance(model, Model):
            raise TypeError(f"models must hold openinfer.Model instances, got {model!r}")
        key = (model.name, model.version)
        if key in seen or any((root / model.name / str(model.version)).is_dir() for root in roots):
            raise ValueError(f"model {model.name!r} version {model.version} is defined twice")
        seen.add(key)
    if several:
        return list(dict.fromkeys(roots)), given
    return (roots[0] if roots else None), given


def _metrics_settings(config: Mapping[str, object] | Iterable[str] | None) -> dict[str, object]:
    """The core's keywords for tritonserver's --metrics-config settings: a mapping, or
    "setting=value" strings. Booleans are true/on/1 or false/off/0 as tritonserver reads
    them; summary_quantiles is "<quantile>:<error>,..." (the error is Triton's precision
    target; see the core's summaries for how close openinfer's estimate is). Raises ValueError
    for a malformed or unknown setting."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        pairs = [(str(k), v) for k, v in config.items()]
    else:
        pairs = []
        for item in config:
            name, sep, value = str(item).partition("=")
            if not sep or not name or not value or "," in name:
                raise ValueError(f"metrics config: expected <setting>=<value>, got {item!r}")
            pairs.append((name, value))
    out: dict[str, object] = {}
    for name, value in pairs:
        if name not in _METRICS_SETTINGS:
            known = ", ".join(_METRICS_SETTINGS)
            raise ValueError(f"metrics config: unknown setting {name!r}; expected one of {known}")
        keyword = _METRICS_SETTINGS[name]
        out[keyword] = _quantiles(value) if name == "summary_quantiles" else _bool_setting(name, value)
    return out


# What C++'s std::stod reads at the start of a string (after white space): tritonserver parses
# each quantile and error with it, so "0.0.1" is 0.0 and "0.5abc" is 0.5.
_STOD_PREFIX = re.compile(r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


def _quantiles(value: object) -> list[float]:
    """summary_quantiles as tritonserver's core parses it (MetricReporterConfig::ParseQuantiles):
    "<quantile>:<error>" pairs split by commas, each number read as std::stod reads one; a pair
    it cannot read is logged in its words and left out, and none left keeps the default
    quantiles (an empty list). openinfer also leaves out quantiles or errors outside 0..1 (a
    summary of them means nothing) and refuses more than 16 quantiles."""
    quantiles = []
    for pair in str(value).split(","):
        q, colon, err = pair.partition(":")
        if not colon:
            logger.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", pair)
            continue
        numbers = [_STOD_PREFIX.match(text) for text in (q, err)]
        if not all(numbers):
            logger.error("Invalid option: [%s]. Error: stod", pair)
            continue
        quantile, error = (float(m.group(0)) for m in numbers if m)
        if not (0 <= quantile <= 1 and 0 <= error <= 1):
            logger.error("Invalid option: [%s]. Quantile and error must be 0 to 1", pair)
            continue
        quantiles.append(quantile)
    if len(quantiles) > 16:
        raise ValueError("metrics config: summary_quantiles takes at most 16 quantiles")
    return quantiles


def _bool_setting(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "on", "1"):
        return True
    if text in ("false", "off", "0"):
        return False
    raise ValueError(f"metrics config: {name} must be true or false, got {value!r}")


def _listening_sockets(sockets: Mapping[str, socket.socket | int]) -> dict[str, tuple[int, int]]:
    """`serve()`'s `sockets`, checked: name -> (descriptor, port) of a listening TCP socket."""
    out: dict[str, tuple[int, int]] = {}
    for name, sock in sockets.items():
        if name not in ("http", "grpc", "metrics"):
            raise ValueError(f"sockets: expected the keys http, grpc and metrics; got {name!r}")
        fd = sock if isinstance(sock, int) else sock.fileno()
        try:
            probe = socket.socket(fileno=os.dup(fd))  # a look at it, without taking it over
        except OSError as e:
            raise ValueError(f"sockets[{name!r}]: descriptor {fd} is not a socket ({e.strerror})") from None
        with probe:
            listening = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if probe.family not in (socket.AF_INET, socket.AF_INET6) or probe.type != socket.SOCK_STREAM or not listening:
                raise ValueError(
                    f"sockets[{name!r}] must be a listening TCP socket; got a "
                    f"{probe.family.name} {probe.type.name} socket{'' if listening else ' that is not listening'}"
                )
            out[name] = (fd, probe.getsockname()[1])
    return out


def _paths(given: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None) -> tuple[Path, ...]:
    """One path or several (backend_directory) as a tuple of paths."""
    if given is None:
        return ()
    return (Path(given),) if isinstance(given, (str, os.PathLike)) else tuple(Path(p) for p in given)


def _is_examples(repo: str | os.PathLike[str]) -> bool:
    """The bundled examples serve everywhere: their TorchScript models only where torch is."""
    try:
        return Path(repo).resolve() == examples_path().resolve()
    except FileNotFoundError:  # an installation without them serves other repositories
        return False


def _heavy_examples(repo: Path) -> list[str]:
    """The examples whose config's openinfer_requires parameter names modules they import
    (torch, transformers: seconds to import), installed here: loaded after start-up, on a
    thread of their own, so that the rest of the repository serves at once."""
    from ._repository.repository import REQUIRES_PARAMETER, requirements_missing

    heavy = []
    for d in sorted(p for p in repo.iterdir() if (p / "config.pbtxt").is_file()):
        try:
            config = load_model_config(d)
        except (ConfigError, OSError):
            continue  # its load says why
        if REQUIRES_PARAMETER in config.parameters and not requirements_missing(config):
            heavy.append(d.name)
    return heavy


def _pt2_left_out(repo: Path, loading: set[str] | None, loaded: list[Any]) -> list[tuple[str, Path]]:
    """The PT2 examples (name, version directory) that the start-up left out, waiting for
    their packages: every one with a recipe, of the models loaded (`loading`; None: all),
    that has no entry among `loaded` and can be built here."""
    served = {e.name for e in loaded}
    return [
        (d.name, v)
        for d in sorted(repo.iterdir())
        if d.is_dir() and d.name not in served and (loading is None or d.name in loading)
        for v in sorted(d.iterdir())
        if v.is_dir() and v.name.isdigit() and _pt2_build.has_recipe(v) and _pt2_build.pending(v)
    ]


def _index_dict(entry: IndexEntry) -> dict[str, str]:
    keys = ("name", "version", "state", "reason")
    return {k: v for k, v in zip(keys, entry) if v is not None}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
