"""Loads that would take the server down (issue 29, items 2 and 7), through tritonclient over
HTTP and gRPC and raw sockets.

- Model instances are bounded server-wide (`max_instances`, --max-instances): a load past the
  bound is refused with 400 / INVALID_ARGUMENT naming the count and the bound, before any
  instance starts, and no worker process is left.
- A Python model's worker processes start a few at a time; an unload of the model, or a client
  that leaves (connection closed, gRPC deadline), stops a slow load: no more workers start,
  those started are reaped.
- Workers of a model loaded through the API serve (they once died with the control thread that
  started them), and end with a server killed outright.
- A config override or request body nested past --max-json-depth is a 400 naming the limit; a
  NUL in a `file:` name is shown, not the end of the message; unloading a model the server does
  not know succeeds and changes nothing, as in Triton (qa/L0_lifecycle: "Unload non-existing
  model, nothing should happen").

Worker processes are counted as this process's children whose command line runs
openinfer._worker (the servers here run in this process)."""

from __future__ import annotations

import json
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import INT32_IO, INT32_IO_PBTXT, Cli, python_model, triton_grpc, triton_http, wait_for, worker_children

BOUND = 60.0  # seconds: a bound for a hung test, not a measurement
MAX_INSTANCES = 16
# Each import appends its pid to imports.log; a worker's import then takes SLOW_S seconds.
MODEL = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    with open(Path(__file__).parents[1] / "imports.log", "a") as f:
        f.write(f"{os.getpid()}\\n")
    if "openinfer._worker" in sys.argv[0] or "openinfer._worker" in open("/proc/self/cmdline").read():
        time.sleep(float((Path(__file__).parents[1] / "slow_s").read_text()))


    def infer(inputs):
        return {"OUTPUT0": inputs["INPUT0"] + 1}
    """
)
SLOW_S = 1.0
SLOW_COUNT = 12  # workers the slow load asks for: it would take 6 s or more on 2 CPUs


def _model(repo: Path, name: str, slow_s: float = 0.0) -> None:
    python_model(repo, name, MODEL)
    (repo / name / "slow_s").write_text(str(slow_s))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("limits")
    for name in ("fast", "other", "fast_http", "fast_grpc"):
        _model(root, name)
    for name in ("slow_http", "slow_grpc", "left_http", "left_grpc"):
        _model(root, name, SLOW_S)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[openinfer.Server]:
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False, model_control_mode="explicit",
                          max_instances=MAX_INSTANCES)
    try:
        yield srv
    finally:
        srv.stop()


def _config(name: str, count: int, kind: str | None = None) -> str:
    group: dict[str, Any] = {"count": count}
    if kind:
        group["kind"] = kind
    return json.dumps({"name": name, "backend": "python", "instance_group": [group], **INT32_IO})


def _load(protocol: str, srv: openinfer.Server, name: str, config: str | None = None, **kw: Any) -> tuple[str, str]:
    client = triton_http(srv) if protocol == "http" else triton_grpc(srv)
    try:
        client.load_model(name, config=config, **kw)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "ok", ""


BAD = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def _infer(srv: openinfer.Server, name: str, value: int) -> int:
    x = thttp.InferInput("INPUT0", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(triton_http(srv).infer(name, [x]).as_numpy("OUTPUT0")[0])


def _imports(repo: Path, name: str) -> int:
    log = repo / name / "imports.log"
    return len(log.read_text().split()) if log.exists() else 0


def _reason(srv: openinfer.Server, name: str) -> str:
    index = {m["name"]: m for m in triton_http(srv).get_model_repository_index()}
    return str(index[name].get("reason", ""))


# ---- the instance bound -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_load_past_the_instance_bound_is_refused_before_any_worker_starts(
    server: openinfer.Server, protocol: str
) -> None:
    before = worker_children()
    status, message = _load(protocol, server, "fast", _config("fast", 2000))
    assert status == BAD[protocol], message
    assert message == ("failed to load 'fast': instance_group count 2000 exceeds the server's limit of "
                       f"{MAX_INSTANCES} instances (--max-instances)")
    assert worker_children() == before
    assert not triton_http(server).is_model_ready("fast")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_instances_of_every_loaded_model_count_together(server: openinfer.Server, protocol: str) -> None:
    # KIND_MODEL instances are threads of the server: they count as much as processes do.
    assert _load(protocol, server, "fast", _config("fast", 10, "KIND_MODEL")) == ("ok", "")
    try:
        status, message = _load(protocol, server, "other", _config("other", 8, "KIND_MODEL"))
        assert status == BAD[protocol], message
        assert message == ("failed to load 'other': instance_group count 8 and the 10 instances of the models "
                           f"loaded or loading exceed the server's limit of {MAX_INSTANCES} instances (--max-instances)")
        # A reload counts its new instances in place of its current ones.
        assert _load(protocol, server, "fast", _config("fast", MAX_INSTANCES, "KIND_MODEL")) == ("ok", "")
        assert _infer(server, "fast", 1) == 2
    finally:
        triton_http(server).unload_model("fast")
    assert _load(protocol, server, "other", _config("other", 8, "KIND_MODEL")) == ("ok", "")
    triton_http(server).unload_model("other")


def test_models_loaded_at_start_count_but_are_not_refused(tmp_path: Path) -> None:
    # The repository is the operator's: its models load past the bound, and then requests
    # cannot add more. The command line sets the bound too.
    _model(tmp_path, "many")
    (tmp_path / "many" / "config.pbtxt").write_text(
        'name: "many"\ninstance_group [ { count: 3 kind: KIND_MODEL } ]\n' + INT32_IO_PBTXT)
    _model(tmp_path, "more")
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False, max_instances=2,
                         model_control_mode="explicit", load_models=["many"]) as srv:
        assert _infer(srv, "many", 1) == 2
        status, message = _load("http", srv, "more", _config("more", 1, "KIND_MODEL"))
        assert status == "400" and message == (
            "failed to load 'more': instance_group count 1 and the 3 instances of the models loaded or loading "
            "exceed the server's limit of 2 instances (--max-instances)")
    with pytest.raises(ValueError, match=r"max_instances \(--max-instances\) must be an integer >= 1, got 0"):
        openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False, max_instances=0)
    cli = Cli("--model-control-mode", "explicit", "--max-instances", "2", str(tmp_path))
    try:
        r = requests.post(f"http://127.0.0.1:{cli.port}/v2/repository/models/many/load", timeout=BOUND)
        assert r.status_code == 400
        assert r.json()["error"] == ("failed to load 'many': instance_group count 3 exceeds the server's limit of "
                                     "2 instances (--max-instances)")
    finally:
        cli.kill()


# ---- worker processes of loads ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_workers_of_a_model_loaded_through_the_api_serve(server: openinfer.Server, protocol: str) -> None:
    name = f"fast_{protocol}"
    before = worker_children()
    assert _load(protocol, server, name, _config(name, 2)) == ("ok", "")
    try:
        workers = worker_children() - before
        assert len(workers) == 2
        assert [_infer(server, name, v) for v in range(4)] == [1, 2, 3, 4]
        assert worker_children() - before == workers  # the same two, alive after the load's thread ended
    finally:
        triton_http(server).unload_model(name)
    assert not worker_children() & workers


def _slow_load(protocol: str, srv: openinfer.Server, name: str, done: dict[str, Any], **kw: Any) -> threading.Thread:
    def run() -> None:
        done["result"] = _load(protocol, srv, name, _config(name, SLOW_COUNT), **kw)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unload_stops_a_slow_load_and_reaps_its_workers(
    repo: Path, server: openinfer.Server, protocol: str
) -> None:
    name = f"slow_{protocol}"
    before = worker_children()
    done: dict[str, Any] = {}
    thread = _slow_load(protocol, server, name, done)
    wait_for(lambda: worker_children() - before, "a worker started", BOUND)
    triton_http(server).unload_model(name)  # waits for the load it stopped
    thread.join(BOUND)
    status, message = done["result"]
    assert status == BAD[protocol], message
    assert f"model '{name}': the load was stopped (unloaded, or its client left) after " in message
    assert f" of {SLOW_COUNT} worker processes had started" in message
    assert not worker_children() - before
    assert _imports(repo, name) < 1 + SLOW_COUNT  # the server's own import, and fewer workers than asked
    assert _reason(server, name) == "unloaded"


def test_a_client_that_closes_its_connection_stops_a_slow_load(repo: Path, server: openinfer.Server) -> None:
    name = "left_http"
    before = worker_children()
    body = json.dumps({"parameters": {"config": _config(name, SLOW_COUNT)}}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=BOUND) as sock:
        sock.sendall(f"POST /v2/repository/models/{name}/load HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: worker_children() - before, "a worker started", BOUND)
    wait_for(lambda: "the load was stopped" in _reason(server, name), "the load stopped", BOUND)
    assert not worker_children() - before
    assert _imports(repo, name) < 1 + SLOW_COUNT


def test_a_grpc_deadline_stops_a_slow_load(repo: Path, server: openinfer.Server) -> None:
    name = "left_grpc"
    before = worker_children()
    done: dict[str, Any] = {}
    thread = _slow_load("grpc", server, name, done, client_timeout=1.0)
    thread.join(BOUND)
    assert done["result"][0] == "StatusCode.DEADLINE_EXCEEDED", done
    wait_for(lambda: "the load was stopped" in _reason(server, name), "the load stopped", BOUND)
    assert not worker_children() - before
    assert _imports(repo, name) < 1 + SLOW_COUNT


def test_workers_end_with_a_server_killed_outright(tmp_path: Path) -> None:
    _model(tmp_path, "pair")
    cli = Cli(str(tmp_path), "--model-control-mode", "explicit")
    try:
        r = requests.post(f"http://127.0.0.1:{cli.port}/v2/repository/models/pair/load",
                          json={"parameters": {"config": _config("pair", 2)}}, timeout=BOUND)
        assert r.status_code == 200, r.text
        workers = {int(p) for task in Path(f"/proc/{cli.proc.pid}/task").iterdir()
                   for p in (task / "children").read_text().split()
                   if b"openinfer._worker" in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert len(workers) == 2
        cli.proc.send_signal(signal.SIGKILL)
        cli.proc.wait(BOUND)
        wait_for(lambda: not any(_alive(p) for p in workers), "the workers ended with the server", BOUND)
    finally:
        cli.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# ---- small ones ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_deeply_nested_config_override_is_refused_naming_the_limit(server: openinfer.Server, protocol: str) -> None:
    deep = '{"parameters":' * 5000 + "{}" + "}" * 5000
    status, message = _load(protocol, server, "fast", deep)
    assert status == BAD[protocol], message
    assert message == ("failed to load 'fast': Invalid config override nests 5001 levels deep, more than the "
                       "limit of 64 (--max-json-depth)")


@pytest.mark.parametrize("path", ["repository/models/fast/load", "repository/models/fast/unload",
                                  "repository/index", "logging"])
def test_a_deeply_nested_control_body_is_refused_naming_the_limit(server: openinfer.Server, path: str) -> None:
    body = b'{"parameters":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = requests.post(f"{server.url}/v2/{path}", data=body, timeout=BOUND)
    assert r.status_code == 400, r.text
    assert r.json()["error"].endswith("request JSON buffer: it nests 100001 levels deep, more than the limit "
                                      "of 64 (--max-json-depth)")


def test_a_nul_in_a_file_name_is_shown_whole(server: openinfer.Server) -> None:
    body = {"parameters": {"config": "{}", "file:1/a\0b.pt": "AAAA"}}
    r = requests.post(f"{server.url}/v2/repository/models/fast/load", json=body, timeout=BOUND)
    assert r.status_code == 400
    assert r.json()["error"] == ("Invalid file parameter 'file:1/a\\x00b.pt': the path must stay within the model "
                                 "directory (no '.', '..' or empty components)")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_file_name_too_long_for_the_file_system_is_refused(server: openinfer.Server, protocol: str) -> None:
    # Found by tests/fuzz/fuzz_load.py: the file system's ENAMETOOLONG, now checked before any
    # write, answered as tritonserver answers it (INTERNAL, which Triton's
    # simple_grpc_model_control.py example expects).
    name = "1/" + "a" * 256 + ".bin"
    status, message = _load(protocol, server, "fast", "{}", files={f"file:{name}": b"x"})
    assert status == {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol], message
    assert message == (f"failed to load 'fast', failed to poll from model repository: file parameter 'file:{name}': "
                       "a name in the path is longer than 255 bytes")


def test_a_file_name_that_is_not_utf8_is_refused(server: openinfer.Server) -> None:
    body = '{"parameters": {"config": "{}", "file:1/\\ud800.bin": "AAAA"}}'
    r = requests.post(f"{server.url}/v2/repository/models/fast/load", data=body, timeout=BOUND)
    assert r.status_code == 400
    assert r.json()["error"] == "Invalid file parameter 'file:1/\\ud800.bin': the name is not valid UTF-8"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unloading_a_model_the_server_does_not_know_succeeds_as_in_triton(
    server: openinfer.Server, protocol: str
) -> None:
    client = triton_http(server) if protocol == "http" else triton_grpc(server)
    index = triton_http(server).get_model_repository_index()
    client.unload_model("unknown_model")  # Triton: "Unload non-existing model, nothing should happen"
    assert triton_http(server).get_model_repository_index() == index


if sys.platform != "linux":  # /proc
    pytestmark = pytest.mark.skip("needs Linux")
