"""openinfer.Client and AsyncClient against a real server, over HTTP and over gRPC (every test
runs on both transports): every call, every datatype, zero-copy in both directions,
concurrency, timeouts and errors. gRPC-only features are in test_client_grpc.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc

import numpy as np
import pytest

import openinfer
from openinfer import Client, InferenceServerError

SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module", params=["http", "grpc"])
def client_url(request: pytest.FixtureRequest, server: openinfer.Server) -> str:
    """The session server's URL for each transport: the same tests run on both."""
    return server.url if request.param == "http" else server.grpc_url


@pytest.fixture(scope="module")
def client(client_url: str):
    # The socket path (the server is local: shared memory would be used otherwise; it has
    # tests/test_client_shm.py). The module's other clients take the default, shared memory.
    with Client(client_url, timeout=30, shared_memory=False) as c:
        yield c


def test_health_and_metadata(client: Client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("versioned", 2)
    assert "binary_tensor_data" in client.server_metadata()["extensions"]
    meta = client.model_metadata("simple")
    assert meta["name"] == "simple" and [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert client.model_metadata("versioned", "1")["versions"] == ["1", "2", "3"]
    with pytest.raises(InferenceServerError) as e:
        client.model_metadata("nope")
    assert e.value.status == 404 and e.value.message == "Request for unknown model: 'nope' is not found"
    assert client.is_model_ready("nope") is False  # not served: not ready, as Triton answers
    assert client.is_model_ready("versioned", 9) is False


def test_infer_simple(client: Client) -> None:
    out = client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B})
    assert set(out) == {"OUTPUT0", "OUTPUT1"}
    assert np.array_equal(out["OUTPUT0"], SIMPLE_A + SIMPLE_B) and out["OUTPUT0"].dtype == np.int32
    assert np.array_equal(out["OUTPUT1"], SIMPLE_A - SIMPLE_B)


def test_outputs_subset_version_id_parameters(client: Client) -> None:
    out = client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}, outputs=["OUTPUT1"])
    assert list(out) == ["OUTPUT1"]
    out = client.infer("versioned", {"INPUT0": np.zeros(3, np.int32)}, version=2, request_id="abc")
    assert out["OUTPUT0"].tolist() == [2, 2, 2]
    out = client.infer("params", {"INPUT0": np.zeros(1, np.int32)}, parameters={"k": 1, "s": "x"})
    assert json.loads(out["OUTPUT0"][0]) == {"k": 1, "s": "x"}  # the protocol's own keys stay out


SAMPLES = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 7, 255], np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([1, 2**32 - 1], np.uint32),
    "UINT64": np.array([0, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 127], np.int8),
    "INT16": np.array([-32768, 5], np.int16),
    "INT32": np.array([-(2**31), 2**31 - 1], np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([0.5, -65504, np.inf], np.float16),
    "FP32": np.array([0.1, np.nan, -1e38], np.float32),
    "FP64": np.array([1 / 3, -0.0, 1e308]),
    "BYTES": np.array([b"x", b"", b"\x00\xffz"], dtype=object),
}


@pytest.mark.parametrize("dtype", list(SAMPLES))
def test_every_datatype(client: Client, dtype: str) -> None:
    x = SAMPLES[dtype]
    out = client.infer(f"echo_{dtype.lower()}", {"INPUT0": x})["OUTPUT0"]
    assert out.dtype == x.dtype and out.shape == x.shape
    if x.dtype.kind == "f":
        assert np.array_equal(out, x, equal_nan=True)
    else:
        assert out.tolist() == x.tolist()


def test_bf16_and_str_arrays(client: Client) -> None:
    bits = np.array([0x3F80, 0xC000, 0x3E20], np.uint16)  # 1.0, -2.0, 0.15625
    out = client.infer("echo_bf16", {"INPUT0": bits}, datatypes={"INPUT0": "BF16"})["OUTPUT0"]
    assert out.view(np.uint16).tolist() == bits.tolist()
    out = client.infer("echo_bytes", {"INPUT0": np.array(["h\u00e9", "wo"])})["OUTPUT0"]
    assert out.tolist() == ["h\u00e9".encode(), b"wo"]


def test_non_contiguous_and_multidim(client: Client) -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # strided view
    out = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
    assert out.shape == (4, 3) and np.array_equal(out, x)


def test_outputs_view_the_received_buffer(client: Client) -> None:
    out = client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B})
    a, b = out["OUTPUT0"], out["OUTPUT1"]
    assert not a.flags.owndata and not b.flags.owndata
    assert a.base is b.base and a.base is not None  # one received body behind both
    a[0, 0] = 99  # the client's private memory: writable
    assert b[0, 0] == -1


def test_client_memory_does_not_grow_with_tensor_size(client: Client) -> None:
    def peak(n: int) -> int:
        x = np.ones(n, dtype=np.float32)
        tracemalloc.start()
        out = client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert out.shape == (n,) and out[-1] == 1.0
        return top

    small, large = peak(1 << 10), peak(8 << 20)  # 4 KiB vs 32 MiB
    assert large < small + (1 << 20), (small, large)  # no tensor-sized allocation on the client


def test_errors(client: Client) -> None:
    with pytest.raises(InferenceServerError) as e:
        client.infer("simple", {"INPUT0": SIMPLE_A})
    assert e.value.status == 400 and "but missing required input(s) ['INPUT1']" in e.value.message
    with pytest.raises(InferenceServerError) as e:
        client.infer("simple", {"INPUT0": SIMPLE_A.astype(np.int64), "INPUT1": SIMPLE_B})
    assert "expected datatype INT32, got INT64" in e.value.message
    with pytest.raises(InferenceServerError) as e:
        client.infer("raises", {"INPUT0": np.zeros(1, np.int32)})
    assert e.value.status == 500 and "refuses negative numbers" in str(e.value)
    with pytest.raises(InferenceServerError) as e:
        client.infer("nope", {"X": np.zeros(1)})
    assert e.value.status == 404
    with pytest.raises(ValueError, match="no V2 datatype"):
        client.infer("simple", {"INPUT0": np.zeros(2, dtype=np.complex64)})
    assert client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B})["OUTPUT0"][0, 0] == 1


def test_timeout_and_connection_errors(client_url: str) -> None:
    scheme = client_url.split("://")[0]
    with Client(client_url) as c:
        with pytest.raises(TimeoutError, match="timed out"):
            c.infer("slow", {"INPUT0": np.array([1000], np.int32)}, timeout=0.2)
        # The pool dropped the timed-out connection; the next call works.
        assert c.infer("slow", {"INPUT0": np.array([1], np.int32)})["OUTPUT0"].tolist() == [1]
    with pytest.raises(ConnectionError, match="cannot connect"):
        Client(f"{scheme}://127.0.0.1:1").is_server_live()
    with pytest.raises(ValueError, match="scheme"):
        Client("ftp://x")


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_reconnects_after_server_closed_idle_connection(scheme: str) -> None:
    model = openinfer.Model("id", lambda x: {"Y": x["X"]}, inputs=[openinfer.Tensor("X", "INT64", [-1])],
                            outputs=[openinfer.Tensor("Y", "INT64", [-1])])
    with openinfer.serve(models=[model], http_port=0, log=False, idle_timeout_ms=100) as srv, \
            Client(srv.url if scheme == "http" else srv.grpc_url) as c:
        assert c.infer("id", {"X": np.arange(3)})["Y"].tolist() == [0, 1, 2]
        time.sleep(0.4)  # the server closes the idle keep-alive connection
        assert c.infer("id", {"X": np.arange(4)})["Y"].tolist() == [0, 1, 2, 3]


def test_many_threads_share_one_client(client_url: str) -> None:
    errors: list[BaseException] = []
    with Client(client_url, max_connections=8) as c:
        def worker(k: int) -> None:
            try:
                for i in range(30):
                    a = np.full((1, 16), k * 100 + i, np.int32)
                    out = c.infer("simple", {"INPUT0": a, "INPUT1": SIMPLE_B})
                    assert np.array_equal(out["OUTPUT0"], a + 1)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]


def test_infer_async_futures() -> None:
    # Four calls can only finish if they run at the same time: each waits at a barrier for the
    # other three (no timing is asserted; a barrier that breaks fails the calls).
    barrier = threading.Barrier(4, timeout=20)

    def meet(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        barrier.wait()
        return {"Y": inputs["X"]}

    model = openinfer.Model("meet", meet, instances=4, inputs=[openinfer.Tensor("X", "INT32", [1])],
                            outputs=[openinfer.Tensor("Y", "INT32", [1])])
    with openinfer.serve(models=[model], http_port=0, grpc_port=None, log=False) as srv, \
            Client(srv.url, max_connections=4) as c:
        futures = [c.infer_async("meet", {"X": np.array([i], np.int32)}) for i in range(8)]
        assert [f.result(timeout=60)["Y"].tolist() for f in futures] == [[i] for i in range(8)]


def test_async_client(client_url: str) -> None:
    async def main() -> list[int]:
        async with openinfer.AsyncClient(client_url) as c:
            assert await c.is_server_live()
            assert (await c.model_metadata("simple"))["name"] == "simple"
            outs = await asyncio.gather(*[
                c.infer("simple", {"INPUT0": np.full((1, 16), i, np.int32), "INPUT1": SIMPLE_B}) for i in range(20)])
            return [int(o["OUTPUT0"][0, 0]) for o in outs]

    assert asyncio.run(main()) == [i + 1 for i in range(20)]
