"""Type stub for the C extension `openinfer._core` (csrc/python/). The contract between the
Python package and the C core: Python scans repositories and builds metadata; C serves."""

from typing import Callable, Mapping, Sequence

import numpy as np

__version__: str

# One input or output declaration: (name, V2 datatype such as "INT32", full shape with -1
# for a variable dimension, or None for any shape; when max_batch_size > 0 the first
# dimension is the batch, -1).
IOSpec = tuple[str, str, Sequence[int] | None]

# Called on an executor thread with the GIL held:
#   handler(inputs, parameters, outputs) -> {name: array-like}
# inputs: {name: read-only numpy array viewing the request memory} (BYTES: object array of bytes)
# parameters: the raw JSON text of the request's "parameters" object, or None
# outputs: the names of the outputs to produce, in response order
# A raised exception becomes a 500 response with its message. Returned values are converted
# with numpy to the declared datatype (C-contiguous); BYTES accept bytes or str elements.
Handler = Callable[[dict[str, np.ndarray], bytes | None, tuple[str, ...]], Mapping[str, object]]

class Server:
    """A V2 server, HTTP/1.1 and gRPC (h2c on its own port), on native event-loop threads."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        http_port: int = 8000,
        *,
        threads: int = 0,  # event-loop threads; 0: one per core
        max_body_bytes: int = 1 << 30,
        max_header_bytes: int = 64 << 10,
        max_connections: int = 4096,
        header_timeout_ms: int = 30_000,
        idle_timeout_ms: int = 300_000,
        max_json_depth: int = 64,
        grpc_port: int = 8001,  # -1: no gRPC; 0 picks a free port
        grpc_max_message_bytes: int = 2 << 30,  # largest gRPC request message
    ) -> None: ...
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
    ) -> None:
        """Registers one model version. handler=None with error=reason registers a version that
        failed to load: it answers not ready, and infer answers 503 with the reason. The
        request without a version goes to the highest ready version. Raises ValueError on a
        bad spec and RuntimeError when the version is already registered."""
    def start(self) -> None:
        """Binds and starts the loop threads; returns at once. Raises OSError when binding fails."""
    @property
    def port(self) -> int:
        """The bound HTTP port (useful with http_port=0); 0 before start()."""
    @property
    def grpc_port(self) -> int:
        """The bound gRPC port (useful with grpc_port=0); 0 before start() or without gRPC."""
    @property
    def running(self) -> bool: ...
    def stop(self, timeout: float = 30.0) -> None:
        """Stops accepting, waits up to `timeout` seconds for in-flight requests, then closes
        every connection and joins the threads. Idempotent."""
