"""The shared-memory extensions on the server: system regions registered over HTTP and gRPC,
inputs read from them and outputs written into them (every datatype, BYTES included), the
tritonclient flows unchanged, bad registrations, regions unregistered while in use,
concurrency, the loopback-only default, and CUDA regions (answered clearly without a GPU)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer
from conftest import V2_TYPES, Http, assert_alive, assert_grpc_alive, serve_apart, test_models

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
tshm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
# tritonserver's words when client shared memory is off (its src/common.h).
DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


class Region:
    """A POSIX shm object made here (as any client process would) and its numpy views."""

    def __init__(self, size: int) -> None:
        self.shm = shared_memory.SharedMemory(name=f"oi_test_{uuid.uuid4().hex[:12]}", create=True, size=size)
        self.key = "/" + self.shm.name
        self.size = size

    def write(self, data: bytes, offset: int = 0) -> None:
        self.shm.buf[offset : offset + len(data)] = data

    def read(self, n: int, offset: int = 0) -> bytes:
        return bytes(self.shm.buf[offset : offset + n])

    def close(self) -> None:
        self.shm.close()
        self.shm.unlink()


@pytest.fixture
def regions() -> Iterator[Any]:
    made: list[Region] = []

    def make(size: int) -> Region:
        r = Region(size)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


class Api:
    """A small REST helper for the server at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url

    def post(self, path: str, body: Any = None) -> requests.Response:
        data = b"" if body is None else json.dumps(body).encode() if not isinstance(body, bytes) else body
        return requests.post(f"{self.url}/v2/{path}", data=data, timeout=30)

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.url}/v2/{path}", timeout=30)

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> requests.Response:
        return self.post(f"systemsharedmemory/region/{name}/register",
                         {"key": key, "offset": offset, "byte_size": byte_size})

    def infer(self, model: str, body: dict[str, Any]) -> requests.Response:
        return self.post(f"models/{model}/infer", body)


@pytest.fixture
def api(server: openinfer.Server) -> Iterator[Api]:
    """An Api of the session's server; unregisters every region the test left behind."""
    a = Api(server.url)
    yield a
    a.post("systemsharedmemory/unregister")


class Held:
    """A server whose model "held" echoes INPUT0 once `release` is set, having set `entered`:
    a request is known to be in the model, and stays there, while the test acts."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        held = openinfer.Model("held", self._echo, inputs=[openinfer.Tensor("INPUT0", "INT32", [-1])],
                               outputs=[openinfer.Tensor("OUTPUT0", "INT32", [-1])])
        self.server = openinfer.serve(models=[*test_models(), held], http_port=0, log=False)

    def _echo(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.set()
        self.release.wait(60)  # a bound for the test; released by it
        return {"OUTPUT0": inputs["INPUT0"]}


@pytest.fixture
def held() -> Iterator[Held]:
    h = Held()
    try:
        yield h
    finally:
        h.release.set()
        h.server.stop()


def shm_params(region: str, byte_size: int, offset: int = 0) -> dict[str, Any]:
    p: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        p["shared_memory_offset"] = offset
    return p


def sample(dtype: str, n: int = 7) -> tuple[np.ndarray, bytes]:
    """An array of `dtype` and its bytes as the protocol lays them out (BYTES: length-prefixed)."""
    rng = np.random.default_rng(len(dtype))
    if dtype == "BYTES":
        arr = np.array([f"é{i}".encode() * i for i in range(n)], dtype=object)
        return arr, serialize_byte_tensor(arr).item()
    if dtype == "BOOL":
        arr = rng.integers(0, 2, n).astype(np.bool_)
    elif dtype == "BF16":
        arr = rng.integers(0, 1 << 15, n).astype(np.uint16)
    elif dtype.startswith("FP"):
        arr = rng.standard_normal(n).astype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[dtype])
    else:
        arr = rng.integers(0, 100, n).astype(np.dtype(dtype.replace("UINT", "uint").replace("INT", "int").lower()))
    return arr, arr.tobytes()


# ---- registration over HTTP ------------------------------------------------------------------


def test_metadata_lists_the_extensions(api: Any) -> None:
    ext = api.get("").json()["extensions"]
    assert "system_shared_memory" in ext and "cuda_shared_memory" in ext


def test_register_status_unregister(api: Any, regions: Any) -> None:
    r = regions(8192)
    assert api.register("a", r.key, 4096, offset=4096).status_code == 200
    assert api.register("b", r.key.lstrip("/"), 100, offset=7).status_code == 200  # no leading '/': also a shm name
    status = api.get("systemsharedmemory/status").json()
    assert sorted(status, key=lambda s: s["name"]) == [
        {"name": "a", "key": r.key, "offset": 4096, "byte_size": 4096},
        {"name": "b", "key": r.key.lstrip("/"), "offset": 7, "byte_size": 100},
    ]
    assert api.get("systemsharedmemory/region/a/status").json() == [
        {"name": "a", "key": r.key, "offset": 4096, "byte_size": 4096}
    ]
    missing = api.get("systemsharedmemory/region/zz/status")
    assert missing.status_code == 404 and "zz" in missing.json()["error"]
    assert api.get("cudasharedmemory/status").json() == []
    cuda_named = api.get("cudasharedmemory/region/a/status")
    assert cuda_named.status_code == 404 and "system shared memory" in cuda_named.json()["error"]
    assert api.post("systemsharedmemory/region/a/unregister").status_code == 200
    assert [s["name"] for s in api.get("systemsharedmemory/status").json()] == ["b"]
    assert api.post("systemsharedmemory/region/a/unregister").status_code == 200  # unknown: OK, as in Triton
    assert api.post("systemsharedmemory/unregister").status_code == 200
    assert api.get("systemsharedmemory/status").json() == []


def test_wrong_methods_and_paths(api: Any) -> None:
    assert requests.post(f"{api.url}/v2/systemsharedmemory/status", timeout=10).status_code == 405
    assert api.get("systemsharedmemory/region/a/register").status_code == 405
    assert api.get("systemsharedmemory/unregister").status_code == 405
    assert api.post("systemsharedmemory/register", {}).status_code == 404  # register needs a region
    assert api.get("systemsharedmemory/region/a/other").status_code == 404
    assert api.get("systemsharedmemory/region/a/status/x").status_code == 404


@pytest.mark.parametrize(
    "key,why",
    [
        ("/../etc/passwd", "not a POSIX shared-memory name"),
        ("/dev/shm/x", "not a POSIX shared-memory name"),
        ("a/b", "not a POSIX shared-memory name"),
        ("/..", "not a POSIX shared-memory name"),
        ("..", "not a POSIX shared-memory name"),
        ("/", "cannot register shared memory region 'bad' - invalid shm key '/'"),
        ("", "cannot register shared memory region 'bad' - invalid shm key ''"),
        ("///", "- invalid shm key '///'"),
        ("/triton_python_backend_shm_region_7", "cannot register shared memory region 'bad' with key "
         "'/triton_python_backend_shm_region_7' as the key contains the reserved prefix "
         "'triton_python_backend_shm_region_'"),
        ("//triton_python_backend_shm_region_", "the reserved prefix"),
        ("/x\u0001", "control character"),
        ("/" + "k" * 600, "at most 256 bytes"),
        ("/" + "k" * 255 + "k", "too long"),
        ("/oi_test_no_such_key", "No such file"),
    ],
)
def test_bad_keys(api: Any, key: str, why: str, server: openinfer.Server) -> None:
    r = api.register("bad", key, 16)
    assert r.status_code == 400 and why in r.json()["error"], r.text
    assert api.get("systemsharedmemory/status").json() == []
    assert_alive(server.http_port)


def test_bad_sizes_and_offsets(api: Any, regions: Any) -> None:
    r = regions(4096)
    cases = [
        ({"key": r.key, "offset": 0, "byte_size": 4097}, "exceeds the 4096 bytes"),
        ({"key": r.key, "offset": 4000, "byte_size": 97}, "exceeds the 4096 bytes"),
        ({"key": r.key, "offset": 4097, "byte_size": 1}, "exceeds"),
        ({"key": r.key, "offset": (1 << 63) - 1, "byte_size": (1 << 63) - 1}, "exceeds"),
        ({"key": r.key, "offset": 0, "byte_size": 0}, "at least 1"),
        ({"key": r.key, "offset": -1, "byte_size": 16}, "'offset' must be a non-negative integer"),
        ({"key": r.key, "byte_size": 1 << 64}, "'byte_size' must be a non-negative integer"),
        ({"key": r.key}, "'byte_size' must be a non-negative integer and is missing"),
        ({"key": 7, "byte_size": 16}, "'key' must be"),
        ({"byte_size": 16}, "'key' must be"),
    ]
    for body, why in cases:
        resp = api.post("systemsharedmemory/region/x/register", body)
        assert resp.status_code == 400 and why in resp.json()["error"], (body, resp.text)
    for raw in (b"", b"{", b"[1]", b'{"key": "/x", "byte_size": 16} trailing'):
        resp = api.post("systemsharedmemory/region/x/register", raw)
        assert resp.status_code == 400 and "expected a JSON object body" in resp.json()["error"], raw
    assert api.get("systemsharedmemory/status").json() == []


def test_double_register(api: Any, regions: Any) -> None:
    r = regions(64)
    assert api.register("dup", r.key, 64).status_code == 200
    again = api.register("dup", r.key, 32)
    assert again.status_code == 400 and again.json()["error"] == "shared memory region 'dup' already in manager"
    assert api.get("systemsharedmemory/region/dup/status").json()[0]["byte_size"] == 64


# ---- inference through system shared memory over HTTP ----------------------------------------


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_round_trip_every_datatype_http(api: Any, regions: Any, dtype: str) -> None:
    arr, raw = sample(dtype)
    r_in, r_out = regions(4096 + 3 + len(raw)), regions(len(raw) + 100)
    r_in.write(raw, offset=4096 + 3)
    assert api.register("in", r_in.key, len(raw) + 3, offset=4096).status_code == 200
    assert api.register("out", r_out.key, len(raw) + 100).status_code == 200
    body = {
        "inputs": [{"name": "INPUT0", "datatype": dtype, "shape": [len(arr)], "parameters": shm_params("in", len(raw), 3)}],
        "outputs": [{"name": "OUTPUT0", "parameters": shm_params("out", len(raw) + 50, 50)}],
    }
    resp = api.infer(f"echo_{dtype.lower()}", body)
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    # As tritonserver answers: no parameters (Triton's C++ client reads any as binary data).
    assert out == {"name": "OUTPUT0", "datatype": dtype, "shape": [len(arr)]}
    assert "data" not in out
    assert r_out.read(len(raw), offset=50) == raw


def test_input_in_shm_output_in_response(api: Any, regions: Any) -> None:
    a = np.arange(16, dtype=np.int32)
    r = regions(64)
    r.write(a.tobytes())
    api.register("in", r.key, 64)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], "parameters": shm_params("in", 64)}]}
    resp = api.infer("echo_int32", body)
    assert resp.status_code == 200 and resp.json()["outputs"][0]["data"] == a.tolist()


def test_input_in_json_output_in_shm(api: Any, regions: Any) -> None:
    r = regions(64)
    api.register("out", r.key, 64)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [3], "data": [7, 8, 9]}],
        "outputs": [{"name": "OUTPUT0", "parameters": shm_params("out", 64)}],
    }
    resp = api.infer("echo_int32", body)
    assert resp.status_code == 200, resp.text
    assert np.frombuffer(r.read(12), np.int32).tolist() == [7, 8, 9]


def test_same_region_in_and_out(api: Any, regions: Any) -> None:
    """An output written over its own input (identity in place) and one shifted by 4 bytes."""
    a = np.arange(10, dtype=np.int64)
    r = regions(200)
    r.write(a.tobytes())
    api.register("io", r.key, 200)
    for out_off in (0, 8):
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [10], "parameters": shm_params("io", 80)}],
            "outputs": [{"name": "OUTPUT0", "parameters": shm_params("io", 80, out_off)}],
        }
        assert api.infer("echo_int64", body).status_code == 200
        assert np.frombuffer(r.read(80, out_off), np.int64).tolist() == a.tolist()
        r.write(a.tobytes())


def test_bad_inference_parameters(api: Any, regions: Any, server: openinfer.Server) -> None:
    r = regions(64)
    api.register("in", r.key, 64)
    api.register("out", r.key, 16)

    def infer(inp: dict[str, Any], outputs: list[dict[str, Any]] | None = None) -> requests.Response:
        body: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], **inp}]}
        if outputs is not None:
            body["outputs"] = outputs
        return api.infer("echo_int32", body)

    cases = [
        ({"parameters": shm_params("nope", 64)}, None, "input 'INPUT0': Unable to find shared memory region: 'nope'"),
        ({"parameters": shm_params("in", 64, 1)}, None, "Invalid offset + byte size for shared memory region: 'in'"),
        ({"parameters": shm_params("in", 68)}, None, "Invalid offset + byte size for shared memory region: 'in' "
         "(shared_memory_offset 0 + shared_memory_byte_size 68 exceeds its 64 bytes)"),
        ({"parameters": shm_params("in", 64, 64)}, None, "Invalid offset for shared memory region: 'in'"),
        ({"parameters": shm_params("in", (1 << 63) - 1, (1 << 63) - 1)}, None, "Invalid offset for shared memory"),
        # Triton's overflow case (2**64 - 32 bytes at 32): sizes past int64 are no count here
        ({"parameters": shm_params("in", (1 << 64) - 32, 32)}, None, "shared_memory_byte_size must be a non-negative"),
        ({"parameters": shm_params("in", 60)}, None, "input byte size mismatch for input 'INPUT0'"),
        ({"parameters": {"shared_memory_region": "in"}}, None, "shared_memory_byte_size is required"),
        ({"parameters": {"shared_memory_region": 5, "shared_memory_byte_size": 64}}, None, "must be a string"),
        ({"parameters": {**shm_params("in", 64), "shared_memory_offset": -4}}, None, "must be a non-negative integer"),
        ({"parameters": {**shm_params("in", 64), "shared_memory_byte_size": 1.5}}, None, "must be a non-negative integer"),
        ({"parameters": shm_params("in", 64), "data": list(range(16))}, None, "got \"data\" and shared_memory_region"),
        ({"parameters": {**shm_params("in", 64), "binary_data_size": 64}}, None, "binary_data_size and shared_memory_region"),
        ({"data": list(range(16))}, [{"name": "OUTPUT0", "parameters": shm_params("nope", 64)}],
         "output 'OUTPUT0': Unable to find shared memory region: 'nope'"),
        ({"data": list(range(16))}, [{"name": "OUTPUT0", "parameters": shm_params("out", 64)}],
         "Invalid offset + byte size for shared memory region: 'out'"),
        ({"data": list(range(16))}, [{"name": "OUTPUT0", "parameters": shm_params("in", 60)}],
         "64 bytes do not fit shared_memory_byte_size 60"),
        ({"data": list(range(16))}, [{"name": "OUTPUT0", "parameters": {**shm_params("in", 64), "binary_data": True}}],
         "exclude each other"),
    ]
    for inp, outs, why in cases:
        resp = infer(inp, outs)
        assert resp.status_code == 400 and why in resp.json()["error"], (inp, outs, resp.text)
    assert_alive(server.http_port)


# ---- gRPC ---------------------------------------------------------------------------------


@pytest.fixture
def grpc_triton(server: openinfer.Server) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_round_trip_every_datatype_grpc(grpc_triton: Any, regions: Any, dtype: str) -> None:
    arr, raw = sample(dtype)
    r_in, r_out = regions(len(raw) + 8), regions(len(raw) + 8)
    r_in.write(raw, offset=8)
    grpc_triton.register_system_shared_memory("in", r_in.key, len(raw), offset=8)
    grpc_triton.register_system_shared_memory("out", r_out.key, len(raw) + 8)
    i = grpcclient.InferInput("INPUT0", [len(arr)], dtype)
    i.set_shared_memory("in", len(raw))
    o = grpcclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("out", len(raw), offset=8)
    result = grpc_triton.infer(f"echo_{dtype.lower()}", [i], outputs=[o])
    out = result.get_output("OUTPUT0")
    assert out.datatype == dtype and list(out.shape) == [len(arr)]
    assert not out.parameters  # as tritonserver: the client knows where it asked for it
    assert list(result.get_response().raw_output_contents) == [b""]
    assert r_out.read(len(raw), 8) == raw


def test_grpc_status_and_errors(grpc_triton: Any, regions: Any, server: openinfer.Server) -> None:
    r = regions(128)
    grpc_triton.register_system_shared_memory("g", r.key, 100, offset=28)
    status = grpc_triton.get_system_shared_memory_status()
    assert [(k, v.key, v.offset, v.byte_size) for k, v in status.regions.items()] == [("g", r.key, 28, 100)]
    assert grpc_triton.get_system_shared_memory_status("g").regions["g"].byte_size == 100
    with pytest.raises(InferenceServerException) as e:
        grpc_triton.get_system_shared_memory_status("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        grpc_triton.register_system_shared_memory("g", r.key, 10)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS"
    for key, size, offset, why in [
        ("/x/../y", 8, 0, "not a POSIX shared-memory name"),
        (r.key, 129, 0, "failed to register shared memory region 'h': invalid args"),
        (r.key, (1 << 64) - 1, 2, "exceeds"),
        ("/oi_test_no_such_key", 8, 0, "No such file"),
    ]:
        with pytest.raises(InferenceServerException) as e:
            grpc_triton.register_system_shared_memory("h", key, size, offset=offset)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and why in e.value.message()
    i = grpcclient.InferInput("INPUT0", [16], "INT32")
    i.set_shared_memory("nope", 64)
    with pytest.raises(InferenceServerException) as e:
        grpc_triton.infer("echo_int32", [i])
    assert "Unable to find shared memory region: 'nope'" in e.value.message()
    grpc_triton.unregister_system_shared_memory("g")
    assert len(grpc_triton.get_system_shared_memory_status().regions) == 0
    assert_grpc_alive(server.grpc_port)


def test_grpc_raw_contents_skip_shm_inputs(grpc_triton: Any, regions: Any) -> None:
    """raw_input_contents lists only the inputs not in shared memory, and raw_output_contents
    keeps one (empty) entry per shared-memory output, so as_numpy finds the others."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    r = regions(128)
    r.write(b.tobytes())
    grpc_triton.register_system_shared_memory("r", r.key, 128)
    i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_data_from_numpy(a)
    i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_shared_memory("r", 64)
    o0 = grpcclient.InferRequestedOutput("OUTPUT0")
    o0.set_shared_memory("r", 64, offset=64)
    o1 = grpcclient.InferRequestedOutput("OUTPUT1")
    result = grpc_triton.infer("simple", [i0, i1], outputs=[o0, o1])
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert np.array_equal(np.frombuffer(r.read(64, 64), np.int32).reshape(1, 16), a + b)


# ---- tritonclient, unchanged ------------------------------------------------------------------


def test_tritonclient_http_flow(server: openinfer.Server) -> None:
    """Triton's simple_http_shm_client, as written for Triton."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    client.unregister_system_shared_memory()
    input0 = np.arange(16, dtype=np.int32)
    input1 = np.ones(16, dtype=np.int32)
    size = input0.size * input0.itemsize
    key_in, key_out = f"/input_simple_{uuid.uuid4().hex[:8]}", f"/output_simple_{uuid.uuid4().hex[:8]}"
    shm_op = tshm.create_shared_memory_region("output_data", key_out, size * 2)
    shm_ip = tshm.create_shared_memory_region("input_data", key_in, size * 2)
    try:
        client.register_system_shared_memory("output_data", key_out, size * 2)
        tshm.set_shared_memory_region(shm_ip, [input0])
        tshm.set_shared_memory_region(shm_ip, [input1], offset=size)
        client.register_system_shared_memory("input_data", key_in, size * 2)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                   httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        results = client.infer("simple", inputs, outputs=outputs)
        out0 = results.get_output("OUTPUT0")
        out1 = results.get_output("OUTPUT1")
        sum_ = tshm.get_contents_as_numpy(shm_op, np.int32, out0["shape"])
        diff = tshm.get_contents_as_numpy(shm_op, np.int32, out1["shape"], offset=size)
        assert np.array_equal(sum_[0], input0 + input1) and np.array_equal(diff[0], input0 - input1)
        status = client.get_system_shared_memory_status()
        assert {s["name"] for s in status} == {"input_data", "output_data"}
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        tshm.destroy_shared_memory_region(shm_ip)
        tshm.destroy_shared_memory_region(shm_op)
        client.close()


def test_tritonclient_grpc_flow_with_bytes(server: openinfer.Server) -> None:
    """Triton's simple_grpc_shm_string_client pattern: BYTES in and out of shared memory."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.unregister_system_shared_memory()
    data = np.array([str(i).encode() * (i % 5) for i in range(16)], dtype=np.object_)
    raw = serialize_byte_tensor(data)
    size = serialized_byte_size(raw)
    key_in, key_out = f"/input_str_{uuid.uuid4().hex[:8]}", f"/output_str_{uuid.uuid4().hex[:8]}"
    shm_ip = tshm.create_shared_memory_region("input_data", key_in, size)
    shm_op = tshm.create_shared_memory_region("output_data", key_out, size)
    try:
        tshm.set_shared_memory_region(shm_ip, [raw])
        client.register_system_shared_memory("input_data", key_in, size)
        client.register_system_shared_memory("output_data", key_out, size)
        inp = grpcclient.InferInput("INPUT0", [16], "BYTES")
        inp.set_shared_memory("input_data", size)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("output_data", size)
        results = client.infer("echo_bytes", [inp], outputs=[out])
        meta = results.get_output("OUTPUT0")
        got = tshm.get_contents_as_numpy(shm_op, np.object_, list(meta.shape))
        assert list(got) == list(data)
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(shm_ip)
        tshm.destroy_shared_memory_region(shm_op)
        client.close()


# ---- life cycle and concurrency -------------------------------------------------------------


@pytest.mark.parametrize("unregister", ["systemsharedmemory/region/busy/unregister", "systemsharedmemory/unregister"])
def test_unregister_while_in_use(held: Held, regions: Any, unregister: str) -> None:
    """As tritonserver (its L0_shared_memory unregister-during-inference tests): unregistering a
    region (by name or all) that a request uses succeeds at once but takes effect when the
    request ends. Meanwhile the region is listed, its name taken, and other requests may use
    it; afterwards it is gone without a second unregister. The request is held in its model
    until the test has seen all that."""
    api = Api(held.server.url)
    r = regions(64)
    r.write(np.arange(16, dtype=np.int32).tobytes())
    api.register("busy", r.key, 64)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], "parameters": shm_params("busy", 64)}],
        "outputs": [{"name": "OUTPUT0", "parameters": shm_params("busy", 64)}],
    }
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(resp=api.infer("held", body)))
    t.start()
    assert held.entered.wait(30), "the request never reached the model"
    assert api.post(unregister).status_code == 200
    assert [g["name"] for g in api.get("systemsharedmemory/status").json()] == ["busy"]
    again = api.register("busy", r.key, 64)
    assert again.status_code == 400 and "already in manager" in again.json()["error"]
    used = api.infer("echo_int32", {**body, "outputs": []})  # still usable while it waits
    assert used.status_code == 200, used.text
    held.release.set()
    t.join(30)
    assert result["resp"].status_code == 200, result["resp"].text
    assert np.frombuffer(r.read(64), np.int32).tolist() == list(range(16))
    assert api.get("systemsharedmemory/status").json() == []
    missing = api.get("systemsharedmemory/region/busy/status")
    assert missing.status_code == 404
    assert api.register("busy", r.key, 64).status_code == 200
    api.post("systemsharedmemory/unregister")


def test_unregister_while_in_use_grpc(held: Held, regions: Any) -> None:
    """The same over gRPC (tritonserver's *_grpc variants): unregistering all while a request
    uses the region waits for it; meanwhile the name is ALREADY_EXISTS."""
    grpc_triton = grpcclient.InferenceServerClient(f"127.0.0.1:{held.server.grpc_port}")
    r = regions(64)
    r.write(np.arange(16, dtype=np.int32).tobytes())
    grpc_triton.register_system_shared_memory("busy", r.key, 64)
    inp = grpcclient.InferInput("INPUT0", [16], "INT32")
    inp.set_shared_memory("busy", 64)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("busy", 64)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(resp=grpc_triton.infer("held", [inp], outputs=[out])))
    t.start()
    try:
        assert held.entered.wait(30), "the request never reached the model"
        grpc_triton.unregister_system_shared_memory()
        assert list(grpc_triton.get_system_shared_memory_status().regions) == ["busy"]
        with pytest.raises(InferenceServerException) as e:
            grpc_triton.register_system_shared_memory("busy", r.key, 64)
        assert e.value.status() == "StatusCode.ALREADY_EXISTS"
        held.release.set()
        t.join(30)
        assert "resp" in result
        assert len(grpc_triton.get_system_shared_memory_status().regions) == 0
    finally:
        held.release.set()
        grpc_triton.close()


def test_concurrent_clients(server: openinfer.Server, regions: Any) -> None:
    """Threads register, use and unregister their own regions over both transports at once."""
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            r_in, r_out = regions(256), regions(256)
            grpc = k % 2 == 1
            c = (grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") if grpc
                 else httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}"))
            mod = grpcclient if grpc else httpclient
            for it in range(15):
                a = np.arange(64, dtype=np.float32) * (k + 1) + it
                r_in.write(a.tobytes())
                c.register_system_shared_memory(f"in{k}", r_in.key, 256)
                c.register_system_shared_memory(f"out{k}", r_out.key, 256)
                i = mod.InferInput("INPUT0", [64], "FP32")
                i.set_shared_memory(f"in{k}", 256)
                o = mod.InferRequestedOutput("OUTPUT0")
                o.set_shared_memory(f"out{k}", 256)
                c.infer("echo_fp32", [i], outputs=[o])
                assert np.array_equal(np.frombuffer(r_out.read(256), np.float32), a)
                c.unregister_system_shared_memory(f"in{k}")
                c.unregister_system_shared_memory(f"out{k}")
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert_alive(server.http_port)
    assert_grpc_alive(server.grpc_port)


def test_regions_left_registered_at_shutdown(regions: Any) -> None:
    """Stopping a server with regions registered unmaps them (LeakSanitizer checks the rest)."""
    r = regions(4096)
    with openinfer.serve(models=[], http_port=0, grpc_port=None, log=False) as srv:
        resp = requests.post(f"{srv.url}/v2/systemsharedmemory/region/left/register",
                             json={"key": r.key, "byte_size": 4096}, timeout=10)
        assert resp.status_code == 200


# ---- who may register ------------------------------------------------------------------------


def test_registration_refused_unless_allowed(regions: Any) -> None:
    r = regions(64)
    with openinfer.serve(models=[], http_port=0, grpc_port=0, log=False, allow_shared_memory=False) as srv:
        meta = requests.get(f"{srv.url}/v2", timeout=10).json()
        assert "system_shared_memory" not in meta["extensions"]
        resp = requests.post(f"{srv.url}/v2/systemsharedmemory/region/x/register",
                             json={"key": r.key, "byte_size": 64}, timeout=10)
        assert resp.status_code == 501 and resp.json()["error"] == DISABLED
        assert requests.post(f"{srv.url}/v2/systemsharedmemory/unregister", timeout=10).status_code == 501
        assert requests.get(f"{srv.url}/v2/systemsharedmemory/status", timeout=10).json() == []
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        with pytest.raises(InferenceServerException) as e:
            g.register_system_shared_memory("x", r.key, 64)
        assert e.value.status() == "StatusCode.UNIMPLEMENTED" and e.value.message() == DISABLED
        g.close()


def test_non_loopback_host_refuses_by_default_and_option_opens(regions: Any) -> None:
    r = regions(64)
    with openinfer.serve(models=[], host="0.0.0.0", http_port=0, grpc_port=None, log=False) as srv:
        assert not srv._core.shared_memory
        resp = requests.post(f"{srv.url}/v2/systemsharedmemory/region/x/register",
                             json={"key": r.key, "byte_size": 64}, timeout=10)
        assert resp.status_code == 501
    with openinfer.serve(models=[], host="0.0.0.0", http_port=0, grpc_port=None, log=False,
                         allow_shared_memory=True) as srv:
        resp = requests.post(f"{srv.url}/v2/systemsharedmemory/region/x/register",
                             json={"key": r.key, "byte_size": 64}, timeout=10)
        assert resp.status_code == 200
        assert "system_shared_memory" in requests.get(f"{srv.url}/v2", timeout=10).json()["extensions"]


# ---- CUDA shared memory -------------------------------------------------------------------------


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, or a broken one: no GPU for us
        return False


def test_cuda_registration_errors(api: Any, grpc_triton: Any) -> None:
    import base64

    bad = api.post("cudasharedmemory/region/c/register", {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8})
    assert bad.status_code == 400 and "64-byte cudaIpcMemHandle_t" in bad.json()["error"]
    bad = api.post("cudasharedmemory/region/c/register", {"raw_handle": "x", "device_id": 0, "byte_size": 8})
    assert bad.status_code == 400 and "raw_handle" in bad.json()["error"]
    bad = api.post("cudasharedmemory/region/c/register", {"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 8})
    assert bad.status_code == 400
    assert api.get("cudasharedmemory/status").json() == []
    assert api.post("cudasharedmemory/unregister").status_code == 200
    assert len(grpc_triton.get_cuda_shared_memory_status().regions) == 0
    if not _has_gpu():
        handle = base64.b64encode(bytes(64)).decode()
        resp = api.post("cudasharedmemory/region/c/register", {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 8})
        assert resp.status_code == 400
        assert ("CUDA runtime" in resp.json()["error"] or "no usable GPU" in resp.json()["error"]), resp.text
        with pytest.raises(InferenceServerException) as e:
            grpc_triton.register_cuda_shared_memory("c", bytes(64), 0, 8)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_cuda_round_trip_tritonclient(transport: str, tmp_path: Path) -> None:
    """tritonclient's own CUDA shared-memory helper, against a server in another process (as
    Triton's clients use it): input and output in device memory, nothing on the socket."""
    import tritonclient.utils.cuda_shared_memory as cshm

    shutil.copytree(EXAMPLES / "identity_fp32", tmp_path / "identity_fp32")
    a = np.arange(16, dtype=np.float32)
    size = a.nbytes
    with serve_apart(tmp_path) as (http_url, grpc_url):
        lib = httpclient if transport == "http" else grpcclient
        client = lib.InferenceServerClient((http_url if transport == "http" else grpc_url).split("//")[1])
        h_in = cshm.create_shared_memory_region("cin", size, 0)
        h_out = cshm.create_shared_memory_region("cout", size, 0)
        try:
            cshm.set_shared_memory_region(h_in, [a])
            client.register_cuda_shared_memory("cin", cshm.get_raw_handle(h_in), 0, size)
            client.register_cuda_shared_memory("cout", cshm.get_raw_handle(h_out), 0, size)
            i = lib.InferInput("INPUT0", [16], "FP32")
            i.set_shared_memory("cin", size)
            o = lib.InferRequestedOutput("OUTPUT0")
            o.set_shared_memory("cout", size)
            client.infer("identity_fp32", [i], outputs=[o])
            assert np.array_equal(cshm.get_contents_as_numpy(h_out, np.float32, [16]), a)
            status = requests.get(f"{http_url}/v2/cudasharedmemory/status", timeout=10).json()
            assert {s["name"] for s in status} == {"cin", "cout"}
        finally:
            client.unregister_cuda_shared_memory()
            cshm.destroy_shared_memory_region(h_in)
            cshm.destroy_shared_memory_region(h_out)
            client.close()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
def test_cuda_handle_from_the_servers_own_process_is_refused_with_a_reason(server: openinfer.Server) -> None:
    import tritonclient.utils.cuda_shared_memory as cshm

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    h = cshm.create_shared_memory_region("same_process", 64, 0)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.register_cuda_shared_memory("same_process", cshm.get_raw_handle(h), 0, 64)
        assert "cannot be opened by the process that exported it" in str(e.value), str(e.value)
        assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    finally:
        cshm.destroy_shared_memory_region(h)
        client.close()


def test_output_windows_over_inputs_stay_intact(regions: Any) -> None:
    """Outputs may be asked over the inputs' windows (inputs are dead once the model ran): an
    output that still views that memory (here B, and A for the other) is copied aside before
    anything is written there, whatever goes where."""
    views = openinfer.Model(
        "two_views", lambda d: {"A": d["X"], "B": d["X"][2:]},
        inputs=[openinfer.Tensor("X", "INT32", [-1])],
        outputs=[openinfer.Tensor("A", "INT32", [-1]), openinfer.Tensor("B", "INT32", [-1])],
    )
    x = np.arange(100, dtype=np.int32)
    r = regions(1024)
    with openinfer.serve(models=[views], http_port=0, grpc_port=None, log=False) as srv:
        def post(path: str, body: Any) -> requests.Response:
            return requests.post(f"{srv.url}/v2/{path}", json=body, timeout=30)

        assert post("systemsharedmemory/region/r/register", {"key": r.key, "byte_size": 1024}).status_code == 200
        x_in = {"name": "X", "datatype": "INT32", "shape": [100], "parameters": shm_params("r", 400)}
        cases = [
            # A shifted by 8 bytes over X, B over the socket: B must not see A's write.
            [{"name": "A", "parameters": shm_params("r", 400, 8)}, {"name": "B"}],
            # A exactly where X is (no copy at all), B right after it.
            [{"name": "A", "parameters": shm_params("r", 400)}, {"name": "B", "parameters": shm_params("r", 392, 400)}],
            # B first over the start of X, then A over all of X.
            [{"name": "B", "parameters": shm_params("r", 392, 0)}, {"name": "A", "parameters": shm_params("r", 400, 512)}],
        ]
        for outputs in cases:
            r.write(x.tobytes())
            resp = post("models/two_views/infer", {"inputs": [x_in], "outputs": outputs})
            assert resp.status_code == 200, resp.text
            got = {}
            asked = {o["name"]: o.get("parameters") for o in outputs}
            for o in resp.json()["outputs"]:
                p = asked[o["name"]]
                if p is not None:  # in the region where it was asked (the answer names no region, as Triton's)
                    assert "parameters" not in o and "data" not in o, o
                    got[o["name"]] = np.frombuffer(r.read(4 * o["shape"][0], p.get("shared_memory_offset", 0)),
                                                   np.int32).tolist()
                else:
                    got[o["name"]] = o["data"]
            assert got == {"A": x.tolist(), "B": x[2:].tolist()}, outputs


def test_object_truncated_after_registration(api: Any, regions: Any, server: openinfer.Server) -> None:
    """A shm object that shrank under its mapping is refused (touching it would raise SIGBUS)."""
    r = regions(1 << 16)
    assert api.register("shrinks", r.key, 1 << 16).status_code == 200
    fd = os.open("/dev/shm" + r.key, os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
    finally:
        os.close(fd)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], "parameters": shm_params("shrinks", 64)}]}
    resp = api.infer("echo_int32", body)
    assert resp.status_code == 400 and "shrank to 100 bytes" in resp.json()["error"]
    assert_alive(server.http_port)


def test_region_count_is_bounded(regions: Any) -> None:
    """One user may register OI_SHM_MAX_REGIONS_PER_USER regions; regions on one object share
    its descriptor and mapping, so a thousand registrations of one key open one descriptor."""
    r = regions(4096)
    body = json.dumps({"key": r.key, "byte_size": 4096}).encode()
    with openinfer.serve(models=[], http_port=0, grpc_port=None, log=False) as srv:
        conn = Http(srv.http_port)
        try:
            def post(path: str, data: bytes = b"") -> tuple[int, Any]:
                status, _, reply = conn.request("POST", f"/v2/systemsharedmemory/{path}", data)
                return status, json.loads(reply)

            def object_fds() -> int:  # this process's descriptors of the object (any thread's)
                n = 0
                for fd in os.listdir("/proc/self/fd"):
                    try:
                        n += os.readlink(f"/proc/self/fd/{fd}") == "/dev/shm" + r.key
                    except OSError:  # closed meanwhile
                        pass
                return n

            fds_before = object_fds()
            for i in range(1024):
                assert post(f"region/r{i}/register", body)[0] == 200
            # One object, one descriptor. Counted by what they point at: a count of all the
            # process's descriptors also saw other tests' leftovers (a gevent hub's epoll)
            # opening meanwhile, under ASan.
            assert object_fds() - fds_before == 1
            status, reply = post("region/one_more/register", body)
            assert status == 429 and "1024 regions" in reply["error"] and "for one user" in reply["error"]
            assert post("region/r7/unregister")[0] == 200
            assert post("region/one_more/register", body)[0] == 200
            assert post("unregister")[0] == 200
            assert conn.request("GET", "/v2/systemsharedmemory/status")[2] == b"[]"
        finally:
            conn.close()
