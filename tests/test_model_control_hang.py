"""Model control never waits on another model (issue 38, point 5): with a model whose execute
never returns, an infer on it under way and its unload waiting, a load and an unload of another
model finish while that unload still waits (an order, not a timing), through the HTTP repository API; the hung model's unload returns after
its bound (--model-unload-timeout-secs, `serve(model_unload_timeout=...)`), having killed its
worker processes or abandoned its in-process instance. In poll mode, a hung model that leaves
the repository holds the scans up no longer than that bound.

The hung models wait for a gate file that the test writes at its end (600 polls at most: a
bound against a test that leaves threads behind, not a timing claim), and note when they
return: an unload, reload or poll shown to end while the model has not returned did not wait
for it (an order, not a wall-clock bound)."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import openinfer
from conftest import INT32_IO, python_model, wait_for, worker_children

BOUND = 60.0  # seconds: a bound for a hung test, not a measurement
UNLOAD_S = 3.0  # the unload bound the server is given
HANGS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    ROOT = Path(__file__).parents[2]
    MODEL = Path(__file__).parents[1].name


    def infer(inputs):
        (ROOT / f"started.{os.getpid()}").touch()
        for _ in range(600):
            if (ROOT / "gate").exists():
                break
            time.sleep(0.1)
        (ROOT / f"returned.{MODEL}.{os.getpid()}").touch()
        return {"OUTPUT0": inputs["INPUT0"] + 1}
    """
)
ADDS = "def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0'] + 1}\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("hang")
    python_model(root, "hung", HANGS, "instance_group [ { kind: KIND_MODEL } ]")  # an instance in the server
    python_model(root, "hung_workers", HANGS, "instance_group [ { count: 2 kind: KIND_CPU } ]")  # two worker processes
    python_model(root, "other", ADDS, "instance_group [ { kind: KIND_MODEL } ]")
    yield root
    (root / "gate").touch()


@pytest.fixture(scope="module")
def foreign_workers() -> set[int]:
    """Workers this process had before this module's server started (of servers that other
    tests keep running): not the hung model's."""
    return worker_children()


@pytest.fixture(scope="module")
def url(repo: Path, foreign_workers: set[int]) -> Iterator[str]:
    srv = openinfer.serve(repo, http_port=0, grpc_port=None, log=False, model_control_mode="explicit",
                          load_models=["hung", "hung_workers"], model_unload_timeout=UNLOAD_S)
    try:
        yield f"http://127.0.0.1:{srv.http_port}"
    finally:
        (repo / "gate").touch()
        srv.stop(BOUND)


def _infer(url: str, name: str, out: list[requests.Response | Exception]) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    try:
        out.append(requests.post(f"{url}/v2/models/{name}/infer", json=body, timeout=BOUND))
    except requests.RequestException as e:
        out.append(e)


def returned(repo: Path, model: str) -> bool:
    """Whether an execute of `model` (a HANGS model) has returned."""
    return any(repo.glob(f"returned.{model}.*"))


def _timed(method: str, url: str) -> tuple[int, float]:
    started = time.monotonic()
    r = requests.request(method, url, timeout=BOUND)
    return r.status_code, time.monotonic() - started


def _in_background(target: object, *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


@pytest.mark.parametrize("hung", ["hung", "hung_workers"])
def test_a_hung_model_wedges_neither_other_models_nor_its_own_unload(repo: Path, url: str, hung: str,
                                                                     foreign_workers: set[int]) -> None:
    before = set(repo.glob("started.*"))
    answers: list[requests.Response | Exception] = []
    infer = _in_background(_infer, url, hung, answers)
    wait_for(lambda: set(repo.glob("started.*")) - before != set(), f"{hung} to start executing", BOUND)
    unload: list[tuple[int, float]] = []
    unloading = _in_background(lambda: unload.append(_timed("POST", f"{url}/v2/repository/models/{hung}/unload")))
    time.sleep(0.3)  # the unload is waiting on the hung request
    assert not unload

    # Each finishes while the hung model's unload still waits (an order, not a timing): none of
    # them waited on it.
    for op in ("load", "unload", "load", "unload"):
        status, _ = _timed("POST", f"{url}/v2/repository/models/other/{op}")
        assert status == 200 and not unload, (op, status, unload)

    unloading.join(BOUND)
    [(status, took)] = unload
    assert status == 200 and took > UNLOAD_S - 0.5, took  # it waited for the request, up to its bound
    assert not returned(repo, hung), "the unload waited for the hung model to return"
    index = {m["name"]: m for m in requests.post(f"{url}/v2/repository/index", timeout=BOUND).json()}
    assert (index[hung]["state"], index[hung]["reason"]) == ("UNAVAILABLE", "unloaded")
    if hung == "hung_workers":  # killed: the request on it fails at once, no worker is left
        infer.join(BOUND)
        [answer] = answers
        assert isinstance(answer, requests.Response) and answer.status_code >= 500, answer
        assert worker_children() - foreign_workers == set()
    else:  # abandoned: its request still waits, on an instance the server no longer serves
        assert infer.is_alive()


def test_the_unload_bound_is_checked(repo: Path) -> None:
    with pytest.raises(ValueError, match=r"model_unload_timeout \(--model-unload-timeout-secs\) must be >= 0, "
                                         r"got -1"):
        openinfer.serve(repo, http_port=0, grpc_port=None, log=False, model_unload_timeout=-1)


def test_a_reload_of_a_busy_model_is_bounded_too(repo: Path, url: str, foreign_workers: set[int]) -> None:
    # A reload swaps the old version out: it waits for its requests no longer than an unload.
    assert requests.post(f"{url}/v2/repository/models/hung_workers/load", timeout=BOUND).status_code == 200
    before = set(repo.glob("started.*"))
    answers: list[requests.Response | Exception] = []
    _in_background(_infer, url, "hung_workers", answers)
    wait_for(lambda: set(repo.glob("started.*")) - before != set(), "hung_workers to start executing", BOUND)
    config = json.dumps({"name": "hung_workers", "backend": "python", "instance_group": [{"kind": "KIND_MODEL"}],
                         **INT32_IO})
    r = requests.post(f"{url}/v2/repository/models/hung_workers/load",
                      json={"parameters": {"config": config}}, timeout=BOUND)
    assert r.status_code == 200, r.text
    assert not returned(repo, "hung_workers"), "the reload waited for the old version's request to return"
    # The new version's workers start on its first request (none here): the old one's are killed.
    wait_for(lambda: worker_children() - foreign_workers == set(), "the old version's workers to be killed", BOUND)


def test_polling_is_not_wedged_by_a_hung_model_that_left_the_repository(tmp_path: Path) -> None:
    # Poll mode unloads a model whose directory went: with an execute that never returns, that
    # unload ends after its bound, and the next scans go on (a new model loads).
    python_model(tmp_path, "hung", HANGS, "instance_group [ { kind: KIND_MODEL } ]")
    srv = openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False, model_control_mode="poll",
                          repository_poll_secs=0.2, model_unload_timeout=UNLOAD_S)
    url = f"http://127.0.0.1:{srv.http_port}"
    try:
        answers: list[requests.Response | Exception] = []
        _in_background(_infer, url, "hung", answers)
        wait_for(lambda: any(tmp_path.glob("started.*")), "hung to start executing", BOUND)
        (tmp_path / "hung").rename(tmp_path / ".hung")  # hidden: no longer a model of the repository
        wait_for(lambda: _state(url, "hung") == "UNLOADING", "the poll to start unloading hung", BOUND)
        python_model(tmp_path, "fresh", ADDS, "instance_group [ { kind: KIND_MODEL } ]")
        wait_for(lambda: _state(url, "fresh") == "READY", "the next poll to load fresh", BOUND)
        assert not returned(tmp_path, "hung"), "the polls waited for the hung model to return"
    finally:
        (tmp_path / "gate").touch()
        srv.stop(BOUND)


def _state(url: str, name: str) -> str | None:
    index = requests.post(f"{url}/v2/repository/index", timeout=BOUND).json()
    return next((m.get("state") for m in index if m["name"] == name), None)
