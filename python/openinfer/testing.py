"""A pytest plugin (entry point ``pytest11``: ``openinfer``) with fixtures that serve models
on free ports and always stop them, so a failing test never leaves a port bound.

    def test_simple(openinfer_server):
        server = openinfer_server(models=[my_model])
        requests.post(f"{server.url}/v2/models/my_model/infer", json=...)

The extension is imported only when a fixture runs: pytest loads this plugin in every
session of an environment where openinfer is installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from . import Model, Server

StartServer = Callable[..., "Server"]


@pytest.fixture
def openinfer_server() -> Iterator[StartServer]:
    """A function ``start(repo=None, models=None, **kw) -> Server`` that serves on a free
    port (unless ``http_port`` is given); every server it started stops at teardown."""
    from .server import serve

    started: list[Server] = []

    def start(
        repo: str | os.PathLike[str] | None = None,
        models: Model | Iterable[Model] | None = None,
        **kw: Any,
    ) -> Server:
        kw.setdefault("http_port", 0)
        server = serve(repo, models=models, **kw)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture(scope="session")
def openinfer_example_server() -> Iterator[Server]:
    """The bundled example repository (simple, simple_string, identity_fp32) served once per
    test session on a free port."""
    from .server import serve

    with serve(http_port=0) as server:
        yield server
