"""A pytest plugin (entry point ``pytest11``: ``openinfer``) with fixtures that serve models
on free ports and always stop them, so a failing test never leaves a port bound.

    def test_simple(openinfer_server):
        server = openinfer_server(models=[my_model])
        requests.post(f"{server.url}/v2/models/my_model/infer", json=...)

Module- and session-scoped servers for one's own repository (each pytest-xdist worker starts
its own, on free ports)::

    # conftest.py
    from openinfer.testing import server_fixture

    models_server = server_fixture("tests/models", scope="session")

or the factories `openinfer_server_module` and `openinfer_server_session` inside fixtures of
that scope. The extension is imported only when a fixture runs: pytest loads this plugin in every
session of an environment where openinfer is installed.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from . import Model, Server

StartServer = Callable[..., "Server"]


@contextmanager
def _servers() -> Iterator[StartServer]:
    """A `start` function, and every server it started stopped on leaving."""
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

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def openinfer_server() -> Iterator[StartServer]:
    """A function ``start(repo=None, models=None, **kw) -> Server`` that serves on a free
    port (unless ``http_port`` is given); every server it started stops at teardown."""
    with _servers() as start:
        yield start


@pytest.fixture(scope="module")
def openinfer_server_module() -> Iterator[StartServer]:
    """`openinfer_server` whose servers stop after the last test of the module: for a
    module-scoped fixture that serves one's own repository."""
    with _servers() as start:
        yield start


@pytest.fixture(scope="session")
def openinfer_server_session() -> Iterator[StartServer]:
    """`openinfer_server` whose servers stop at the end of the test session (under
    pytest-xdist: of each worker, every worker serving on free ports of its own)."""
    with _servers() as start:
        yield start


def server_fixture(
    repo: str | os.PathLike[str] | None = None,
    *,
    models: Model | Iterable[Model] | None = None,
    scope: str = "session",
    **kw: Any,
) -> Any:
    """A fixture serving `repo` (and `models`) on free ports for `scope` ("function",
    "class", "module", "package" or "session"), to assign in a conftest.py or test module::

        my_server = openinfer.testing.server_fixture("tests/models", scope="module")

        def test_it(my_server):
            requests.get(f"{my_server.url}/v2/models/mine/ready")

    Every pytest-xdist worker starts its own. `kw` go to `openinfer.serve`."""

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def server() -> Iterator[Server]:
        with _servers() as start:
            yield start(repo, models=models, **kw)

    return server


@pytest.fixture(scope="session")
def openinfer_example_server() -> Iterator[Server]:
    """The bundled example repository (simple, simple_string, identity_fp32) served once per
    test session on a free port."""
    from .server import serve

    with serve(http_port=0) as server:
        yield server
