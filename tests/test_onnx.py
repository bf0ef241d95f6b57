"""ONNX models through ONNX Runtime's C API, over HTTP and gRPC with tritonclient: answers equal
`onnxruntime.InferenceSession` on the same inputs for every datatype, batched and unbatched;
Triton configs checked against the model (broken ones unavailable with the reason) or
auto-completed without one; dynamic batching, reshape, session parameters; the example model
and the script that makes it; and openinfer without onnxruntime. The models are built here with
the onnx helper API, into a temporary repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer

from conftest import concurrent

onnx = pytest.importorskip("onnx", reason="onnx is not installed (requirements-test.txt has it)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements-test.txt has it)")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")

ONNX_TYPES = {
    "BOOL": T.BOOL, "UINT8": T.UINT8, "UINT16": T.UINT16, "UINT32": T.UINT32, "UINT64": T.UINT64,
    "INT8": T.INT8, "INT16": T.INT16, "INT32": T.INT32, "INT64": T.INT64, "FP16": T.FLOAT16,
    "FP32": T.FLOAT, "FP64": T.DOUBLE, "BF16": T.BFLOAT16, "BYTES": T.STRING,
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


def save(repo: Path, name: str, graph: Any, config: str | None = None, filename: str = "model.onnx") -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / filename))
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return repo / name / "1" / filename


def io(name: str, onnx_type: int, shape: list[Any]) -> Any:
    return helper.make_tensor_value_info(name, onnx_type, shape)


def const(name: str, values: list[int]) -> Any:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def reverser(onnx_type: int, rows: Any) -> Any:
    """INPUT0 [rows, 4] -> OUTPUT0 (each row reversed, by Slice) and OUTPUT1 (Identity): ops
    ONNX Runtime runs for every datatype, strings and bfloat16 included."""
    return helper.make_graph(
        [
            helper.make_node("Slice", ["INPUT0", "starts", "ends", "axes", "steps"], ["OUTPUT0"]),
            helper.make_node("Identity", ["INPUT0"], ["OUTPUT1"]),
        ],
        "reverser",
        [io("INPUT0", onnx_type, [rows, 4])],
        [io("OUTPUT0", onnx_type, [rows, 4]), io("OUTPUT1", onnx_type, [rows, 4])],
        [const("starts", [-1]), const("ends", [-(2**62)]), const("axes", [1]), const("steps", [-1])],
    )


def probe() -> Any:
    """INPUT0 FP32 [N, W] -> OUTPUT0 = INPUT0 + INPUT0 and SEEN INT64 [N, 1] = N, the batch
    size the session ran with."""
    return helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"]),
            helper.make_node("Shape", ["INPUT0"], ["shape"]),
            helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
            helper.make_node("Concat", ["n", "one"], ["seen_shape"], axis=0),
            helper.make_node("Expand", ["n", "seen_shape"], ["SEEN"]),
        ],
        "probe",
        [io("INPUT0", T.FLOAT, ["N", "W"])],
        [io("OUTPUT0", T.FLOAT, ["N", "W"]), io("SEEN", T.INT64, ["N", 1])],
        [const("zero", [0]), const("one", [1])],
    )


def add_sub(rows: Any, onnx_type: int = T.INT32) -> Any:
    return helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub",
        [io("INPUT0", onnx_type, [rows, 16]), io("INPUT1", onnx_type, [rows, 16])],
        [io("OUTPUT0", onnx_type, [rows, 16]), io("OUTPUT1", onnx_type, [rows, 16])],
    )  # fmt: skip


ADD_SUB_CONFIG = """\
    name: "add_sub"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ {dims} ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
    instance_group [ {{ count: 2 kind: KIND_CPU }} ]
    {extra}
"""


def build_repo(repo: Path) -> None:
    for datatype, onnx_type in ONNX_TYPES.items():
        save(repo, f"rev_{datatype.lower()}", reverser(onnx_type, "N"))  # config-less: batches
        save(repo, f"fixed_{datatype.lower()}", reverser(onnx_type, 2))  # config-less: does not
    save(repo, "add_sub", add_sub("N"), ADD_SUB_CONFIG.format(
        dims=16, extra='parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        'parameters { key: "inter_op_thread_count" value: { string_value: "1" } }\n'
        "optimization { graph { level: 1 } }"))  # fmt: skip
    save(repo, "probe", probe(), """\
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "SEEN" data_type: TYPE_INT64 dims: [ 1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 50000 }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """)  # fmt: skip
    # Reshape: the session sees [N] where the config declares [N, 1].
    save(repo, "reshaped", helper.make_graph(
        [helper.make_node("Neg", ["X"], ["Y"])], "neg", [io("X", T.FLOAT, ["N"])], [io("Y", T.FLOAT, ["N"])]), """\
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
    """)  # fmt: skip
    save(repo, "reshaped_any", helper.make_graph(
        [helper.make_node("Neg", ["X"], ["Y"])], "neg", [io("X", T.FLOAT, ["N", 2, 2])], [io("Y", T.FLOAT, ["N", 2, 2])]), """\
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ 2, 2 ] } } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
    """)  # fmt: skip
    # NonZero's output size depends on the data: ONNX Runtime allocates it, openinfer takes it.
    save(repo, "nonzero", helper.make_graph(
        [helper.make_node("NonZero", ["X"], ["Y"])], "nz", [io("X", T.INT64, [6])], [io("Y", T.INT64, [1, "K"])]))  # fmt: skip
    # A Reshape that fails at run time for inputs of the wrong size.
    save(repo, "to_2x2", helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])], "r", [io("X", T.FLOAT, ["N"])],
        [io("Y", T.FLOAT, [2, 2])], [const("shape", [2, 2])]))  # fmt: skip
    save(repo, "scalar", helper.make_graph(
        [helper.make_node("Neg", ["X"], ["Y"])], "neg", [io("X", T.DOUBLE, [])], [io("Y", T.DOUBLE, [])]))  # fmt: skip
    save(repo, "other_name", add_sub(4), 'platform: "onnxruntime_onnx"\ndefault_model_filename: "add_sub.onnx"\n',
         filename="add_sub.onnx")  # fmt: skip
    # Broken ones: each unavailable with its reason.
    (repo / "bad_file" / "1").mkdir(parents=True)
    (repo / "bad_file" / "1" / "model.onnx").write_bytes(b"this is not a protobuf \xff\xfe")
    save(repo, "bad_dims", add_sub("N"), ADD_SUB_CONFIG.format(dims=5, extra="").replace('"add_sub"', '"bad_dims"'))
    save(repo, "bad_dtype", add_sub("N", T.FLOAT), ADD_SUB_CONFIG.format(dims=16, extra="").replace('"add_sub"', '"bad_dtype"'))
    save(repo, "bad_batch", add_sub(4), ADD_SUB_CONFIG.format(dims=16, extra="").replace('"add_sub"', '"bad_batch"'))
    save(repo, "bad_name", add_sub("N"), ADD_SUB_CONFIG.format(dims=16, extra="").replace('"add_sub"', '"bad_name"')
         .replace('name: "INPUT1"', 'name: "INPUT9"'))  # fmt: skip
    save(repo, "bad_autofill", add_sub(4), 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    save(repo, "bad_mode", add_sub("N"), 'platform: "onnxruntime_onnx"\n'
         'parameters { key: "execution_mode" value: { string_value: "3" } }\n')  # fmt: skip
    save(repo, "bad_accelerator", add_sub("N"), 'platform: "onnxruntime_onnx"\n'
         'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "warp_drive" } ] } }\n')  # fmt: skip
    save(repo, "no_openvino", add_sub("N"), 'platform: "onnxruntime_onnx"\n'
         'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" '
         'parameters { key: "device_type" value: "CPU" } } ] } }\n')  # fmt: skip
    save(repo, "no_file", add_sub("N"), 'backend: "onnxruntime"\ndefault_model_filename: "absent.onnx"\n')
    save(repo, "bad_threads", add_sub("N"), 'platform: "onnxruntime_onnx"\n'
         'parameters { key: "intra_op_thread_count" value: { string_value: "two" } }\n')  # fmt: skip
    save(repo, "bad_kind", add_sub("N"), 'platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_MODEL } ]\n')


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx_repo")
    build_repo(root)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[openinfer.Server]:
    with openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False) as srv:
        yield srv


def http_client(server: openinfer.Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)


def grpc_client(server: openinfer.Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


# ---- the reference: ONNX Runtime's own Python API on the same file ----------------------------


def reference(path: str, inputs: dict[str, np.ndarray], datatype: str) -> dict[str, np.ndarray]:
    """InferenceSession.run on `inputs`; BF16 (which numpy lacks) goes in and out as its uint16
    bits through OrtValues, strings as str."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    if datatype == "BF16":
        binding = session.io_binding()
        outs = {}
        for name, x in inputs.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, onnx_element_type=T.BFLOAT16))
        for name in names:  # these models' outputs have their input's shape
            outs[name] = np.zeros_like(next(iter(inputs.values())))
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(outs[name], onnx_element_type=T.BFLOAT16))
        session.run_with_iobinding(binding)
        return outs
    if datatype == "BYTES":
        inputs = {k: np.vectorize(lambda b: b.decode(), otypes=[object])(v) for k, v in inputs.items()}
        got = session.run(None, inputs)
        return {n: np.vectorize(lambda s: s.encode(), otypes=[object])(v) for n, v in zip(names, got)}
    return dict(zip(names, session.run(None, inputs)))


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values that survive every wire format of the datatype: BF16 as its uint16 bits."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(n)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if datatype == "BYTES":
        words = [f"w{i}-é".encode() + b"\x00z" * (i % 2) for i in range(n)]
        return np.array(words, dtype=object).reshape(shape)
    if datatype == "BF16":
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    if datatype in ("FP16", "FP32", "FP64"):
        return rng.standard_normal(shape).astype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype])
    dtype = np.dtype(datatype.lower())
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def bf16_as_fp32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


_clients: dict[tuple[int, str], Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for client in _clients.values():
        client.close()
    _clients.clear()


def infer(server: openinfer.Server, protocol: str, model: str, inputs: dict[str, tuple[str, np.ndarray]],
          outputs: list[str] | None = None, *, fresh: bool = False) -> Any:  # fmt: skip
    """tritonclient's infer over `protocol`; BF16 goes as float32 (tritonclient's convention).
    The module's server gets one client per protocol, kept for the module (tritonclient.http's
    gevent pool must be used and closed on the thread that made it); `fresh`: a client of its
    own, closed at once (for other servers, and gRPC from other threads)."""
    mod = httpclient if protocol == "http" else grpcclient
    make = http_client if protocol == "http" else grpc_client
    client = make(server) if fresh else _clients.get((id(server), protocol))
    if client is None:
        client = _clients[id(server), protocol] = make(server)
    ins = []
    for name, (datatype, x) in inputs.items():
        i = mod.InferInput(name, list(x.shape), datatype)
        i.set_data_from_numpy(bf16_as_fp32(x) if datatype == "BF16" else x)
        ins.append(i)
    outs = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    try:
        return client.infer(model, ins, outputs=outs)
    finally:
        if fresh:
            client.close()


# ---- every datatype ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
def test_every_datatype_equals_onnxruntime(
    server: openinfer.Server, repo: Path, datatype: str, batched: bool, protocol: str
) -> None:
    name = f"{'rev' if batched else 'fixed'}_{datatype.lower()}"
    x = sample(datatype, (3 if batched else 2, 4))
    result = infer(server, protocol, name, {"INPUT0": (datatype, x)})
    want = reference(str(repo / name / "1" / "model.onnx"), {"INPUT0": x}, datatype)
    for out in ("OUTPUT0", "OUTPUT1"):
        got = result.as_numpy(out)
        expected = bf16_as_fp32(want[out]) if datatype == "BF16" else want[out]
        assert got.shape == expected.shape, out
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(want["OUTPUT1"], x)  # the reference itself is the identity there
    response = result.get_response()
    datatypes = [o["datatype"] for o in response["outputs"]] if protocol == "http" else [o.datatype for o in response.outputs]
    assert datatypes == [datatype, datatype]


def test_json_requests_and_responses(server: openinfer.Server) -> None:
    """Without the binary extension: numbers and strings as JSON."""
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [3, 4], "data": x.ravel().tolist()}]}
    r = requests.post(f"{server.url}/v2/models/rev_int32/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["OUTPUT0"]["shape"] == [3, 4]
    assert outputs["OUTPUT0"]["data"] == x[:, ::-1].ravel().tolist()
    words = ["a", "", "héllo", "zz"]
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 4], "data": words}]}
    r = requests.post(f"{server.url}/v2/models/rev_bytes/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]}["OUTPUT0"] == words[::-1]
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 4], "data": [""] * 8}]}
    r = requests.post(f"{server.url}/v2/models/rev_bytes/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert [o["data"] for o in r.json()["outputs"]] == [[""] * 8, [""] * 8]


def test_requested_outputs_only(server: openinfer.Server) -> None:
    x = sample("FP32", (2, 4))
    for protocol in ("http", "grpc"):
        result = infer(server, protocol, "rev_fp32", {"INPUT0": ("FP32", x)}, outputs=["OUTPUT1"])
        assert result.as_numpy("OUTPUT0") is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x)


def test_configured_model(server: openinfer.Server) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    for protocol in ("http", "grpc"):
        result = infer(server, protocol, "add_sub", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    config = requests.get(f"{server.url}/v2/models/add_sub/config", timeout=10).json()
    assert (config["platform"], config["backend"], config["max_batch_size"]) == ("onnxruntime_onnx", "onnxruntime", 8)
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 2)]
    assert config["parameters"]["intra_op_thread_count"] == {"string_value": "1"}


def test_default_model_filename(server: openinfer.Server) -> None:
    a = np.ones((4, 16), np.int32)
    result = infer(server, "http", "other_name", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", a)})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    assert requests.get(f"{server.url}/v2/models/other_name/config", timeout=10).json()["default_model_filename"] == "add_sub.onnx"


# ---- config-less: Triton's auto-complete -------------------------------------------------------


def test_config_less_batching_model_is_auto_completed(server: openinfer.Server) -> None:
    meta = requests.get(f"{server.url}/v2/models/rev_fp16", timeout=10).json()
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP16", "shape": [-1, 4]}]
    config = requests.get(f"{server.url}/v2/models/rev_fp16/config", timeout=10).json()
    assert (config["backend"], config["platform"], config["default_model_filename"]) == ("onnxruntime", "onnxruntime_onnx", "model.onnx")
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_FP16", [4])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT0", [4]), ("OUTPUT1", [4])]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    with pytest.raises(Exception, match="batch size"):  # more rows than max_batch_size
        infer(server, "http", "rev_fp16", {"INPUT0": ("FP16", np.zeros((5, 4), np.float16))})


def test_config_less_fixed_model_does_not_batch(server: openinfer.Server) -> None:
    config = requests.get(f"{server.url}/v2/models/fixed_int8/config", timeout=10).json()
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert [t["dims"] for t in config["input"]] == [[2, 4]]
    grpc = grpc_client(server)
    try:
        meta = grpc.get_model_metadata("fixed_int8")
        assert (meta.platform, list(meta.inputs[0].shape)) == ("onnxruntime_onnx", [2, 4])
    finally:
        grpc.close()


def test_scalars(server: openinfer.Server) -> None:
    x = np.array(2.5)
    result = infer(server, "http", "scalar", {"X": ("FP64", x)})
    assert result.as_numpy("Y").shape == () and result.as_numpy("Y") == -2.5


# ---- outputs ONNX Runtime allocates, reshape, run-time failures ---------------------------------


def test_data_dependent_output_shape(server: openinfer.Server, repo: Path) -> None:
    x = np.array([0, 3, 0, 0, 7, 1], np.int64)
    for protocol in ("http", "grpc"):
        result = infer(server, protocol, "nonzero", {"X": ("INT64", x)})
        np.testing.assert_array_equal(result.as_numpy("Y"), reference(str(repo / "nonzero" / "1" / "model.onnx"), {"X": x}, "INT64")["Y"])
        assert result.as_numpy("Y").shape == (1, 3)
    result = infer(server, "http", "nonzero", {"X": ("INT64", np.zeros(6, np.int64))})
    assert result.as_numpy("Y").shape == (1, 0)


def test_reshape(server: openinfer.Server) -> None:
    x = np.arange(5, dtype=np.float32).reshape(5, 1)
    for protocol in ("http", "grpc"):
        result = infer(server, protocol, "reshaped", {"X": ("FP32", x)})
        assert result.as_numpy("Y").shape == (5, 1)
        np.testing.assert_array_equal(result.as_numpy("Y"), -x)
    # A variable dimension reshaped to a fixed one: a request whose size does not fit is the
    # client's mistake.
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = infer(server, "http", "reshaped_any", {"X": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("Y"), -x.reshape(2, 2, 2))
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 3], "data": [0] * 6}]}
    r = requests.post(f"{server.url}/v2/models/reshaped_any/infer", json=body, timeout=30)
    assert r.status_code == 400 and "input 'X': shape [2,3] cannot be reshaped to [2,2,2]" in r.json()["error"], r.text


def test_run_failure_is_500_and_the_server_stays_up(server: openinfer.Server) -> None:
    r = requests.post(
        f"{server.url}/v2/models/to_2x2/infer", timeout=30,
        json={"inputs": [{"name": "X", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]},
    )  # fmt: skip
    assert r.status_code == 500
    assert "model 'to_2x2'" in r.json()["error"] and "reshape" in r.json()["error"].lower()
    grpc = grpc_client(server)
    try:
        i = grpcclient.InferInput("X", [3], "FP32")
        i.set_data_from_numpy(np.ones(3, np.float32))
        with pytest.raises(Exception, match="INTERNAL"):
            grpc.infer("to_2x2", [i])
    finally:
        grpc.close()
    result = infer(server, "http", "to_2x2", {"X": ("FP32", np.arange(4, dtype=np.float32))})
    np.testing.assert_array_equal(result.as_numpy("Y"), np.arange(4, dtype=np.float32).reshape(2, 2))


def test_bad_requests_name_the_input(server: openinfer.Server) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    r = requests.post(f"{server.url}/v2/models/rev_int32/infer", json=body, timeout=30)
    assert r.status_code == 400 and "INPUT0" in r.json()["error"] and "INT32" in r.json()["error"]
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]}
    r = requests.post(f"{server.url}/v2/models/rev_int32/infer", json=body, timeout=30)
    assert r.status_code == 400 and "INPUT0" in r.json()["error"]


# ---- dynamic batching ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dynamic_batching_gives_each_client_its_rows(server: openinfer.Server, protocol: str) -> None:
    def client(i: int) -> int:
        seen = 0
        for k in range(4):
            rows = 1 + (i + k) % 3
            width = 4 if (i + k) % 4 else 5  # two shapes in flight: only like ones batch
            x = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 1000 * i + 100 * k
            if protocol == "grpc":
                result = infer(server, protocol, "probe", {"INPUT0": ("FP32", x)}, fresh=True)
                doubled, batch = result.as_numpy("OUTPUT0"), result.as_numpy("SEEN")
            else:  # tritonclient.http's gevent pool belongs to one thread: requests here
                body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
                r = requests.post(f"{server.url}/v2/models/probe/infer", json=body, timeout=60)
                assert r.status_code == 200, r.text
                outs = {o["name"]: o for o in r.json()["outputs"]}
                doubled = np.array(outs["OUTPUT0"]["data"], np.float32).reshape(outs["OUTPUT0"]["shape"])
                batch = np.array(outs["SEEN"]["data"], np.int64).reshape(outs["SEEN"]["shape"])
            np.testing.assert_array_equal(doubled, x * 2)
            assert batch.shape == (rows, 1)
            assert rows <= int(batch.max()) <= 8
            seen = max(seen, int(batch.max()))
        return seen

    seen = concurrent(12, client)
    assert max(seen) > 3, f"no request was batched with another: {seen}"
    stats = requests.get(f"{server.url}/v2/models/probe/stats", timeout=10).json()["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"]


# ---- broken models --------------------------------------------------------------------------------

BROKEN = {
    "bad_file": ["bad_file", "model.onnx", "protobuf"],
    "bad_dims": [
        "model 'bad_dims', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model "
        "configuration specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 "
        "followed by the explicit tensor shape, making complete shape [-1,5])"
    ],
    "bad_dtype": ["configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"],
    "bad_batch": ["tensor 'INPUT0': for the model to support batching", "[4,16]"],
    "bad_name": ["unexpected inference input 'INPUT9'", "INPUT0, INPUT1"],
    "bad_autofill": ["autofill failed for model 'bad_autofill': model does not support batching"],
    "bad_mode": ["execution_mode are 0 or 1 but got 3"],
    "bad_accelerator": ["unknown accelerator 'warp_drive'"],
    "no_file": ["absent.onnx (default_model_filename) does not exist"],
    "bad_threads": ["parameter intra_op_thread_count must be a non-negative integer, got 'two'"],
    "bad_kind": ["instance_group kind KIND_MODEL is not supported by the onnxruntime backend"],
    # The accelerator is passed to ONNX Runtime, whose CPU wheel has no OpenVINO provider.
    "no_openvino": ["execution accelerator 'openvino': OpenVINO execution provider is not supported"],
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_models_are_unavailable_with_the_reason(server: openinfer.Server, name: str) -> None:
    index = {m["name"]: m for m in requests.post(f"{server.url}/v2/repository/index", timeout=10).json()}
    assert index[name]["state"] == "UNAVAILABLE"
    reason = index[name]["reason"]
    for part in BROKEN[name]:
        assert part.lower() in reason.lower(), reason
    assert requests.get(f"{server.url}/v2/models/{name}/ready", timeout=10).status_code == 400
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]}
    r = requests.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=10)
    assert r.status_code == 503, r.text
    grpc = grpc_client(server)
    try:
        i = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        i.set_data_from_numpy(np.zeros((1, 16), np.int32))
        with pytest.raises(Exception, match="UNAVAILABLE"):
            grpc.infer(name, [i])
    finally:
        grpc.close()
    assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    result = infer(server, "http", "rev_int64", {"INPUT0": ("INT64", np.ones((1, 4), np.int64))})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 4), np.int64))


@pytest.mark.gpu
def test_kind_gpu_runs_on_cuda(tmp_path: Path) -> None:
    from openinfer._backends import onnx_model

    onnx_model.ensure_runtime()
    if "CUDAExecutionProvider" not in onnx_model.providers():
        pytest.skip("the installed onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)")
    save(tmp_path, "add_sub", add_sub("N"), ADD_SUB_CONFIG.format(dims=16, extra="").replace("KIND_CPU", "KIND_GPU"))
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False) as srv:
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        result = infer(srv, "http", "add_sub", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", a)}, fresh=True)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
        config = requests.get(f"{srv.url}/v2/models/add_sub/config", timeout=10).json()
        assert config["instance_group"][0]["kind"] == "KIND_GPU"


def test_kind_gpu_without_cuda_is_unavailable(tmp_path: Path) -> None:
    from openinfer._backends import onnx_model

    onnx_model.ensure_runtime()
    if "CUDAExecutionProvider" in onnx_model.providers():
        pytest.skip("this onnxruntime has CUDA")
    save(tmp_path, "add_sub", add_sub("N"), ADD_SUB_CONFIG.format(dims=16, extra="").replace("KIND_CPU", "KIND_GPU"))
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False) as srv:
        index = requests.post(f"{srv.url}/v2/repository/index", timeout=10).json()
        assert index[0]["state"] == "UNAVAILABLE"
        assert "KIND_GPU needs ONNX Runtime's CUDA execution provider" in index[0]["reason"]
        assert "pip install onnxruntime-gpu" in index[0]["reason"]


def test_the_describing_session_serves_the_first_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model file is read once for the first instance: the session that describes the
    model serves it. The file is held open from the moment it is found (issue 38: it is read
    through that descriptor, never by its path again), so with the file gone from the version
    directory once the model is described, a model of two instances makes its second session
    from the same file all the same."""
    from openinfer._backends import onnx_model

    for name, count in (("one", 1), ("two", 2)):
        config = f'platform: "onnxruntime_onnx"\ninstance_group [ {{ count: {count} kind: KIND_CPU }} ]\n'
        save(tmp_path, name, add_sub("N"), config)
    describe = onnx_model.describe

    def describe_and_remove(spec: dict[str, Any]) -> dict[str, Any]:
        described = describe(spec)
        spec["model"].path.unlink()
        return described

    monkeypatch.setattr(onnx_model, "describe", describe_and_remove)
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False) as srv:
        index = {m["name"]: m for m in requests.post(f"{srv.url}/v2/repository/index", timeout=10).json()}
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        for name in ("one", "two"):
            assert index[name]["state"] == "READY", index[name]
            assert not (tmp_path / name / "1" / "model.onnx").exists()
            result = infer(srv, "http", name, {"INPUT0": ("INT32", a), "INPUT1": ("INT32", a)}, fresh=True)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


# ---- sequence batching ------------------------------------------------------------------------------


def accumulator() -> Any:
    """OUTPUT = INPUT + SUM_IN (0 at START); SUM_OUT = OUTPUT: a running sum kept by the
    sequence batcher's implicit state."""
    return helper.make_graph(
        [
            helper.make_node("Sub", ["one", "START"], ["carry"]),
            helper.make_node("Mul", ["SUM_IN", "carry"], ["kept"]),
            helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["SUM_OUT"]),
        ],
        "acc",
        [io(n, T.INT32, ["N", 1]) for n in ("INPUT", "START", "SUM_IN")],
        [io("OUTPUT", T.INT32, ["N", 1]), io("SUM_OUT", T.INT32, ["N", 1])],
        [numpy_helper.from_array(np.array([[1]], np.int32), "one")],
    )


def test_sequence_batching_with_implicit_state(tmp_path: Path) -> None:
    save(tmp_path, "acc", accumulator(), """\
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        }
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """)  # fmt: skip
    with openinfer.serve(tmp_path, http_port=0, grpc_port=0, log=False) as srv:
        client = grpc_client(srv)
        try:
            sums = {7: 0, 8: 0}
            for step, (seq, value) in enumerate([(7, 1), (8, 10), (7, 2), (8, 20), (7, 3)]):
                i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                i.set_data_from_numpy(np.array([[value]], np.int32))
                first = step < 2
                result = client.infer("acc", [i], sequence_id=seq, sequence_start=first, sequence_end=step >= 3)
                sums[seq] += value
                assert int(result.as_numpy("OUTPUT")[0, 0]) == sums[seq]
        finally:
            client.close()


def test_sequence_batching_needs_declared_tensors(tmp_path: Path) -> None:
    save(tmp_path, "acc", accumulator(), """\
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
        }
    """)  # fmt: skip
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False) as srv:
        (entry,) = requests.post(f"{srv.url}/v2/repository/index", timeout=10).json()
        assert entry["state"] == "UNAVAILABLE"
        assert "sequence_batching needs input and output in config.pbtxt" in entry["reason"]


# ---- models sent with a load request -------------------------------------------------------------


def external_weights(location: str) -> Any:
    """Y = Identity(W) where W's 4 bytes are external data at `location`."""
    w = T()
    w.name, w.data_type = "W", T.UINT8
    w.dims.extend([4])
    w.data_location = T.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "4")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return helper.make_graph([helper.make_node("Identity", ["W"], ["Y"])], "ext", [], [io("Y", T.UINT8, [4])], [w])


def test_load_from_files_over_http_and_grpc(tmp_path: Path) -> None:
    made = tmp_path / "made"
    save(made, "add_sub", add_sub("N"))
    save(made, "weights", external_weights("w.bin"))
    save(made, "escape", external_weights("../../../../../../etc/hostname"))
    model = (made / "add_sub" / "1" / "model.onnx").read_bytes()
    config = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 2})
    (tmp_path / "repo").mkdir()
    with openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=0, model_control_mode="explicit", log=False) as srv:
        http, grpc = http_client(srv), grpc_client(srv)
        try:
            a = np.arange(32, dtype=np.int32).reshape(2, 16)
            http.load_model("add_sub", config=config, files={"file:1/model.onnx": model})
            result = infer(srv, "http", "add_sub", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", a)}, fresh=True)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
            assert http.get_model_config("add_sub")["max_batch_size"] == 2
            grpc.load_model("add_sub", config=config, files={"file:2/model.onnx": model})
            assert http.is_model_ready("add_sub", "2") and not http.is_model_ready("add_sub", "1")
            # External data beside the model is read; a path out of the model's directory is not.
            weights = (made / "weights" / "1" / "model.onnx").read_bytes()
            http.load_model("weights", config="{}", files={"file:1/model.onnx": weights, "file:1/w.bin": b"abcd"})
            got = infer(srv, "grpc", "weights", {}, fresh=True).as_numpy("Y")
            np.testing.assert_array_equal(got, np.frombuffer(b"abcd", np.uint8))
            escape = (made / "escape" / "1" / "model.onnx").read_bytes()
            with pytest.raises(Exception, match="(?i)external data"):
                http.load_model("escape", config="{}", files={"file:1/model.onnx": escape})
            assert not http.is_model_ready("escape")
            http.unload_model("add_sub")
            assert not http.is_model_ready("add_sub")
        finally:
            http.close()
            grpc.close()


# ---- the example model ----------------------------------------------------------------------------


def test_example_model_equals_onnxruntime_and_the_torchscript_mlp() -> None:
    path = openinfer.examples_path() / "mlp_onnx" / "1" / "model.onnx"
    x = np.random.default_rng(7).standard_normal((6, 16)).astype(np.float32)
    with openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=0, log=False) as srv:
        for protocol in ("http", "grpc"):
            got = infer(srv, protocol, "mlp_onnx", {"INPUT__0": ("FP32", x)}, fresh=True).as_numpy("OUTPUT__0")
            np.testing.assert_array_equal(got, reference(str(path), {"INPUT__0": x}, "FP32")["OUTPUT__0"])
            torch = pytest.importorskip("torch")
        scripted = torch.jit.load(str(openinfer.examples_path() / "mlp" / "1" / "model.pt"))
        np.testing.assert_allclose(got, scripted(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_example_script_reproduces_the_committed_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "mlp" / "1").mkdir(parents=True)
    (tmp_path / "mlp" / "1" / "model.pt").write_bytes((ROOT / "examples/models/mlp/1/model.pt").read_bytes())
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_onnx.py"), str(tmp_path)], check=True, timeout=300)
    made = onnx.load(str(tmp_path / "mlp_onnx" / "1" / "model.onnx"))
    committed = onnx.load(str(ROOT / "examples/models/mlp_onnx/1/model.onnx"))
    assert made == committed
    assert (tmp_path / "mlp_onnx" / "config.pbtxt").read_text() == (ROOT / "examples/models/mlp_onnx/config.pbtxt").read_text()


# ---- without onnxruntime ---------------------------------------------------------------------------

WITHOUT_ORT = """
import json, sys, requests
if sys.argv[2] == "hidden":
    sys.modules["onnxruntime"] = None  # as if not installed: find_spec refuses it
import openinfer
with openinfer.serve(sys.argv[1], http_port=0, grpc_port=None, log=False) as srv:
    index = requests.post(srv.url + "/v2/repository/index", timeout=10).json()
    r = requests.post(srv.url + "/v2/models/simple/infer", timeout=10, json={"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]})
    print(json.dumps({"index": index, "simple": r.status_code}))
"""


@pytest.mark.parametrize("how", ["library_nowhere", "hidden"])
def test_without_onnxruntime_the_model_is_unavailable_and_the_rest_serves(tmp_path: Path, how: str) -> None:
    repo = tmp_path / "repo"
    save(repo, "add_sub", add_sub("N"))
    import shutil

    shutil.copytree(openinfer.examples_path() / "simple", repo / "simple")
    env = {k: v for k, v in os.environ.items() if k != "OPENINFER_ONNXRUNTIME_LIB"}
    if how == "library_nowhere":
        env["OPENINFER_ONNXRUNTIME_LIB"] = str(tmp_path / "nowhere" / "libonnxruntime.so")
    out = subprocess.run([sys.executable, "-c", WITHOUT_ORT, str(repo), how], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    states = {m["name"]: m for m in result["index"]}
    assert states["simple"]["state"] == "READY" and result["simple"] == 200
    assert states["add_sub"]["state"] == "UNAVAILABLE"
    reason = states["add_sub"]["reason"]
    assert reason.startswith("onnxruntime unavailable: ") and "pip install onnxruntime" in reason, reason
    if how == "library_nowhere":
        assert "nowhere" in reason and "OPENINFER_ONNXRUNTIME_LIB" in reason
    else:
        assert "not installed" in reason


def test_examples_leave_the_onnx_model_out_without_onnxruntime() -> None:
    code = (
        "import sys, json, requests\nsys.modules['onnxruntime'] = None\nimport openinfer\n"
        "with openinfer.serve(http_port=0, grpc_port=None, log=False) as s:\n"
        "    print(json.dumps(requests.post(s.url + '/v2/repository/index', timeout=10).json()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENINFER_ONNXRUNTIME_LIB"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names = {m["name"]: m.get("state") for m in json.loads(out.stdout.strip().splitlines()[-1])}
    assert names["mlp_onnx"] is None  # listed as a directory, never loaded: not a failure
    assert names["simple"] == "READY"
