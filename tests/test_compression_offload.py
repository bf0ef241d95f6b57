"""(De)compression runs off the event loop: while a gzip request body is being inflated, or a
response compressed, on a worker thread, the same loop (the server has one) answers other
connections. Made deterministic with the core's test hold (`_core._hold_work`): the work waits
before it starts, the test sees it waiting, checks that /v2/health/ready is answered, then lets
it go and checks the result. No timing is asserted."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

import openinfer
from openinfer import Model, Tensor, _core

from conftest import wait_until_held

LIMIT = 8 << 20


def _echo(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"OUTPUT0": inputs["INPUT0"]}


def make_server(**kw: Any) -> openinfer.Server:
    model = Model("echo", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    return openinfer.serve(models=[model], http_port=0, threads=1, log=False, max_body_bytes=LIMIT, **kw)


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    srv = make_server()
    try:
        yield srv
    finally:
        srv.stop()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def body(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()


VALUES = list(range(50_000))


@pytest.mark.parametrize(("encoding", "pack"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_health_is_answered_while_a_body_inflates(server: openinfer.Server, hold: None, encoding: str,
                                                  pack: Callable[[bytes], bytes]) -> None:
    url = server.url
    t, out = in_thread(lambda: requests.post(f"{url}/v2/models/echo/infer", data=pack(body(VALUES)),
                                             headers={"Content-Encoding": encoding}, timeout=120))
    wait_until_held()
    r = requests.get(f"{url}/v2/health/ready", timeout=30)  # another connection, the same (only) loop
    assert r.status_code == 200 and r.json() == {"ready": True}
    assert t.is_alive() and not out, "the compressed request waits on the hold, unanswered"
    _core._hold_work(False)
    t.join(120)
    assert out[0].status_code == 200, out[0].text
    assert out[0].json()["outputs"][0]["data"] == VALUES


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_health_is_answered_while_a_response_compresses(server: openinfer.Server, hold: None,
                                                        encoding: str) -> None:
    url = server.url
    t, out = in_thread(lambda: requests.post(f"{url}/v2/models/echo/infer", data=body(VALUES),
                                             headers={"Accept-Encoding": encoding}, timeout=120))
    wait_until_held()
    r = requests.get(f"{url}/v2/health/ready", timeout=30)
    assert r.status_code == 200 and r.json() == {"ready": True}
    assert t.is_alive() and not out
    _core._hold_work(False)
    t.join(120)
    resp = out[0]
    assert resp.status_code == 200 and resp.headers["Content-Encoding"] == encoding
    assert resp.json()["outputs"][0]["data"] == VALUES  # requests inflated it


def test_limits_still_hold_off_the_loop(server: openinfer.Server, hold: None) -> None:
    # A bomb and a corrupt body both wait on the hold like any other, then get their 4xx;
    # the connection that sent the bomb is closed by nothing: it serves the next request.
    bomb = zlib.compress(b"{" + b" " * LIMIT, 9)  # starts as a JSON object, one byte over the limit
    session = requests.Session()
    url = server.url
    t, out = in_thread(lambda: session.post(f"{url}/v2/models/echo/infer", data=bomb,
                                            headers={"Content-Encoding": "deflate"}, timeout=120))
    t2, out2 = in_thread(lambda: requests.post(f"{url}/v2/models/echo/infer", data=b"\x1f\x8b\x08\x00" + b"\xff" * 40,
                                               headers={"Content-Encoding": "gzip"}, timeout=120))
    wait_until_held(2)
    assert requests.get(f"{url}/v2/health/live", timeout=30).status_code == 200
    _core._hold_work(False)
    t.join(120)
    t2.join(120)
    assert out[0].status_code == 400 and f"maximum allowed value of {LIMIT} bytes" in out[0].json()["error"]
    assert out2[0].status_code == 400 and "corrupt" in out2[0].json()["error"]
    r = session.post(f"{url}/v2/models/echo/infer", data=gzip.compress(body([1, 2])),
                     headers={"Content-Encoding": "gzip"}, timeout=60)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2]


def test_stop_while_a_body_inflates(hold: None) -> None:
    # The stop's time runs out while the work waits: the client gets 503 and stop() returns;
    # the work, let go afterwards, finds the server stopping and its answer is dropped.
    srv = make_server()
    url = srv.url
    t, out = in_thread(lambda: requests.post(f"{url}/v2/models/echo/infer", data=gzip.compress(body([1])),
                                             headers={"Content-Encoding": "gzip"}, timeout=120))
    wait_until_held()
    srv.stop(timeout=0.2)
    t.join(120)
    assert out[0].status_code == 503 and "shutting down" in out[0].json()["error"]
    _core._hold_work(False)
    # The server's memory goes once the work is back (a detached reaper); a new one serves.
    with make_server() as again:
        assert requests.get(f"{again.url}/v2/health/live", timeout=30).status_code == 200
