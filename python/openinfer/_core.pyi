"""Type stub for the C extension `openinfer._core` (csrc/python/). The contract between the
Python package and the C core: Python scans repositories and builds metadata; C serves."""

from typing import Any, Callable, Mapping, Sequence

import numpy as np

__version__: str
RESTRICTED_APIS: tuple[str, ...]  # tritonserver's restricted-API groups, in its order, then "openai" (/v1)

# One input or output declaration: (name, V2 datatype such as "INT32", full shape with -1
# for a variable dimension, or None for any shape; when max_batch_size > 0 the first
# dimension is the batch, -1), and optionally whether a request may leave the input out.
IOSpec = tuple[str, str, Sequence[int] | None] | tuple[str, str, Sequence[int] | None, bool]

# Called on an executor thread with the GIL held:
#   handler(inputs, parameters, outputs, cancelled) -> {name: array-like}
# inputs: {name: read-only numpy array viewing the request memory} (BYTES: object array of bytes)
# parameters: the raw JSON text of the request's "parameters" object, or None
# outputs: the names of the outputs to produce, in response order
# cancelled: called with no arguments, True once every client of the request (or batch) has
#   gone (connection closed, stream reset, deadline passed); valid while the handler runs
# A raised exception becomes a 500 response with its message. Returned values are converted
# with numpy to the declared datatype (C-contiguous); BYTES accept bytes or str elements.
Handler = Callable[
    [dict[str, np.ndarray], bytes | None, tuple[str, ...], Callable[[], bool]], Mapping[str, object]
]

# add_model(torch=...): how a TorchScript module serves the declared inputs and outputs
# (python/openinfer/torch_model.py builds it).
#   path: the TorchScript file; devices: one per instance, "cpu" or "cuda:N"
#   arg_inputs: forward() argument k takes declared input arg_inputs[k]
#   output_index / output_key: declared output i is result element output_index[i], or the
#     dict entry output_key[i] (not None) when forward() returns a dict
#   input_reshape / output_reshape: per declared tensor, the shape forward() sees or returns
#     past the batch dimension (Triton's reshape), or None
#   inference_mode, disable_optimized_execution (0/1), intra_op_threads,
#     inter_op_threads (0: torch's default)
TorchSpec = dict[str, object]

# add_model(onnx=...): how ONNX Runtime sessions serve the declared inputs and outputs
# (python/openinfer/onnx_model.py builds it).
#   path: the .onnx file; devices: one per instance, -1 the CPU or a CUDA device id
#   graph_level (a GraphOptimizationLevel), execution_mode (0 sequential, 1 parallel),
#     intra_op_threads, inter_op_threads (0: ONNX Runtime's default)
#   gpu_accelerators / cpu_accelerators: [(name, [(key, value), ...])], appended on GPU
#     ("cuda", "tensorrt") or CPU ("openvino") instances
#   input_reshape / output_reshape: per declared tensor, the session's shape past the batch
#     dimension (Triton's reshape), or None
#   session: the first instance's session from onnx_describe on this spec (optional)
OnnxSpec = dict[str, object]

def _hold_work(on: bool) -> None:
    """For tests: while on, work sent off the event loops ((de)compression) waits to start."""

def _held_work() -> int:
    """For tests: how many pieces of work wait on _hold_work."""

def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by the cgroup CPU quota
    (at least 1)."""

def peer_credentials(sock: int | object) -> dict[str, object]:
    """{"uid", "gid" (-1: unknown), "groups"} of the process on the other end of a connected
    socket, as the server sees its clients; OSError when unknown (ENOENT: not on this host)."""

def torch_open_shim(path: str) -> None:
    """Loads the libtorch shim (dlopen RTLD_NOW | RTLD_LOCAL) once per process; torch must be
    imported first. Raises OSError (also for a shim of another ABI version)."""

def torch_describe(path: str) -> str:
    """JSON describing a TorchScript file's forward(): {"arguments": [{"name", "type",
    "has_default"}], "returns": annotation, "example_inputs": [{"dtype", "shape"}] | null,
    "example_outputs": [{"name", "dtype", "shape"}] | null} (outputs from one forward() on
    the module's example_inputs attribute). Raises RuntimeError when it cannot load."""

def onnx_open(path: str) -> tuple[str, int]:
    """Loads libonnxruntime (dlopen RTLD_NOW | RTLD_LOCAL) once per process and returns its
    (version, API version in use). Raises OSError (also for a library too old)."""

def onnx_describe(spec: OnnxSpec) -> tuple[str, object]:
    """Makes the first instance's session of `spec` (an add_model onnx spec without the
    reshapes) and returns JSON of the model's tensors: {"inputs": [...], "outputs": [...]},
    each {"name", "datatype" ("" without a V2 one), "onnx_type", "kind", "shape" (-1 where
    variable; null when the rank is unknown)}, and the session, for spec["session"]: the
    add_model that takes it makes no session for that instance (released when none takes it).
    Raises RuntimeError when it cannot load."""

def onnx_providers() -> str:
    """JSON list of the loaded ONNX Runtime's execution providers."""

RepositoryHandler = Callable[
    [str, str | None, bytes | None, dict[str, bool | int | str | bytes] | None, bool, memoryview],
    list[tuple[str | None, str | None, str | None, str | None]] | list[tuple[str, bool | int | str]] | None,
]

class TensorBase:
    """The C half of pb_utils.Tensor: its fields, construction, name() and as_numpy()."""

    _name: str
    _array: Any
    _datatype: str
    def __init__(self, name: str, data: Any, *, _datatype: str | None = None) -> None: ...
    def name(self) -> str: ...
    def as_numpy(self) -> Any: ...

class ResponseBase:
    """The C half of pb_utils.InferenceResponse: its fields, construction and plain reads."""

    _outputs: list[Any]
    _error: Any
    _parameters: str | None
    def __init__(self, output_tensors: Any = None, error: Any = None, parameters: Any = None) -> None: ...
    def output_tensors(self) -> list[Any]: ...
    def has_error(self) -> bool: ...
    def error(self) -> Any: ...

class RequestBase:
    """The C half of pb_utils.InferenceRequest: its fields and plain reads (the Python class
    makes a model's own requests; the core makes the requests it serves)."""

    _model_name: str
    _inputs: list[Any]
    _requested: list[str]
    _request_id: str
    _correlation_id: int | str
    _flags: int
    _timeout: int
    _model_version: int
    _parameters: str
    _cancelled: Callable[[], bool]
    _sender: Any
    _decoupled: bool | None
    _release_flags: int
    def inputs(self) -> list[Any]: ...
    def requested_output_names(self) -> list[str]: ...
    def request_id(self) -> str: ...
    def correlation_id(self) -> int | str: ...
    def flags(self) -> int: ...
    def timeout(self) -> int: ...
    def parameters(self) -> str: ...
    def model_name(self) -> str: ...
    def is_cancelled(self) -> bool: ...

def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    """pb_utils.get_input_tensor_by_name: the request's input Tensor of that name, or None."""

class TritonExecute:
    """A Triton Python model's execute as the core calls it for a request or dynamic batch of a
    model that is not decoupled (add_model's and worker_serve's `direct`): the requests built
    from the core's arrays, an instance taken from `free`, pb_utils' context `serving_var` set to
    (host, name, cancel flag, version folder) around execute, and the plain responses' arrays
    sent as they are (a batch's joined by rows); any other outcome goes to conclude(instance,
    requests, outputs, cancelled, result, error), which returns what a handler returns."""

    def __init__(
        self, free: Any, conclude: Callable[..., Any], serving_var: Any, serving: tuple[Any, str, str],
        inputs: tuple[tuple[str, str], ...], outputs: tuple[str, ...], classes: tuple[type, type, type],
    ) -> None: ...

class ModelVersion:
    """A model version built by Server.add_model(publish=False), served once swapped in."""

    @property
    def error(self) -> str | None: ...
    @property
    def version(self) -> int | None: ...
    @property
    def load_seconds(self) -> float | None: ...
    @load_seconds.setter
    def load_seconds(self, value: float) -> None: ...
    def warmup(self, requests: Sequence[Sequence[tuple[str, str, Sequence[int], bytes]]]) -> str | None:
        """One warm-up iteration through the version's scheduler: the failures joined, or None."""

class Server:
    """A V2 server, HTTP/1.1 and gRPC (h2c on its own port), on native event-loop threads."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        http_port: int = 8000,  # -1: HTTP on http_unix only
        *,
        threads: int = 0,  # event-loop threads; 0: one per usable CPU (affinity, cgroup quota)
        max_body_bytes: int = 1 << 30,
        max_header_bytes: int = 64 << 10,
        max_connections: int = 4096,  # when full, the oldest idle connection makes room
        header_timeout_ms: int = 30_000,  # a request's first byte to the end of its headers
        idle_timeout_ms: int = 300_000,  # keep-alive HTTP, or gRPC with no open stream
        max_json_depth: int = 64,
        grpc_port: int = 8001,  # -1: no gRPC over TCP; 0 picks a free port
        grpc_max_message_bytes: int = 2 << 30,  # largest gRPC request message
        allow_shared_memory: bool | None = None,  # None: only when host is a loopback address
        max_connections_per_peer: int = 0,  # per client address; 0: half of max_connections
        first_byte_timeout_ms: int = 5_000,  # silent new connection / gRPC preface; 0: idle timeout
        body_timeout_ms: int = 30_000,  # a request body with no bytes for this long gets 408
        grpc_max_queued_bytes: int = 64 << 20,  # unread responses before a connection's requests wait
        statistics: bool = True,  # count inferences (statistics extension, per-model metrics)
        metrics_port: int = -1,  # Prometheus /metrics listener; 0 picks a free port, -1: none
        metrics_counter_latencies: bool = True,  # the *_duration_us counters
        metrics_histogram_latencies: bool = False,  # nv_inference_first_response_histogram_ms
        metrics_cpu: bool = True,  # nv_cpu_utilization, nv_cpu_memory_*_bytes
        metrics_gpu: bool = True,  # nv_gpu_* through NVML, when it finds a GPU
        http_unix: str | None = None,  # also serve HTTP on this Unix socket path
        grpc_unix: str | None = None,  # also serve gRPC on this Unix socket path
        unix_socket_mode: int = 0o660,  # the socket files' permission bits
        grpc_infer_compression_level: int = 0,  # 0 none, 1 low, 2 medium, 3 high (as tritonserver)
        access_log: str | None = None,  # a path, or "-" for standard output; None: no access log
        trace_file: str | None = None,  # the trace extension's file; None: no tracing
        http_listen_fd: int = 0,  # > 0: serve this listening socket (on http_port) instead of binding
        grpc_listen_fd: int = 0,  # > 0: the same for gRPC (on grpc_port)
        metrics_listen_fd: int = 0,  # > 0: the same for /metrics (on metrics_port)
        response_cache_bytes: int = 0,  # the response cache's capacity; 0: no cache
        max_inflight_body_bytes: int = 0,  # request bodies/messages in flight, raw and inflated; 0: half of memory
        max_inflate_ratio: int = 1000,  # inflated bytes per compressed byte past 64 MiB; 0: no limit
        body_min_rate: int = 500,  # bytes/s a request body must average past body_timeout_ms; 0: none
        metrics_address: str | None = None,  # the metrics listener's host; None: host
        metrics_interval_ms: int = 2000,  # CPU/GPU readings every half of it
        metrics_summary_latencies: bool = False,  # nv_inference_*_summary_us
        metrics_summary_quantiles: Sequence[float] | None = None,  # None: 0.5 .. 0.999
        max_sequence_backlog: int = 1000,  # sequences waiting for a slot, per model; 0: no limit
        # restricted APIs: (group, header, value) each; gRPC headers carry their prefix already
        http_restricted: Sequence[tuple[str, str, str]] | None = None,
        grpc_restricted: Sequence[tuple[str, str, str]] | None = None,
        grpc_address: str | None = None,  # the gRPC listener's host; None: host
        strict_readiness: bool = True,  # False: ready once serving, whatever the models' state
        http_header_forward_pattern: str | None = None,  # headers matching it become request parameters
        grpc_header_forward_pattern: str | None = None,  # metadata matching it become request parameters
        http_tls: tuple[str, str, str | None, bool] | None = None,  # cert, key, root cert, mutual
        grpc_tls: tuple[str, str, str | None, bool] | None = None,  # the same, ALPN h2
    ) -> None: ...
    def reload_tls(self) -> None:
        """Loads the TLS certificates and keys again: new connections get them, open ones keep theirs."""
    def set_metadata(self, metadata_json: bytes) -> None:
        """Sets the body of GET /v2 (server metadata)."""
    def add_model(
        self,
        name: str,
        version: int,
        *,
        inputs: Sequence[IOSpec],
        outputs: Sequence[IOSpec],
        max_batch_size: int,
        metadata_json: bytes,
        handler: Handler | None,
        instances: int = 1,
        error: str | None = None,
        torch: TorchSpec | None = None,
        dynamic_batching: tuple[Any, ...] | None = None,
        config_json: bytes | None = None,
        config_pb: bytes | None = None,
        publish: bool = True,
        sequence_batching: tuple[int, int, list[tuple[str, int, str, float, float]],
                                 list[tuple[str, str, str, tuple[int, ...], bytes]],
                                 tuple[int, float] | None, bool] | None = None,
        decoupled: bool = False,  # handler returns an iterator of 0..N responses per request
        onnx: OnnxSpec | None = None,
        labels: dict[str, bytes] | None = None,
        # an ensemble's steps: (model_name, model_version, input_map, output_map), each map a
        # list of (step model tensor, ensemble tensor); with handler=None
        ensemble: Sequence[tuple[str, int, Sequence[tuple[str, str]], Sequence[tuple[str, str]]]] | None = None,
        response_cache: bool = False,  # use the server's response cache (if it has one)
        # a model whose function takes the inputs alone: (fn, select), so that the core calls
        # fn(inputs) itself and select(result, output_names) only for a result that is not a
        # dict holding every requested output (select returns the outputs or raises); or a
        # Triton Python model's TritonExecute: the core then calls its execute itself
        direct: tuple[Callable[[dict[str, Any]], Any], Callable[[Any, tuple[str, ...]], dict[str, Any]]]
        | TritonExecute | None = None,
        # the instances as worker processes (openinfer._backends.processes.worker_spec, then optionally a
        # buffer whose first byte, once set, gives up starting them: the version then fails)
        workers: tuple[list[str], list[str], bytes, int] | tuple[list[str], list[str], bytes, int, Any] | None = None,
        # a ready check asks the application (the repository handler's "ready" op) instead of
        # being answered on the event loop: a Triton Python model's is_ready()
        ready_probe: bool = False,
        # the model's namespace (its repository, with --model-namespacing): a name held in
        # several is ambiguous to requests, and an ensemble's steps find its own first
        namespace: str | None = None,
        # OpenAI's API: the model's own names for the tensors of Triton's LLM conventions, as
        # (convention's name, model's name) pairs (config.pbtxt's openai_<name> parameters)
        openai_names: Sequence[tuple[str, str]] | None = None,
    ) -> str | None | ModelVersion:
        """Registers one model version. `labels` maps an output name to its label file's bytes
        (one label a line) for the classification extension. handler=None with error=reason registers a version that
        failed to load: it answers not ready, and infer answers 503 with the reason. The
        request without a version goes to the highest ready version. Raises ValueError on a
        bad spec and RuntimeError when the version is already registered.

        torch=spec (no handler) serves a TorchScript module through the libtorch shim (load
        it first with torch_open_shim), one module per instance on spec["devices"]; when
        the module cannot load, the version is registered as failed and the reason is
        returned (otherwise None). onnx=spec does the same with one ONNX Runtime session per
        instance (load the library first with onnx_open). dynamic_batching=(preferred_batch_sizes,
        max_queue_delay_us) with max_batch_size > 0 gathers concurrent requests into one
        call (Python handlers then see the concatenated batch); optional further items:
        max_queue_size, level_policies (one (delay, default_timeout_us, allow_timeout_override,
        max_queue_size) per priority level, or None), default_priority_level, preserve_ordering.
        config_json and config_pb are
        the version's configuration in Triton's JSON and as a serialized inference.ModelConfig,
        served as they are by the model configuration endpoints (without them, those answer
        404).

        publish=False builds the version without registering it and returns it as a
        ModelVersion (its `error` says why it cannot serve), for swap_models.

        sequence_batching=(slots, idle_us, controls, states, direct, states_follow_outputs) puts
        a sequence batcher in front of the executors (openinfer._config.sequence.SequenceBatching.core
        builds it): requests then need a sequence_id, run in order per sequence with each control
        (name, kind, datatype, false, true) and state (input, output, datatype, dims, initial
        bytes) added. states_follow_outputs: each state input is the last request's state output
        (which the model must produce); False: every request gets the initial state, and the state
        outputs are not asked of the model (Triton's python_backend).
        direct=(max_queue_delay_us, minimum_slot_utilization) is Triton's Direct strategy: each
        sequence keeps one batch row of one instance, padded batches formed by the batcher;
        direct=None is Oldest, where dynamic_batching says how ready requests of different
        sequences batch."""
    def swap_models(
        self, add: Sequence[ModelVersion], remove: Sequence[tuple[str, int] | tuple[str, int, str | None]],
        timeout: float | None = None,
    ) -> list[tuple[str, int]]:
        """In one registry step, each of `add` replaces the entry of its namespace, name and
        version and each (name, version[, namespace]) of `remove` leaves; then waits (without the GIL) until the
        requests admitted to the entries that left are answered, and ends them. With a
        `timeout` (seconds per entry), an entry whose requests still run then has its queued
        requests failed and its worker processes killed, and a short grace; one still running
        after it is abandoned (left allocated: an execute still uses it). Returns the (name,
        version) of those abandoned."""
    def set_repository(self, handler: RepositoryHandler) -> None:
        """Serves the model repository extension (POST /v2/repository/..., gRPC Repository*)
        through handler(op, model, body, params, ready, stop), called on a control thread per
        request: op "index", "load" or "unload", "logging" (GET/POST /v2/logging, gRPC
        LogSettings) or "trace" (GET/POST /v2/[models/{model}/]trace/setting, gRPC TraceSetting;
        model None for the global settings); body the HTTP request body (None over gRPC or when
        empty); params the gRPC parameters (None over HTTP; for "trace" each a list of str);
        ready the gRPC index flag; stop a one-byte memoryview that turns 1 once the client has
        gone (closed its connection, reset its stream, passed its deadline), released when the
        handler returns. It returns the index as (name, version, state, reason) tuples
        (None: left out), for "logging" and "trace" every setting as (name, bool | int | str |
        list of str), or None; an exception with `status` and `message` (InferenceServerError) answers with
        them, any other with 500. Before start()."""
    def set_chat_renderer(self, renderer: Callable[[str, int, bytes], str]) -> None:
        """Serves /v1/chat/completions: renderer(model, version, messages) returns the prompt
        for the request's messages (the JSON array's bytes), on a worker thread, once per
        request; an exception with `status` and `message` answers with them. Before start()."""
    def start(self) -> None:
        """Binds and starts the loop threads; returns at once. Raises OSError when binding fails."""
    @property
    def port(self) -> int:
        """The bound HTTP port (useful with http_port=0); 0 before start()."""
    @property
    def grpc_port(self) -> int:
        """The bound gRPC port (useful with grpc_port=0); 0 before start() or without gRPC."""
    @property
    def metrics_port(self) -> int:
        """The bound metrics port; 0 before start() or without metrics."""
    def trace_set(
        self, model: str | None, clear: bool, level: int, rate: int, count: int, log_frequency: int
    ) -> None:
        """The trace sampling settings of `model` (None: the global ones): level 0 off, 1
        TIMESTAMPS; one request in `rate`; `count` traces more (-1: no limit); the file flushed
        every `log_frequency` traces (0: at the end). `clear` drops the model's own settings.
        RuntimeError without a trace file."""
    def trace_count(self, model: str | None) -> int:
        """The traces `model` (None: globally) may still take; -1: no limit."""
    def set_custom_metrics(self, text: bytes) -> None:
        """The models' own metric families (Prometheus text), appended to every /metrics scrape."""
    def statistics(self, name: str = "", version: str = "") -> tuple[int, bytes | str]:
        """Triton's statistics body for every model (name ""), every ready version of one
        (version ""), or one version: (200, JSON bytes), else (status code, message) — 400 for
        an unknown or unready model or version, 503 when the server counts no statistics."""
    @property
    def running(self) -> bool: ...
    @property
    def shared_memory(self) -> bool:
        """Whether clients may register shared-memory regions (system and CUDA)."""
    def drain(self) -> None: ...
    def stop(self, timeout: float = 30.0) -> None:
        """Stops accepting, waits up to `timeout` seconds for in-flight requests, then closes
        every connection and joins the threads. Idempotent."""

# ---- gRPC client (csrc/python/grpc_client.c) ------------------------------------------------
# Each call returns (grpc_status, value): the value when the status is 0 (OK), else the
# grpc-message. Connection failures raise ConnectionError, deadlines TimeoutError. `timeout` is
# in seconds (None: no deadline). Inputs are (name, V2 datatype, array-like) triples; an
# inference result is (model_name, model_version, id, {name: ndarray}, {name: datatype}) with
# the arrays viewing the received message through one shared base.

InputSpec = tuple[str, str, object]
InferResult = tuple[str | None, str | None, str | None, dict[str, np.ndarray], dict[str, str]]

class GrpcConnection:
    """One gRPC (h2c) connection, opened on first use and reopened after a failure. One thread
    at a time (another gets RuntimeError); several calls and streams may be open on it."""

    def __init__(
        self, host: str, port: int, *, tls: tuple[str | None, str | None, str | None, bool] | None = None
    ) -> None: ...  # tls: (CA file, client certificate, its key, verify the server)
    def server_live(self, timeout: float | None = None) -> tuple[int, bool | str]: ...
    def server_ready(self, timeout: float | None = None) -> tuple[int, bool | str]: ...
    def model_ready(self, name: str, version: str | None = None,
                    timeout: float | None = None) -> tuple[int, bool | str]: ...
    def server_metadata(self, timeout: float | None = None) -> tuple[int, dict[str, object] | str]:
        """The dict has the keys of GET /v2: name, version, extensions."""
    def model_metadata(self, name: str, version: str | None = None,
                       timeout: float | None = None) -> tuple[int, dict[str, object] | str]:
        """The dict has the keys of GET /v2/models/<name>: name, versions, platform, inputs,
        outputs (each {name, datatype, shape})."""
    def unary(self, method: str, body: bytes = b"", timeout: float | None = None) -> tuple[int, bytes | str]:
        """Any unary RPC: `method` is its path, `body` the serialized request message."""
    def infer(self, model: str, inputs: Sequence[InputSpec], outputs: Sequence[str] | None = None,
              version: str | None = None, request_id: str | None = None,
              parameters: Mapping[str, bool | int | float | str | bytes] | None = None,
              timeout: float | None = None) -> tuple[int, InferResult | str]: ...
    def stream(self, model: str, version: str | None = None, outputs: Sequence[str] | None = None,
               parameters: Mapping[str, bool | int | float | str | bytes] | None = None,
               timeout: float | None = None) -> GrpcStream:
        """Opens a ModelStreamInfer call whose requests share these fields; `timeout` bounds the
        whole stream."""
    def close(self) -> None: ...

class GrpcStream:
    """One ModelStreamInfer call on a GrpcConnection."""

    def send(self, inputs: Sequence[InputSpec], request_id: str | None = None) -> bool:
        """Sends one request (written to the socket on return); False when the stream has
        already ended."""
    def close_send(self) -> None:
        """Ends the client's side of the stream."""
    def recv(self, nowait: bool = False) -> tuple[str | None, InferResult] | None | bool:
        """The next answer as (error_message or None, result); None once the stream has ended
        (see status()); False with nowait when nothing has arrived yet."""
    def status(self) -> tuple[int, str] | None:
        """(grpc_status, message) once the stream has ended, else None."""
    def close(self) -> None:
        """Cancels the stream if it is still open and frees it."""
