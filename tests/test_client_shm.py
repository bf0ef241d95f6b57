"""openinfer.Client over system shared memory: used on its own against a local server (inputs
staged in pooled regions, outputs viewing them), every datatype, result lifetimes, outputs
larger than guessed, the explicit region API, fallbacks to the socket, concurrency, timeouts
and clean-up on close."""

from __future__ import annotations

import glob
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Client, InferenceServerError, SharedMemoryRegion
from openinfer.client import _is_loopback

from conftest import V2_TYPES, serve_apart

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([True, False, True, True]),
    "UINT8": np.array([0, 7, 255], np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([1, 2**32 - 1], np.uint32),
    "UINT64": np.array([3, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 0, 127], np.int8),
    "INT16": np.array([-32768, 5], np.int16),
    "INT32": np.arange(-5, 5, dtype=np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([0.5, -1.25, 65504], np.float16),
    "FP32": np.linspace(-1, 1, 11, dtype=np.float32),
    "FP64": np.array([np.pi, -np.e, 1e300]),
    "BF16": np.array([0x3F80, 0xC000, 0x7F80], np.uint16),  # 1.0, -2.0, inf as bit patterns
    "BYTES": np.array([b"", b"abc", "é".encode(), b"\x00\xff" * 50], dtype=object),
}


def server_regions(client: Client) -> list[str]:
    return [r["name"] for r in client.shared_memory_status()]


def pool_regions(client: Client) -> list[SharedMemoryRegion]:
    pool = client._shm_pool
    assert isinstance(pool, openinfer.shm.Pool), pool
    return [s.region for s in list(pool._free) + list(pool._busy)]


def inside_pool(client: Client, arr: np.ndarray) -> bool:
    return any(r.offset_of(arr) is not None for r in pool_regions(client) if not r.closed)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"


@pytest.fixture(autouse=True)
def every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small tensors take the socket by default (faster there); these tests want the pool."""
    monkeypatch.setattr(openinfer.client, "SHM_MIN_BYTES", 0)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: openinfer.Server) -> Any:
    """A client of the session server over each transport: shared memory works on both."""
    with Client(server.url if request.param == "http" else server.grpc_url, timeout=30) as c:
        yield c


def test_loopback_detection() -> None:
    assert _is_loopback("127.0.0.1") and _is_loopback("127.3.4.5") and _is_loopback("::1")
    assert _is_loopback("localhost")
    assert not _is_loopback("10.0.0.1") and not _is_loopback("example.com") and not _is_loopback("0.0.0.0")


def test_uses_shared_memory_on_its_own(client: Client) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    out = client.infer("simple", {"INPUT0": a, "INPUT1": a})
    assert np.array_equal(out["OUTPUT0"], 2 * a) and np.array_equal(out["OUTPUT1"], 0 * a)
    assert inside_pool(client, out["OUTPUT0"]) and inside_pool(client, out["OUTPUT1"])
    mine = [r.name for r in pool_regions(client)]
    assert mine and set(mine) <= set(server_regions(client))
    # Registered once: more calls reuse the region once the result is gone (while it lives,
    # another region serves).
    del out
    for i in range(20):
        client.infer("simple", {"INPUT0": a + i, "INPUT1": a})
    assert [r.name for r in pool_regions(client)] == mine


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_every_datatype(client: Client, dtype: str) -> None:
    arr = SAMPLES[dtype]
    datatypes = {"INPUT0": "BF16"} if dtype == "BF16" else None
    out = client.infer(f"echo_{dtype.lower()}", {"INPUT0": arr}, datatypes=datatypes)["OUTPUT0"]
    if dtype == "BF16":
        out = out.view(np.uint16)
    assert out.shape == arr.shape
    assert out.tolist() == arr.tolist()
    if dtype != "BYTES":
        assert inside_pool(client, out)


def test_results_stay_valid_while_held(client: Client) -> None:
    """A result's region is not reused while the arrays (or views of them) live."""
    held = []
    for i in range(6):
        x = np.full(1000, i, np.float32)
        y = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        held.append(y[10:20])  # a view of the output; the output itself is dropped
    for i in range(6):
        client.infer("identity_fp32", {"INPUT0": np.full(1000, 99, np.float32)})
    assert [h.tolist() for h in held] == [[float(i)] * 10 for i in range(6)]
    n_busy = len(client._shm_pool._busy)  # type: ignore[union-attr]
    del held
    assert len(client._shm_pool._busy) < n_busy  # type: ignore[union-attr]


def test_large_tensors_and_growth(client: Client) -> None:
    for n in (1, 1000, 300_000, 5_000_000, 10):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        y = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert np.array_equal(x, y) and inside_pool(client, y)


def test_output_larger_than_guessed_goes_by_socket_once(server: openinfer.Server) -> None:
    double = openinfer.Model("double_len", lambda d: {"Y": np.concatenate([d["X"], d["X"]])},
                             inputs=[openinfer.Tensor("X", "FP64", [-1])], outputs=[openinfer.Tensor("Y", "FP64", [-1])])
    with openinfer.serve(models=[double], http_port=0, grpc_port=None, log=False) as srv, Client(srv.url) as c:
        for n in (100, 100_000, 100_000):
            x = np.arange(n, dtype=np.float64)
            y = c.infer("double_len", {"X": x})["Y"]
            assert np.array_equal(y, np.concatenate([x, x]))
        assert inside_pool(c, y)  # learnt: the last call went through shared memory


def test_explicit_regions(client: Client) -> None:
    region = client.shared_memory(1 << 20, name="mine")
    assert "mine" in server_regions(client)
    x = region.array((256, 256), np.float32)
    x[:] = np.arange(256 * 256, dtype=np.float32).reshape(256, 256)
    target = region.array((256, 256), np.float32, offset=512 << 10)
    out = client.infer("matrix", {"INPUT0": region.array((2, 2, 3), np.float32, offset=4096)})
    assert out["OUTPUT0"].shape == (2, 2, 3)
    y = client.infer("identity_fp32", {"INPUT0": x.reshape(-1)}, out={"OUTPUT0": target.reshape(-1)})["OUTPUT0"]
    assert region.offset_of(y) == 512 << 10 and np.array_equal(y.reshape(256, 256), x)
    assert np.array_equal(target, x)
    # Inputs in place, outputs in place: the same window works too.
    x[:] = 7
    y = client.infer("identity_fp32", {"INPUT0": x.reshape(-1)}, out={"OUTPUT0": x.reshape(-1)})["OUTPUT0"]
    assert region.offset_of(y) == 0 and (y == 7).all()
    with pytest.raises(ValueError, match="registered SharedMemoryRegion"):
        client.infer("identity_fp32", {"INPUT0": x.reshape(-1)}, out={"OUTPUT0": np.empty(65536, np.float32)})
    client.unregister(region)
    assert "mine" not in server_regions(client)
    region.close()


def test_region_registered_by_hand(client: Client) -> None:
    with SharedMemoryRegion(4096) as region:
        assert os.path.exists("/dev/shm" + region.key)
        client.register(region)
        v = region.array((4,), np.int64)
        v[:] = [1, 2, 3, 4]
        assert client.infer("echo_int64", {"INPUT0": v})["OUTPUT0"].tolist() == [1, 2, 3, 4]
        with pytest.raises(InferenceServerError) as e:
            client.register(region)  # twice
        # tritonserver's ALREADY_EXISTS: 400 over HTTP, 409 from gRPC's code
        assert e.value.status in (400, 409) and "already in manager" in str(e.value)
        client.unregister(region.name)
    assert not os.path.exists("/dev/shm" + region.key)
    with pytest.raises(ValueError):
        SharedMemoryRegion(0)


def test_bytes_in_region_is_staged(client: Client) -> None:
    out = client.infer("echo_bytes", {"INPUT0": np.array(["x" * 3000, "y"], dtype=object)})["OUTPUT0"]
    assert out.tolist() == [b"x" * 3000, b"y"]


def test_falls_back_when_refused() -> None:
    with openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, log=False,
                         allow_shared_memory=False) as srv:
        with Client(srv.url) as c:
            assert c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})["OUTPUT0"].tolist() == [1.0] * 4
            assert c._shm_pool is False
    with openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, log=False) as srv:
        with Client(srv.url, shared_memory=False) as c:
            c.infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})
            assert not c._shm_pool and c.shared_memory_status() == []


def test_falls_back_when_the_server_lost_its_regions(url: str) -> None:
    import requests

    with Client(url) as c:
        x = np.ones(8, np.float32)
        c.infer("identity_fp32", {"INPUT0": x})
        requests.post(f"{url}/v2/systemsharedmemory/unregister", timeout=10)  # as after a restart
        assert c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"].tolist() == [1.0] * 8
        assert c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"].tolist() == [1.0] * 8


def test_errors_come_through(client: Client) -> None:
    with pytest.raises(InferenceServerError) as e:
        client.infer("nope", {"INPUT0": np.ones(2, np.float32)})
    assert e.value.status == 404
    with pytest.raises(InferenceServerError) as e:
        client.infer("echo_int32", {"INPUT0": np.ones(2, np.float32)})
    assert e.value.status == 400 and "expected datatype INT32" in e.value.message
    with pytest.raises(InferenceServerError) as e:
        client.infer("raises", {"INPUT0": np.ones(2, np.int32)})
    assert e.value.status == 500
    assert client.infer("echo_int32", {"INPUT0": np.ones(2, np.int32)})["OUTPUT0"].tolist() == [1, 1]


def test_timeout_never_reuses_the_slot(client: Client) -> None:
    with pytest.raises(TimeoutError):
        client.infer("slow", {"INPUT0": np.full(4, 500, np.int32)}, timeout=0.1)
    outs = [client.infer("slow", {"INPUT0": np.full(4, 1, np.int32)}) for _ in range(3)]
    time.sleep(0.6)  # the abandoned call has written its output by now
    assert [o["OUTPUT0"].tolist() for o in outs] == [[1, 1, 1, 1]] * 3


def test_threads_share_one_client(url: str) -> None:
    errors: list[BaseException] = []
    with Client(url, max_connections=6) as c:
        def worker(k: int) -> None:
            try:
                for i in range(25):
                    a = np.full(5000 + k, k * 1000 + i, np.float32)
                    out = c.infer("identity_fp32", {"INPUT0": a})["OUTPUT0"]
                    assert np.array_equal(out, a)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        futures = [c.infer_async("identity_fp32", {"INPUT0": np.full(10, i, np.float32)}) for i in range(30)]
        assert [f.result(30)["OUTPUT0"][0] for f in futures] == list(range(30))
    assert not errors, errors[0]


def test_close_cleans_up(url: str) -> None:
    pid = os.getpid()
    before = set(glob.glob(f"/dev/shm/oi_{pid}_*"))
    observer = Client(url, shared_memory=False)
    c = Client(url)
    kept = c.infer("identity_fp32", {"INPUT0": np.ones(100, np.float32)})["OUTPUT0"]
    region = c.shared_memory(4096)
    names = [r.name for r in pool_regions(c)] + [region.name]
    assert set(names) <= set(server_regions(observer))
    assert set(glob.glob(f"/dev/shm/oi_{pid}_*")) - before == {"/dev/shm" + region.key}  # pool: unlinked
    c.close()
    assert kept.tolist() == [1.0] * 100  # still valid after close
    left = set(server_regions(observer))
    assert region.name not in left and not (set(names[:-1]) - {n for n in left})  # held one stays...
    del kept
    assert not set(names) & set(server_regions(observer))  # ...until its array goes
    assert set(glob.glob(f"/dev/shm/oi_{pid}_*")) == before
    observer.close()


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, or a broken one: no GPU for us
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_torch_cuda_tensors_through_cuda_ipc(transport: str, tmp_path: Path) -> None:
    import torch

    shutil.copytree(EXAMPLES / "identity_fp32", tmp_path / "identity_fp32")
    with serve_apart(tmp_path) as (http_url, grpc_url), Client(http_url if transport == "http" else grpc_url) as client:
        x = torch.arange(1 << 16, dtype=torch.float32, device="cuda") * 0.5
        y = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        assert np.array_equal(y, x.cpu().numpy())
        names = set(client._cuda_regions.values())
        status = requests.get(f"{http_url}/v2/cudasharedmemory/status", timeout=10).json()
        assert names and names <= {r["name"] for r in status}
        view = x[100:200]  # inside the same allocation: the same region, another offset
        assert np.array_equal(client.infer("identity_fp32", {"INPUT0": view})["OUTPUT0"], view.cpu().numpy())
        assert set(client._cuda_regions.values()) == names


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU")
def test_torch_cuda_tensor_in_the_servers_own_process_goes_by_host_copy(client: Client) -> None:
    """CUDA IPC cannot reach the process that exported the handle: the server refuses the
    registration, and the client sends the tensor's bytes instead, with the same answer."""
    import torch

    x = torch.arange(1 << 12, dtype=torch.float32, device="cuda") * 0.25
    assert np.array_equal(client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x.cpu().numpy())
    assert not client._cuda_regions


def test_grpc_wire_messages(server: openinfer.Server) -> None:
    """The few gRPC messages the client writes and reads itself for shared-memory calls, checked
    against the server through grpcio (bytes in, bytes out)."""
    import grpc

    from openinfer import shm

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch, SharedMemoryRegion(1 << 16) as r:
        def call(method: str, body: bytes) -> bytes:
            return ch.unary_unary(shm.GRPC_SERVICE + method)(body, timeout=10)

        assert call("SystemSharedMemoryRegister", shm.encode_register("wire", r.key, 0, 1 << 16)) == b""
        r.array((16,), np.int32)[:] = np.arange(16)
        p = {"shared_memory_region": "wire", "shared_memory_byte_size": 64}
        body = {
            "id": "w1", "parameters": {"i": -3, "f": 1.5, "b": True, "s": "é"},
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": p},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": p}],
            "outputs": [{"name": "OUTPUT0", "parameters": {**p, "shared_memory_offset": 1024}}, {"name": "OUTPUT1"}],
        }
        reply = shm.decode_infer_response(call("ModelInfer", shm.encode_infer_request(body, "simple", "1")))
        o0, o1 = reply["outputs"]
        assert (o0["name"], o0["datatype"], o0["shape"]) == ("OUTPUT0", "INT32", [1, 16])
        assert o0["parameters"] == {} and "raw" not in o0  # in the region asked for; no echo, as Triton
        assert np.array_equal(r.array((16,), np.int32, 1024), 2 * np.arange(16))
        assert o1["parameters"] == {} and np.frombuffer(o1["raw"], np.int32).tolist() == [0] * 16
        assert call("SystemSharedMemoryUnregister", shm.encode_name("wire")) == b""
        with pytest.raises(grpc.RpcError) as e:
            call("SystemSharedMemoryStatus", shm.encode_name("wire"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_small_tensors_take_the_socket(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openinfer.client, "SHM_MIN_BYTES", 256 << 10)
    with Client(url) as c:
        small = c.infer("identity_fp32", {"INPUT0": np.ones(16, np.float32)})["OUTPUT0"]
        assert c._shm_pool is None  # not even asked yet: small calls never pay for the question
        assert small.tolist() == [1.0] * 16
        big = c.infer("identity_fp32", {"INPUT0": np.ones(1 << 16, np.float32)})["OUTPUT0"]
        assert inside_pool(c, big)
        # A model known for large outputs takes the pool even for small inputs.
        grow = openinfer.Model("grow", lambda d: {"Y": np.zeros(int(d["N"][0]), np.float32)},
                               inputs=[openinfer.Tensor("N", "INT64", [1])], outputs=[openinfer.Tensor("Y", "FP32", [-1])])
    with openinfer.serve(models=[grow], http_port=0, grpc_port=None, log=False) as srv, Client(srv.url) as c:
        first = c.infer("grow", {"N": np.array([1 << 17])})["Y"]
        again = c.infer("grow", {"N": np.array([1 << 17])})["Y"]
        assert first.shape == again.shape == (1 << 17,) and not inside_pool(c, first) and inside_pool(c, again)


def test_exit_without_close_unregisters(url: str) -> None:
    """A process that exits with results still held and its client never closed leaves neither
    registrations on the server nor objects in /dev/shm."""
    import subprocess
    import sys

    code = (
        "import numpy as np, openinfer, os\n"
        f"c = openinfer.Client({url!r})\n"
        "held = c.infer('identity_fp32', {'INPUT0': np.ones(1 << 18, np.float32)})['OUTPUT0']\n"
        "assert c.shared_memory_status()\n"
        "region = c.shared_memory(4096)\n"
        "print(os.getpid(), flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = r.stdout.strip()
    with Client(url, shared_memory=False) as observer:
        assert not [n for n in server_regions(observer) if n.startswith(f"oi_{pid}_")]
    assert not glob.glob(f"/dev/shm/oi_{pid}_*")


@pytest.mark.parametrize("dtype", V2_TYPES)
def test_outputs_in_shared_memory_without_an_echo(url: str, dtype: str) -> None:
    """The server answers an output it wrote into shared memory as tritonserver does, with its
    name, datatype and shape only: the client reads it from where it asked (for BYTES, the
    space it set aside), and its next call goes by the size the first one taught."""
    with Client(url, timeout=30) as client:
        arr = SAMPLES[dtype]
        datatypes = {"INPUT0": "BF16"} if dtype == "BF16" else None
        for _ in range(2):
            out = client.infer(f"echo_{dtype.lower()}", {"INPUT0": arr}, datatypes=datatypes)["OUTPUT0"]
            got = out.view(np.uint16) if dtype == "BF16" else out
            assert got.shape == arr.shape and got.tolist() == arr.tolist()
            if dtype != "BYTES":
                assert inside_pool(client, out)
