"""openinfer: a KServe V2 / Open Inference Protocol server with a C core, for Python models
and TorchScript.

    import openinfer
    server = openinfer.serve("models/")   # returns at once; the server runs on native threads
    print(server.url)                     # it runs until server.stop(), kept or not

This module is the whole public API. `serve` and `Server` load the C extension on first use,
so ``import openinfer`` (and the pytest plugin) stay cheap and work where it is not built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._spawn import leave_the_working_directory

leave_the_working_directory()  # before anything else is imported (numpy.py there would run)

from .errors import InferenceServerError  # noqa: E402
from .model import Model, Request, Tensor, model  # noqa: E402
from ._repository.repository import examples_path  # noqa: E402

if TYPE_CHECKING:
    from .client import AsyncClient, Client
    from .server import Server, serve, servers
    from .shm import SharedMemoryRegion

from ._version import __version__

__all__ = [
    "AsyncClient",
    "Client",
    "InferenceServerError",
    "Model",
    "Request",
    "Server",
    "SharedMemoryRegion",
    "Tensor",
    "__version__",
    "examples_path",
    "model",
    "serve",
    "servers",
]


def __getattr__(name: str) -> Any:
    if name in ("serve", "Server", "servers"):
        from . import server

        return getattr(server, name)
    if name in ("Client", "AsyncClient"):
        from . import client

        return getattr(client, name)
    if name == "SharedMemoryRegion":
        from . import shm

        return shm.SharedMemoryRegion
    raise AttributeError(f"module 'openinfer' has no attribute {name!r}")
