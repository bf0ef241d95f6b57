"""Compressed request bodies against the body limit: a gzip bomb costs the server no memory past
the limit (it is measured, then refused with tritonserver's 400, before anything of its size is allocated), a
body that fits is inflated into one buffer of exactly its size, and string fields that a small
compressed body can blow up (the request id, tensor names) are capped with a 400 naming the
field, instead of being decoded and echoed back."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import requests
from conftest import GRPC_BIG_MESSAGES, assert_alive

import openinfer
from openinfer import Model, Tensor

LIMIT = 32 << 20


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    model = Model("echo", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    srv = openinfer.serve(models=[model], http_port=0, threads=1, log=False, max_body_bytes=LIMIT)
    try:
        yield srv
    finally:
        srv.stop()


def bomb(prefix: bytes, n: int, suffix: bytes, wbits: int = 31) -> bytes:
    """`prefix`, n bytes of 'a', `suffix`, compressed (gzip by default) without holding n bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts, chunk = [c.compress(prefix)], b"a" * (1 << 20)
    for _ in range(n >> 20):
        parts.append(c.compress(chunk))
    parts += [c.compress(b"a" * (n & ((1 << 20) - 1))), c.compress(suffix), c.flush()]
    return b"".join(parts)


def post(server: openinfer.Server, body: bytes, encoding: str = "gzip") -> requests.Response:
    return requests.post(f"{server.url}/v2/models/echo/infer", data=body, headers={"Content-Encoding": encoding},
                         timeout=120)


def request_json(id_: str = "r1", name: str = "INPUT0") -> dict:
    return {"id": id_, "inputs": [{"name": name, "shape": [2], "datatype": "INT32", "data": [1, 2]}]}


# ---- bombs ---------------------------------------------------------------------------------------

PEAK_CHILD = textwrap.dedent("""
    import json, re, sys, zlib
    import requests
    import openinfer
    from openinfer import Model, Tensor

    def status(key):
        return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10

    limit, n, wbits = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts, chunk = [c.compress(b'{"id":"')], b"a" * (1 << 20)
    for _ in range(n >> 20):
        parts.append(c.compress(chunk))
    body = b"".join(parts) + c.compress(b'","inputs":[]}') + c.flush()
    model = Model("echo", lambda i: {"OUTPUT0": i["INPUT0"]},
                  inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    srv = openinfer.serve(models=[model], http_port=0, threads=1, log=False, max_body_bytes=limit)
    session = requests.Session()
    session.get(srv.url + "/v2/health/live").raise_for_status()  # connection and warm-up
    encoding = "gzip" if wbits > 16 else "deflate"
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
    codes = [session.post(srv.url + "/v2/models/echo/infer", data=body, headers={"Content-Encoding": encoding},
                          timeout=300).status_code for _ in range(3)]
    print(json.dumps({"codes": codes, "growth": status("VmHWM") - base}))
    srv.stop()
""")


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="RSS is not meaningful under ASan")
@pytest.mark.parametrize("wbits", [31, 15], ids=["gzip", "deflate"])
def test_bomb_is_refused_without_memory_past_the_limit(wbits: int) -> None:
    # In a process of its own, so that the peak RSS is this server's alone: three bombs that
    # would inflate to 512 MiB, against a 32 MiB limit, may not grow the peak by the limit.
    limit, n = 32 << 20, 512 << 20
    r = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(limit), str(n), str(wbits)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["codes"] == [400, 400, 400]
    assert out["growth"] < limit // 2, f"peak RSS grew by {out['growth'] >> 20} MiB for {limit >> 20} MiB limit"


def test_bomb_gets_400_in_tritons_words_and_the_server_stays_up(server: openinfer.Server) -> None:
    r = post(server, bomb(b'{"id":"', 256 << 20, b'","inputs":[]}'))
    assert r.status_code == 400, r.text
    assert r.json()["error"] == (f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. Use "
                                 "--http-max-input-size to increase the limit.")
    assert_alive(server.http_port)


def test_body_just_under_the_limit_inflates(server: openinfer.Server) -> None:
    data = list(range(1000))
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1000], "datatype": "INT32", "data": data}]}).encode()
    body += b" " * (LIMIT - len(body))  # exactly the limit
    for encoding, packed in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                             ("deflate", zlib.compress(body)[2:-4])]:  # raw deflate, as some clients send
        r = post(server, packed, encoding)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == data
    r = post(server, gzip.compress(body + b" "))
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(("packed", "message"), [
    (gzip.compress(b'{"inputs":[]}')[:-12], "truncated"),
    (b"\x1f\x8b\x08\x00" + b"\xff" * 40, "corrupt"),
])
def test_broken_streams_are_400(server: openinfer.Server, packed: bytes, message: str) -> None:
    r = post(server, packed)
    assert r.status_code == 400 and message in r.json()["error"], r.text


# ---- string fields ---------------------------------------------------------------------------------


def test_huge_id_in_a_small_body_is_refused_not_echoed(server: openinfer.Server) -> None:
    body = bomb(b'{"id":"', 16 << 20, b'","inputs":[{"name":"INPUT0","shape":[2],"datatype":"INT32","data":[1,2]}]}')
    assert len(body) < 64 << 10
    r = post(server, body)
    assert r.status_code == 400, r.status_code
    assert len(r.content) < 1024
    assert r.json()["error"] == "id: 16777216 bytes; at most 4096 are accepted"


@pytest.mark.parametrize("n", [4096, 4097])
def test_id_cap_over_http_and_grpc(server: openinfer.Server, grpc_stubs, n: int) -> None:
    import grpc

    r = requests.post(f"{server.url}/v2/models/echo/infer", json=request_json("x" * n), timeout=30)
    pb = grpc_stubs.pb
    req = pb.ModelInferRequest(model_name="echo", id="x" * n)
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    req.raw_input_contents.append(np.array([1, 2], np.int32).tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=GRPC_BIG_MESSAGES) as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        if n <= 4096:
            assert r.status_code == 200 and r.json()["id"] == "x" * n
            assert stub.ModelInfer(req, timeout=30).id == "x" * n
        else:
            assert r.status_code == 400 and r.json()["error"] == f"id: {n} bytes; at most 4096 are accepted"
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == f"ModelInferRequest.id: {n} bytes; at most 4096 are accepted"
            assert len(e.value.trailing_metadata() or ()) < 10


def test_huge_tensor_name_is_refused_not_echoed(server: openinfer.Server) -> None:
    body = gzip.compress(json.dumps(request_json(name="N" * (1 << 20))).encode())
    r = post(server, body)
    assert r.status_code == 400 and len(r.content) < 1024, r.content[:200]
    assert r.json()["error"] == "inputs[0].name: 1048576 bytes; at most 4096 are accepted"
    r = requests.post(f"{server.url}/v2/models/echo/infer", timeout=30,
                      json=dict(request_json(), outputs=[{"name": "O" * 5000}]))
    assert r.status_code == 400 and r.json()["error"] == "outputs[0].name: 5000 bytes; at most 4096 are accepted"
