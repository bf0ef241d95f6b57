"""The ``openinfer`` command (also ``python -m openinfer``):

    openinfer serve [REPO] [--host H] [--http-port P] [--grpc-port P] [--metrics-port P]
                    [--http-unix PATH] [--grpc-unix PATH] [--threads N]
                    [--model-control-mode none|poll|explicit] [--load-model NAME]...
                    [--repository-poll-secs N] [--max-instances N] [--workers N] [--max-body-bytes N] ...

It logs where it listens and which models are ready or failed (and why), then blocks until
SIGINT or SIGTERM, which drain in-flight requests through `Server.stop` and exit 0; with
--drain-grace-secs, SIGTERM first turns readiness false and serves on for that long (`Server.drain`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from ._control import key_sources
from ._version import __version__

logger = logging.getLogger("openinfer")

# The core's limits, exposed as --max-body-bytes and so on; unset ones keep the core default.
_LIMITS: dict[str, str] = {
    "max_body_bytes": "largest JSON or raw request body, or binary-extension JSON header (default 64 MiB, "
    "tritonserver's --http-max-input-size)",
    "max_header_bytes": "largest request header block (default 64 KiB)",
    "max_connections": "concurrent connections; when full, the oldest idle one is closed "
    "(default 4096)",
    "max_connections_per_peer": "concurrent connections from one address "
    "(default 0: half of max-connections)",
    "first_byte_timeout_ms": "time a new connection may stay silent, and for the gRPC preface "
    "(default 5000)",
    "header_timeout_ms": "time allowed to send the headers (default 30000)",
    "body_timeout_ms": "time a request body may go without bytes (default 30000)",
    "body_min_rate": "bytes per second a request body (or gRPC request message) must average "
    "once it has taken body-timeout-ms, else 408 / DEADLINE_EXCEEDED (default 500; 0: none)",
    "max_inflight_body_bytes": "memory for request bodies and gRPC messages in flight, as "
    "received and decompressed; past it 503 / RESOURCE_EXHAUSTED (default 0: half of the "
    "memory the process may use)",
    "max_inflate_ratio": "largest ratio of decompressed to compressed bytes of a request body "
    "or gRPC message, once past 64 MiB decompressed (default 1000; 0: no limit)",
    "idle_timeout_ms": "idle keep-alive connection timeout, also gRPC connections with no "
    "open stream (default 300000)",
    "max_json_depth": "deepest JSON nesting accepted (default 64)",
    "grpc_max_message_bytes": "largest gRPC request message (default 2 GiB)",
    "grpc_max_queued_bytes": "response bytes a gRPC connection may leave unread before its "
    "requests wait (default 64 MiB)",
    "max_sequence_backlog": "sequences that may wait for a sequence slot, per model; a new one "
    "past it is refused with 503 / UNAVAILABLE (default 1000; 0: no limit, as tritonserver)",
}


# tritonserver's flags that openinfer cannot honour, each with why: given one, `serve` stops and
# names it rather than run with a setting the deployment asked for silently dropped.
# (docs/features.md's tritonserver flag table lists every flag.)
_TRITON_REFUSED: dict[str, str] = {
    "disable-auto-complete-config": "openinfer always completes model configurations "
    "(a TorchScript or ONNX model may serve without config.pbtxt)",
    "backend-config": "openinfer's backends take no backend settings",
    "repoagent-directory": "openinfer has no repository agents",
    "model-config-name": "openinfer reads config.pbtxt only",
    "model-load-thread-count": "openinfer loads a repository's models one at a time",
    "model-load-retry-count": "openinfer does not retry a failed load",
    "enable-peer-access": "openinfer does not manage CUDA peer access",
    "reuse-http-port": "use --workers N to share a port among servers",
    "reuse-grpc-port": "use --workers N to share a port among servers",
    "grpc-infer-thread-count": "gRPC is served on the event-loop threads (--threads)",
    "grpc-infer-allocation-pool-size": "openinfer keeps no pool of gRPC request states",
    "grpc-max-response-pool-size": "gRPC responses wait under --grpc-max-queued-bytes instead",
    "grpc-keepalive-time": "openinfer sends no gRPC keepalive pings",
    "grpc-keepalive-timeout": "openinfer sends no gRPC keepalive pings",
    "grpc-keepalive-permit-without-calls": "openinfer has no gRPC ping policy",
    "grpc-http2-max-pings-without-data": "openinfer has no gRPC ping policy",
    "grpc-http2-min-recv-ping-interval-without-data": "openinfer has no gRPC ping policy",
    "grpc-http2-max-ping-strikes": "openinfer has no gRPC ping policy",
    "grpc-max-connection-age": "openinfer does not age connections out (idle ones: --idle-timeout-ms)",
    "grpc-max-connection-age-grace": "openinfer does not age connections out",
    "allow-sagemaker": "openinfer has no SageMaker endpoint",
    "sagemaker-port": "openinfer has no SageMaker endpoint",
    "sagemaker-safe-port-range": "openinfer has no SageMaker endpoint",
    "sagemaker-thread-count": "openinfer has no SageMaker endpoint",
    "allow-vertex-ai": "openinfer has no Vertex AI endpoint",
    "vertex-ai-port": "openinfer has no Vertex AI endpoint",
    "vertex-ai-thread-count": "openinfer has no Vertex AI endpoint",
    "vertex-ai-default-model": "openinfer has no Vertex AI endpoint",
    "rate-limit": "openinfer has no rate limiter (instances run whenever free)",
    "rate-limit-resource": "openinfer has no rate limiter",
    "pinned-memory-pool-byte-size": "openinfer keeps no pinned memory pool",
    "cuda-memory-pool-byte-size": "openinfer keeps no CUDA memory pool (libtorch's allocator serves)",
    "cuda-virtual-address-size": "openinfer keeps no CUDA memory pool",
    "min-supported-compute-capability": "openinfer leaves GPU selection to libtorch",
    "buffer-manager-thread-count": "openinfer has no buffer manager threads",
    "host-policy": "openinfer has no host policies (NUMA binding)",
    "model-load-gpu-limit": "openinfer does not limit model loads by GPU memory",
    "cache-directory": "openinfer keeps no compiled-model cache directory",
}


class _Refused(argparse.Action):
    """A tritonserver flag openinfer cannot honour: an error naming it and why."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        flag = (option_string or self.dest).lstrip("-")
        parser.error(f"tritonserver's --{flag} is not supported by openinfer: {_TRITON_REFUSED[flag]}")


def _input_size(text: str) -> int:
    """--http-max-input-size: bytes, above 0 (tritonserver's words when not)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("Error: --http-max-input-size must be greater than 0.")
    return value


def _triton_flags(serve: argparse.ArgumentParser) -> None:
    """tritonserver's flags with its meaning, so a container or Helm chart can run
    `openinfer serve` with tritonserver's arguments; the rest of its flags are refused."""
    group = serve.add_argument_group("tritonserver's flags")
    group.add_argument(
        "--model-repository", "--model-store", action="append", default=[], metavar="PATH",
        help="a model repository, besides REPO (repeatable: a model two repositories have is "
        "not served, as tritonserver, unless --model-namespacing)",
    )
    group.add_argument(
        "--model-namespacing", type=_triton_bool, nargs="?", const=True, default=False, metavar="BOOL",
        help="true: each repository is a namespace, so that several may hold a model of one name "
        "(a request by a name several hold is refused as ambiguous; an ensemble's steps are its "
        "own repository's models first) (default false)",
    )
    group.add_argument(
        "--strict-readiness", type=_triton_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="true: /v2/health/ready is ready only while every model is; false: once the server "
        "serves (default true)",
    )
    group.add_argument(
        "--exit-on-error", type=_triton_bool, nargs="?", const=True, default=False, metavar="BOOL",
        help="exit with status 1 when a model fails to load at start (default false; "
        "tritonserver's default is true)",
    )
    group.add_argument(
        "--strict-model-config", type=_triton_bool, nargs="?", const=True, default=False,
        metavar="BOOL", help="false only: openinfer completes model configurations",
    )
    group.add_argument(
        "--http-max-input-size", type=_input_size, metavar="BYTES",
        help="as --max-body-bytes: the largest JSON body, binary-extension JSON header or raw body "
        "(default 64 MiB); binary tensor data after a JSON header is bounded by --max-inflight-body-bytes",
    )
    for level in ("info", "warning", "error"):
        group.add_argument(
            f"--log-{level}", type=_triton_bool, nargs="?", const=True, default=True, metavar="BOOL",
            help=f"false leaves {level} lines out of the log (default true)",
        )
    group.add_argument("--http-thread-count", type=int, metavar="N", help="as --threads")
    group.add_argument("--id", default="openinfer", metavar="NAME",
                       help="the server's name in its metadata (GET /v2; default openinfer)")
    group.add_argument("--exit-timeout-secs", type=float, metavar="SECONDS", help="as --shutdown-timeout")
    group.add_argument(
        "--allow-http", type=_triton_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="false: no HTTP over TCP (as --http-port -1: needs --http-unix)",
    )
    group.add_argument(
        "--allow-grpc", type=_triton_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="false: no gRPC over TCP (as --grpc-port -1)",
    )
    group.add_argument("--http-address", metavar="HOST", help="as --host")
    group.add_argument("--grpc-address", metavar="HOST", help="the gRPC listener's host (default --host)")
    for proto, what in (("http", "HTTP headers"), ("grpc", "gRPC metadata")):
        group.add_argument(
            f"--{proto}-header-forward-pattern", metavar="REGEX",
            help=f"{what} of inference requests whose names match it (POSIX extended, "
            "case-insensitive) reach the model as request parameters",
        )
    group.add_argument(
        "--allow-client-shm", dest="allow_shared_memory", type=_triton_bool, metavar="BOOL",
        help="as --allow-shared-memory (default false)",
    )
    for flag in _TRITON_REFUSED:
        group.add_argument("--" + flag, action=_Refused, nargs="?", help=argparse.SUPPRESS)


def _triton_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Folds tritonserver's flags into openinfer's (see _triton_flags); refuses what cannot be
    honoured through parser.error."""
    repos = list(dict.fromkeys(args.model_repository))
    if args.repo is not None:
        repos = list(dict.fromkeys([args.repo, *repos]))
    args.repo = repos[0] if len(repos) == 1 else repos or None
    if args.strict_model_config:
        parser.error("tritonserver's --strict-model-config true is not supported by openinfer: "
                     + _TRITON_REFUSED["disable-auto-complete-config"])
    if args.http_max_input_size is not None:
        if args.max_body_bytes is not None and args.max_body_bytes != args.http_max_input_size:
            parser.error("--http-max-input-size and --max-body-bytes set the same limit: give one")
        args.max_body_bytes = args.http_max_input_size
    if args.http_thread_count is not None:
        args.threads = args.http_thread_count
    if args.exit_timeout_secs is not None:
        args.shutdown_timeout = args.exit_timeout_secs
    if args.http_address is not None:
        args.host = args.http_address
    if not args.allow_http:
        if args.http_unix is None:
            parser.error("--allow-http false needs --http-unix PATH: openinfer serves HTTP on a Unix "
                         "socket then, never on none")
        args.http_port = -1
    if not args.allow_grpc:
        args.grpc_port = -1
    # tritonserver turns each level off on its own: lines of a level turned off are dropped by
    # _drop_levels, and the threshold rises past the lowest ones.
    off = {lvl for lvl in ("info", "warning", "error") if not getattr(args, f"log_{lvl}")}
    args.log_dropped = {getattr(logging, lvl.upper()) for lvl in off}
    for lvl, above in (("info", "warning"), ("warning", "error"), ("error", "critical")):
        if lvl not in off:
            break
        if getattr(logging, args.log_level.upper()) <= getattr(logging, lvl.upper()):
            args.log_level = above


def _drop_levels(dropped: set[int]) -> None:
    """--log-warning false with --log-info true and the like: the root handlers drop the
    records of the levels turned off."""
    if dropped:
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: record.levelno not in dropped)


def _octal_mode(value: str) -> int:
    """--unix-socket-mode: permission bits in octal (660, 0660 or 0o660)."""
    try:
        mode = int(value.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected octal permission bits such as 660, got {value!r}") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"expected permission bits 000 to 777, got {value!r}")
    return mode


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command != "serve":
        parser.print_help(sys.stderr)
        return 2
    _triton_args(parser, args)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1:
        return _supervise(args, argv[argv.index("serve") + 1 :])
    return _serve(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openinfer", description="KServe V2 / Open Inference Protocol server"
    )
    parser.add_argument("--version", action="version", version=f"openinfer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve a model repository", description="Serve a model repository."
    )
    serve.add_argument(
        "repo", nargs="?", help="Triton-layout model repository (default: the bundled examples)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--http-port",
        type=int,
        default=8000,
        metavar="PORT",
        help="HTTP port; 0 picks a free one, -1 serves HTTP on --http-unix only (default 8000)",
    )
    serve.add_argument(
        "--grpc-port",
        type=int,
        metavar="PORT",
        help="gRPC port; 0 picks a free one, -1 serves no gRPC over TCP "
        "(default 8001, a free one with --http-port 0, none with --http-port -1)",
    )
    serve.add_argument(
        "--http-unix",
        metavar="PATH",
        help="also serve HTTP on a Unix-domain socket at PATH: the recommended local transport "
        "(requests act with the connecting user's rights)",
    )
    serve.add_argument(
        "--grpc-unix", metavar="PATH", help="also serve gRPC on a Unix-domain socket at PATH"
    )
    serve.add_argument(
        "--unix-socket-mode",
        type=_octal_mode,
        default=0o660,
        metavar="OCTAL",
        help="permission bits of the Unix socket files (default 660: the server's user and group)",
    )
    for proto, name in (("http", "HTTP (and /metrics)"), ("grpc", "gRPC")):
        serve.add_argument(
            f"--{proto}-use-ssl",
            type=_triton_bool,
            nargs="?",
            const=True,
            default=False,
            metavar="BOOL",
            help=f"serve {name} over TLS with --{proto}-server-cert and --{proto}-server-key, as tritonserver",
        )
        serve.add_argument(
            f"--{proto}-use-ssl-mutual",
            type=_triton_bool,
            nargs="?",
            const=True,
            default=False,
            metavar="BOOL",
            help=f"serve {name} over mutual TLS: clients need a certificate that --{proto}-root-cert "
            f"signed (implies --{proto}-use-ssl)",
        )
        serve.add_argument(f"--{proto}-server-cert", metavar="PEM", help=f"{name} server certificate (chain) file")
        serve.add_argument(f"--{proto}-server-key", metavar="PEM", help=f"{name} server private key file")
        serve.add_argument(
            f"--{proto}-root-cert", metavar="PEM", help=f"CA certificates that sign {name} client certificates"
        )
    serve.add_argument(
        "--grpc-infer-response-compression-level",
        type=str.lower,  # tritonserver reads the value in any case
        choices=["none", "low", "medium", "high"],
        default="none",
        help="compress ModelInfer/ModelStreamInfer responses for clients that accept it, as "
        "tritonserver does (default none)",
    )
    serve.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="event-loop threads (default 0: one per CPU the process may use: its affinity mask and cgroup CPU quota)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="server processes sharing the ports, each loading the repository (default 1); "
        "--threads then counts per worker (default: the cores divided among them)",
    )
    # A worker of --workers: the parent's sockets (NAME=FD,...) and its index, never typed by hand.
    serve.add_argument("--inherit-sockets", help=argparse.SUPPRESS)
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument(
        "--allow-shared-memory",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let clients on this host register shared-memory regions (default: off, as "
        "tritonserver's --allow-client-shm; openinfer.serve() opens it on loopback hosts)",
    )
    serve.add_argument(
        "--model-control-mode",
        default="none",
        type=str.lower,  # tritonserver reads the value in any case: EXPLICIT is explicit
        choices=["none", "poll", "explicit"],
        help="as tritonserver: none loads the whole repository at start; poll also rescans it "
        "for new, changed and removed models; explicit loads only --load-model models and lets "
        "clients load and unload (default none)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode explicit: a model to load at start (repeatable; * for "
        "all)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="N",
        help="with --model-control-mode poll: seconds between scans (default 15)",
    )
    serve.add_argument(
        "--backend-directory",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of Python-based backends (DIR/NAME/model.py serves models whose config says "
        "backend: \"NAME\"), searched before the one openinfer ships (Triton's vLLM backend); may "
        "be repeated. It holds code: it must be owned by the server's user and not writable by others",
    )
    serve.add_argument(
        "--max-instances",
        type=int,
        default=None,
        metavar="N",
        help="the most model instances (executor threads, worker processes) of all loaded models "
        "together: a load request past it is refused (models loaded at start or by polling count "
        "but are not refused; default: 4 per usable CPU, at least 64)",
    )
    serve.add_argument(
        "--model-unload-timeout-secs",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long an unload or reload waits for the requests of the versions that leave; "
        "then their worker processes are killed and an execute still running in the server is "
        "abandoned (logged). Loads and unloads of other models never wait on it (default: "
        "--shutdown-timeout)",
    )
    serve.add_argument(
        "--allow-statistics",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="count inference statistics (the statistics extension and the per-model metrics); "
        "false leaves the request path without counters (default true)",
    )
    serve.add_argument(
        "--allow-metrics",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics at /metrics on --metrics-port (default true)",
    )
    serve.add_argument(
        "--allow-gpu-metrics",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="GPU metrics through NVML where there is a GPU (default true)",
    )
    serve.add_argument(
        "--allow-cpu-metrics",
        type=_triton_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="CPU utilization and memory metrics (default true)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="port of /metrics; 0 serves none (default 8002, or a free one with --http-port 0)",
    )
    serve.add_argument(
        "--metrics-address",
        metavar="HOST",
        help="address the metrics listener binds (default: --host)",
    )
    serve.add_argument(
        "--metrics-interval-ms",
        type=int,
        default=2000,
        metavar="MS",
        help="how often CPU and GPU metrics are read: every half of it, as tritonserver "
        "(default 2000)",
    )
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="CACHE,SETTING=VALUE",
        help="tritonserver's response cache: local,size=BYTES (the local cache only); models "
        "opt in with response_cache { enable: true }",
    )
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="tritonserver's restricted APIs: those APIs (health, metadata, inference, "
        "shared-memory, model-config, model-repository, statistics, trace, logging; openai: the /v1 API) answer only "
        "HTTP requests with header KEY: VALUE, others get 403 (repeatable, an API once)",
    )
    serve.add_argument(
        "--openai-api-key",
        metavar="KEY",
        default=os.environ.get("OPENINFER_OPENAI_API_KEY") or None,
        help="OpenAI's API under /v1 answers only requests with header Authorization: Bearer KEY, "
        "others get 401 (the same as --http-restricted-api openai:authorization=Bearer KEY). On the "
        "command line every local user can read it: in production set OPENINFER_OPENAI_API_KEY, or put "
        "the openai entry in --http-restricted-api-file",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="the same for gRPC: the calls must carry metadata triton-grpc-protocol-KEY: VALUE, "
        "others get UNAVAILABLE (repeatable)",
    )
    for option, entry in (("http-restricted-api", "API"), ("grpc-restricted-protocol", "PROTOCOL")):
        serve.add_argument(
            f"--{option}-file",
            action="append",
            default=[],
            metavar="FILE",
            help=f"--{option} entries ({entry}[,...]:KEY=VALUE), one a line, read from FILE, and also "
            f"from the environment variable {key_sources.ENV_VARS[option]}: the keys stay out of the "
            "command line, which every local user can read (repeatable)",
        )
    serve.add_argument(
        "--response-cache-byte-size",
        type=int,
        metavar="BYTES",
        help="deprecated in tritonserver: --cache-config local,size=BYTES",
    )
    serve.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="tritonserver's metrics settings: counter_latencies=true|false, "
        "histogram_latencies=true|false, summary_latencies=true|false, "
        "summary_quantiles=Q:ERR,... (repeatable)",
    )
    for limit, text in _LIMITS.items():
        serve.add_argument("--" + limit.replace("_", "-"), type=int, metavar="N", help=text)
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight requests may take; then the rest are "
        "answered 503 and the server exits (default 30)",
    )
    serve.add_argument(
        "--drain-grace-secs",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, first turn readiness false and go on serving new connections and "
        "requests for SECONDS (the time a load balancer takes to notice), then stop as "
        "--shutdown-timeout says; a second signal cuts it short (default 0: stop at once)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--access-log",
        nargs="?",
        const="-",
        metavar="PATH",
        help="one line per request to PATH, or to standard output without one (default: off)",
    )
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[triton,]SETTING=VALUE",
        help="tritonserver's trace settings: level=OFF|TIMESTAMPS|TENSORS (repeatable), rate=N, "
        "count=N, mode=triton, triton,file=PATH, triton,log-frequency=N (repeatable)",
    )
    serve.add_argument(
        "--trace-file",
        metavar="PATH",
        help="where the trace extension writes traces (Triton's JSON); clients turn tracing on "
        "with /v2/trace/setting (default: no tracing); as --trace-config triton,file=PATH",
    )
    serve.add_argument(
        "--trace-level",
        action="append",
        metavar="LEVEL",
        help="as --trace-config level=LEVEL (tritonserver's older flag; repeatable)",
    )
    serve.add_argument("--trace-rate", metavar="N", help="as --trace-config rate=N")
    serve.add_argument("--trace-count", metavar="N", help="as --trace-config count=N")
    serve.add_argument(
        "--trace-log-frequency", metavar="N", help="as --trace-config triton,log-frequency=N"
    )
    serve.add_argument(
        "--log-file",
        metavar="PATH",
        help="write the server's log to PATH instead of stderr (clients cannot change it)",
    )
    serve.add_argument(
        "--log-verbose", type=int, default=0, metavar="LEVEL", help="above 0, verbose lines too"
    )
    serve.add_argument(
        "--log-format",
        default="default",
        choices=["default", "ISO8601"],
        help="the layout of --log-file's lines (tritonserver's)",
    )
    _triton_flags(serve)
    return parser


def _supervise(args: argparse.Namespace, serve_argv: list[str]) -> int:
    """--workers N: the parent binds the ports and runs the workers (see openinfer._control.workers)."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _drop_levels(args.log_dropped)
    refusals = [
        (args.model_control_mode == "explicit", "--model-control-mode explicit: a load or unload request "
         "would reach one worker only (use none or poll: each worker then loads the same models)"),
        (args.http_unix or args.grpc_unix, "--http-unix / --grpc-unix: workers share TCP ports only"),
        (args.http_port < 0, "--http-port -1: workers share TCP ports only"),
        (args.trace_file, "--trace-file: every worker would write the same file"),
        (any(c.lower().startswith("triton,file=") for c in args.trace_config),
         "--trace-config triton,file=: every worker would write the same file"),
    ]
    for refused, why in refusals:
        if refused:
            print(f"openinfer: error: --workers {args.workers} cannot be combined with {why}", file=sys.stderr)
            return 2
    from ._net import reachable
    from ._control.workers import Supervisor, listen, listen_group

    def port(given: int | None, default: int) -> int:
        return given if given is not None else 0 if args.http_port == 0 else default

    try:
        sockets = {"http": listen_group(args.host, args.http_port, args.workers)}
        if port(args.grpc_port, 8001) >= 0:
            sockets["grpc"] = listen_group(args.host, port(args.grpc_port, 8001), args.workers)
        # --metrics-port 0 serves none; unset, it is 8002, or a free one with --http-port 0.
        metrics = None
        if args.allow_metrics and args.metrics_port != 0:
            metrics = listen(args.metrics_address or args.host, port(args.metrics_port, 8002))
    except OSError as e:
        print(f"openinfer: error: cannot listen on {args.host}: {e.strerror}", file=sys.stderr)
        return 1
    if args.threads == 0:  # the cores, shared among the workers
        serve_argv = [*serve_argv, "--threads", str(max(1, len(os.sched_getaffinity(0)) // args.workers))]
    supervisor = Supervisor(serve_argv, args.workers, sockets, metrics)
    def url(scheme: str, sock: socket.socket) -> str:
        return f"{scheme}://{reachable(sock.getsockname()[0], sock.getsockname()[1])}"

    logger.info(
        "%d workers listening on %s%s%s", args.workers,
        url("https" if args.http_use_ssl or args.http_use_ssl_mutual else "http", sockets["http"][0]),
        f", {url('grpcs' if args.grpc_use_ssl or args.grpc_use_ssl_mutual else 'grpc', sockets['grpc'][0])}"
        if "grpc" in sockets else "",
        f", metrics {url('http', metrics)}/metrics" if metrics else "",
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("%s: stopping the workers", signal.Signals(signum).name)
        supervisor.signal(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # Each worker loads the TLS files itself: a renewed certificate reaches them all.
    signal.signal(signal.SIGHUP, lambda signum, frame: supervisor.forward(signum))
    return supervisor.run()


def _triton_bool(text: str) -> bool:
    """A boolean option value as tritonserver reads one: true/on/1 or false/off/0."""
    value = text.lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _serve(args: argparse.Namespace) -> int:
    worker = "" if args.worker_index is None else f"[worker {args.worker_index}]"
    logging.basicConfig(
        level=args.log_level.upper(), format=f"%(asctime)s %(levelname)s %(name)s{worker}: %(message)s"
    )
    if args.worker_index:  # the workers share their ports: worker 0 warns of what is open, once
        logging.getLogger("openinfer.exposure").setLevel(logging.ERROR)
    _drop_levels(args.log_dropped)
    try:
        from .server import Server  # the extension loads here, not for --help or --version
    except ImportError as e:
        print(f"openinfer: error: the C extension is not available: {e}", file=sys.stderr)
        return 1

    limits = {k: getattr(args, k) for k in _LIMITS if getattr(args, k) is not None}
    grpc: dict[str, int | None] = {}
    if args.grpc_port is not None:
        grpc["grpc_port"] = None if args.grpc_port < 0 else args.grpc_port
    if args.http_port < 0 and args.http_unix is None:
        print("openinfer: error: --http-port -1 needs --http-unix PATH", file=sys.stderr)
        return 2
    metrics: dict[str, object] = {
        "statistics": args.allow_statistics,
        "metrics_config": args.metrics_config,
        "allow_cpu_metrics": args.allow_cpu_metrics,
        "allow_gpu_metrics": args.allow_gpu_metrics,
        "metrics_address": args.metrics_address,
        "metrics_interval_ms": args.metrics_interval_ms,
    }
    if not args.allow_metrics:
        metrics["metrics_port"] = None
    elif args.metrics_port is not None:
        metrics["metrics_port"] = args.metrics_port
    sockets: dict[str, int] = {}
    if args.inherit_sockets:  # a worker of --workers: the parent's sockets, nothing else
        from ._control.workers import watch_parent

        sockets = {k: int(v) for k, v in (kv.split("=") for kv in args.inherit_sockets.split(","))}
        grpc["grpc_port"] = None if "grpc" not in sockets else 0
        metrics["metrics_port"] = None if "metrics" not in sockets else 0
        watch_parent()
    ssl = {}
    for proto in ("http", "grpc"):
        if getattr(args, f"{proto}_use_ssl") or getattr(args, f"{proto}_use_ssl_mutual"):
            ssl[proto] = {
                "server_cert": getattr(args, f"{proto}_server_cert"),
                "server_key": getattr(args, f"{proto}_server_key"),
                "root_cert": getattr(args, f"{proto}_root_cert"),
                "mutual": getattr(args, f"{proto}_use_ssl_mutual"),
            }
    stopping = threading.Event()
    started: list[Server] = []

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        # A renewed certificate: new connections get it, open ones finish with theirs.
        for srv in (srv for srv in started if srv.running):
            try:
                srv.reload_tls()
                logger.info("SIGHUP: TLS certificates and keys reloaded")
            except ValueError as e:
                logger.error("SIGHUP: %s; the previous certificates stay in use", e)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Draining can take a while and needs no main thread, so it runs on its own thread
        # and the handler returns at once; the main thread wakes from wait() when it is done.
        # Installed before the models load: a signal then stops before any port opens; one
        # that comes while start() opens the ports drains or stops once they are open.
        # SIGTERM is how orchestrators start a rolling update: it drains first when asked to.
        # A second signal (or SIGINT, a person at a terminal) stops without the grace period.
        drain = signum == signal.SIGTERM and args.drain_grace_secs > 0 and not stopping.is_set()
        name = signal.Signals(signum).name
        if drain:
            logger.info("%s: draining for %gs, then stopping after in-flight requests", name, args.drain_grace_secs)
        elif stopping.is_set():
            logger.info("%s: stopping now", name)
        else:
            logger.info("%s: stopping after in-flight requests", name)
        stopping.set()
        for srv in started:
            target, extra = (srv.drain, (args.drain_grace_secs,)) if drain else (srv.stop, ())
            threading.Thread(
                target=target, args=(*extra, args.shutdown_timeout), name="openinfer-stop"
            ).start()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if ssl:
        signal.signal(signal.SIGHUP, on_hangup)
    try:
        server = Server(  # loads the models; no port opens until start()
            args.repo,
            host=args.host,
            http_port=None if args.http_port < 0 else args.http_port,
            threads=args.threads,
            allow_shared_memory=args.allow_shared_memory,
            model_control_mode=args.model_control_mode,
            load_models=args.load_model,
            repository_poll_secs=args.repository_poll_secs,
            max_instances=args.max_instances,
            backend_directory=args.backend_directory,
            model_unload_timeout=args.shutdown_timeout if args.model_unload_timeout_secs is None
            else args.model_unload_timeout_secs,
            http_unix=args.http_unix,
            grpc_unix=args.grpc_unix,
            unix_socket_mode=args.unix_socket_mode,
            grpc_infer_response_compression_level=args.grpc_infer_response_compression_level,
            log_file=args.log_file,
            log_verbose=args.log_verbose,
            log_format=args.log_format,
            access_log=args.access_log,
            trace_file=args.trace_file,
            trace_config=args.trace_config,
            trace_level=args.trace_level,
            trace_rate=args.trace_rate,
            trace_count=args.trace_count,
            trace_log_frequency=args.trace_log_frequency,
            sockets=sockets,
            cache_config=args.cache_config,
            response_cache_byte_size=args.response_cache_byte_size,
            http_restricted_api=[*args.http_restricted_api, *key_sources.entries_kept_secret(
                "http-restricted-api", args.http_restricted_api_file)]
            + ([f"openai:authorization=Bearer {args.openai_api_key}"] if args.openai_api_key else []),
            grpc_restricted_protocol=[*args.grpc_restricted_protocol, *key_sources.entries_kept_secret(
                "grpc-restricted-protocol", args.grpc_restricted_protocol_file)],
            grpc_address=args.grpc_address,
            strict_readiness=args.strict_readiness,
            model_namespacing=args.model_namespacing,
            server_id=args.id,
            http_header_forward_pattern=args.http_header_forward_pattern,
            grpc_header_forward_pattern=args.grpc_header_forward_pattern,
            ssl=ssl or None,
            **grpc,
            **metrics,  # type: ignore[arg-type]
            **limits,
        )
    except (OSError, ValueError) as e:
        print(f"openinfer: error: {e}", file=sys.stderr)
        return 1
    # From here a signal drains or stops this server, whether or not start() has returned.
    started.append(server)
    if args.exit_on_error and server.failed:  # tritonserver's --exit-on-error: a failed load ends it
        print(f"openinfer: error: --exit-on-error: model(s) failed to load: {', '.join(sorted(server.failed))}",
              file=sys.stderr)
        server.stop(args.shutdown_timeout)
        return 1
    if stopping.is_set():  # a signal came while the models loaded: nobody relies on us yet
        server.stop(args.shutdown_timeout)
    try:
        server.start()  # stopped already (a signal), it opens nothing
    except (OSError, ValueError) as e:
        server.stop(args.shutdown_timeout)
        print(f"openinfer: error: {e}", file=sys.stderr)
        return 1
    # Wake up now and then: Python runs signal handlers between bytecodes of the main thread.
    while not server.wait(0.5):
        pass
    return 0
