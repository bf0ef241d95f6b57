"""The notebook and library API: servers that run until stop() whether referenced or not,
openinfer.servers(), rich displays, the start message, ``with serve(...)`` and the pytest
fixtures at module and session scope (also under pytest-xdist)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Client, Server
from openinfer.testing import server_fixture

pytest_plugins = ["pytester"]

PYTHON_DIR = str(Path(openinfer.__file__).resolve().parents[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _own_repo(root: Path) -> Path:
    """A repository of one's own: the example identity model under another name."""
    shutil.copytree(openinfer.examples_path() / "identity_fp32", root / "echo")
    return root


def _echo(url: str) -> np.ndarray:
    with Client(url, timeout=10) as client:
        result: np.ndarray = client.infer("echo", {"INPUT0": np.arange(4, dtype=np.float32)})["OUTPUT0"]
        return result


# ---- life cycle ---------------------------------------------------------------------------


def test_unreferenced_server_serves_until_stop(tmp_path: Path) -> None:
    url = openinfer.serve(_own_repo(tmp_path), http_port=0).url  # the server itself is not kept
    gc.collect()
    np.testing.assert_array_equal(_echo(url), np.arange(4, dtype=np.float32))
    (server,) = [s for s in openinfer.servers() if s.url == url]
    server.stop()
    assert server not in openinfer.servers()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/v2/health/live", timeout=10)


def test_servers_lists_running_ones_in_start_order() -> None:
    before = openinfer.servers()
    first = openinfer.serve(http_port=0)
    second = openinfer.serve(http_port=0)
    try:
        assert openinfer.servers() == before + [first, second]
        first.stop()
        assert openinfer.servers() == before + [second]
        first.stop()  # idempotent, and lists nothing twice
        assert openinfer.servers() == before + [second]
    finally:
        first.stop()
        second.stop()
    assert openinfer.servers() == before


def test_server_that_failed_to_start_is_not_listed() -> None:
    with openinfer.serve(http_port=0) as taken:
        before = openinfer.servers()
        server = Server(http_port=taken.http_port)
        with pytest.raises(OSError):
            server.start()
        assert openinfer.servers() == before
        server.stop()


def test_with_block_serves_then_stops() -> None:
    with openinfer.serve(http_port=0) as server:
        assert server.running
        assert server in openinfer.servers()
        assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    assert not server.running
    assert server not in openinfer.servers()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.url}/v2/health/ready", timeout=10)


def test_running_server_is_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    """An unreferenced server left running: the interpreter exits (not hangs) and the exit
    hook stops it (its stop message is logged)."""
    script = f"""
import gc, openinfer, requests
url = openinfer.serve({str(_own_repo(tmp_path))!r}, http_port=0).url
gc.collect()
print(url, requests.get(url + "/v2/models/echo/ready", timeout=10).status_code, flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    url, status = proc.stdout.split()
    assert status == "200"
    assert f"openinfer on {url} stopped" in proc.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/v2/health/live", timeout=10)


# ---- displays -----------------------------------------------------------------------------


def test_server_repr_and_html(tmp_path: Path) -> None:
    repo = _own_repo(tmp_path)
    (repo / "broken<b>" / "1").mkdir(parents=True)
    (repo / "broken<b>" / "config.pbtxt").write_text('backend: "<nope>"\n')
    with openinfer.serve(repo, http_port=0) as server:
        text = repr(server)
        assert server.url in text and str(server.grpc_url) in text and "echo" in text
        page = server._repr_html_()
        for url in (server.url, server.grpc_url, server.metrics_url):
            assert f"<code>{url}</code>" in page
        assert "<td>echo</td><td>1</td><td>READY</td>" in page
        # The failed model, its name and reason escaped: no markup of theirs comes through.
        assert "broken&lt;b&gt;" in page and "<b>" not in page and "<nope>" not in page
        assert "UNAVAILABLE" in page
    assert "(not running)" in repr(server) and "(not running)" in server._repr_html_()


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_client_html_asks_the_server(tmp_path: Path, scheme: str) -> None:
    with openinfer.serve(_own_repo(tmp_path), http_port=0) as server:
        url = server.url if scheme == "http" else str(server.grpc_url)
        with Client(url) as client:
            page = client._repr_html_()
            assert f"<code>{url}</code>" in page
            assert f"<code>openinfer {openinfer.__version__}</code>" in page
            assert "<td>echo</td><td>1</td><td>READY</td>" in page
            assert client.repository_index() == [{"name": "echo", "version": "1", "state": "READY"}]
            assert client.repository_index(ready=True) == client.repository_index()
        assert "(closed)" in client._repr_html_() and "(closed)" in repr(client)


def test_client_html_shows_the_error_of_an_unreachable_server() -> None:
    with openinfer.serve(http_port=0) as server:
        port = server.http_port
    client = Client(f"http://127.0.0.1:{port}/a<b>")  # nothing listens there any more
    page = client._repr_html_()
    assert "ConnectionRefusedError" in page or "ConnectionError" in page
    assert "/a&lt;b&gt;" in page and "<b>" not in page
    client.close()


# ---- the start message --------------------------------------------------------------------

# A script serving twice under some logging setup; stderr is then searched for the start lines.
_LOG_SCRIPT = """
import logging, sys, openinfer
setup = sys.argv[1]
if setup == "before":
    logging.basicConfig(level=logging.INFO, format="app %(name)s: %(message)s")
first = openinfer.serve(http_port=0, log=setup != "quiet")
if setup == "after":  # the application configures logging once a server already runs
    logging.basicConfig(level=logging.INFO, format="app %(name)s: %(message)s")
second = openinfer.serve(http_port=0, log=setup != "quiet")
print(first.url, second.url)
first.stop()
second.stop()
"""


@pytest.mark.parametrize("setup", ["none", "before", "after", "quiet"])
def test_start_message_shown_once(setup: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _LOG_SCRIPT, setup], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    urls = proc.stdout.split()
    lines = proc.stderr.splitlines()
    for url in urls:
        started = [line for line in lines if "listening on" in line and url in line]
        if setup == "quiet":
            assert started == []
            continue
        assert len(started) == 1, proc.stderr
        (line,) = started
        assert f"openinfer {openinfer.__version__} listening on {url} and grpc://127.0.0.1:" in line
        # Without a configuration of the application's own, the fallback handler writes it;
        # once there is one, the application's handler alone does.
        configured = setup == "before" or (setup == "after" and url == urls[1])
        assert line.startswith("app openinfer: " if configured else "openinfer INFO: "), line


def test_cli_start_message_shown_once() -> None:
    """The CLI configures logging itself: its start line is written once."""
    proc = subprocess.Popen([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--grpc-port", "0",
                             "--metrics-port", "0"], env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "listening on" in line:
                break
        proc.terminate()
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sum("listening on" in line for line in seen + rest.splitlines()) == 1, seen + [rest]


# ---- pytest fixtures ----------------------------------------------------------------------

_seen: dict[str, list[Server]] = {}

module_server = server_fixture(openinfer.examples_path(), scope="module")


@pytest.fixture(scope="module")
def module_factory_server(openinfer_server_module) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    yield openinfer_server_module(http_port=0)


@pytest.fixture(scope="session")
def session_factory_server(openinfer_server_session) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    yield openinfer_server_session(models=[_plain_model()])


def _plain_model() -> openinfer.Model:
    @openinfer.model(name="plain", inputs=[openinfer.Tensor("X", "INT32", [-1])],
                     outputs=[openinfer.Tensor("Y", "INT32", [-1])])
    def plain(inputs):  # type: ignore[no-untyped-def]
        return {"Y": inputs["X"] + 1}

    return plain


@pytest.mark.parametrize("round", [1, 2])
def test_module_and_session_fixtures_serve_one_server_each(
    round: int, module_server: Server, module_factory_server: Server, session_factory_server: Server
) -> None:
    for key, server in (("module", module_server), ("factory", module_factory_server),
                        ("session", session_factory_server)):
        assert server.running and server in openinfer.servers()
        assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
        _seen.setdefault(key, []).append(server)
    with Client(session_factory_server.url, timeout=10) as client:
        out = client.infer("plain", {"X": np.array([1, 2], dtype=np.int32)})["Y"]
    np.testing.assert_array_equal(out, [2, 3])
    if round == 2:  # the same server both times
        assert all(len(set(map(id, servers))) == 1 for servers in _seen.values()), _seen


def test_module_fixtures_stopped_after_their_module(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two modules using one module-scoped fixture: each gets its own server, stopped after
    the module's last test; the session-scoped one lives through both."""
    pytester.makeconftest("""
        import openinfer, pytest
        from openinfer.testing import server_fixture

        mod_server = server_fixture(openinfer.examples_path(), scope="module")
        RECORD = []

        @pytest.fixture(scope="session")
        def sess(openinfer_server_session):
            return openinfer_server_session(http_port=0)
    """)
    body = """
        import openinfer
        from conftest import RECORD

        def test_one(mod_server, sess):
            RECORD.append((__name__, mod_server.url, sess.url, [s.url for s in openinfer.servers()]))

        def test_two(mod_server, sess):
            RECORD.append((__name__, mod_server.url, sess.url, [s.url for s in openinfer.servers()]))
    """
    pytester.makepyfile(test_a=body, test_b=body)
    pytester.makepyfile(test_z="""
        import json, os, openinfer
        from conftest import RECORD

        def test_report(sess):
            with open(os.environ["OI_RECORD"], "w") as f:
                json.dump({"record": RECORD, "running": [s.url for s in openinfer.servers()]}, f)
    """)
    out = pytester.path / "record.json"
    monkeypatch.setenv("OI_RECORD", str(out))
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])  # absolute: the run has another cwd
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=5)
    data = json.loads(out.read_text())
    record = data["record"]
    assert [r[0] for r in record] == ["test_a", "test_a", "test_b", "test_b"]
    mod_a, mod_b = record[0][1], record[2][1]
    assert record[1][1] == mod_a and record[3][1] == mod_b and mod_a != mod_b
    assert len({r[2] for r in record}) == 1  # one session server throughout
    assert mod_a not in record[2][3]  # module a's server stopped before module b ran
    assert data["running"] == [record[0][2]]  # in test_z: the session server only


def test_session_fixtures_under_xdist(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``-n 2`` every worker serves the repository itself, on free ports, once for
    all its tests."""
    _own_repo(pytester.path / "models")
    pytester.makeconftest("""
        import pytest
        from openinfer.testing import server_fixture

        models = server_fixture("models", scope="session")

        @pytest.fixture(scope="session")
        def examples(openinfer_server_session):
            return openinfer_server_session()
    """)
    pytester.makepyfile(test_many="""
        import json, os
        import numpy as np
        import pytest
        from openinfer import Client

        @pytest.mark.parametrize("i", range(8))
        def test_echo(i, models, examples):
            with Client(models.url, timeout=10) as client:
                out = client.infer("echo", {"INPUT0": np.full(3, i, dtype=np.float32)})["OUTPUT0"]
            assert out.tolist() == [i, i, i]
            with Client(examples.url, timeout=10) as client:
                assert client.is_model_ready("simple")
            line = json.dumps([os.environ["PYTEST_XDIST_WORKER"], os.getpid(), models.url, examples.url])
            with open(os.path.join(os.environ["OI_RECORD_DIR"], f"{i}.json"), "w") as f:
                f.write(line)
    """)
    record_dir = pytester.path / "record"
    record_dir.mkdir()
    monkeypatch.setenv("OI_RECORD_DIR", str(record_dir))
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=8)
    rows = [json.loads(p.read_text()) for p in sorted(record_dir.iterdir())]
    assert len(rows) == 8
    by_worker: dict[str, set[tuple[int, str, str]]] = {}
    for worker, pid, models_url, examples_url in rows:
        by_worker.setdefault(worker, set()).add((pid, models_url, examples_url))
    assert sorted(by_worker) == ["gw0", "gw1"], by_worker
    assert all(len(v) == 1 for v in by_worker.values()), by_worker  # one server per worker
    urls = [u for v in by_worker.values() for (_, m, e) in v for u in (m, e)]
    assert len(urls) == len(set(urls))  # no two workers (nor fixtures) share a port
