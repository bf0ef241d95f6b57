"""TorchScript models through the libtorch shim, over real HTTP sockets: outputs equal the
in-process torch call exactly, Triton configs (names, NAME__index, dict outputs, reshape,
parameters), config-less serving, broken models reported as not ready with the reason,
dynamic batching under many concurrent clients (torch and Python models), and CUDA (`gpu`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
from openinfer import Model, Tensor
from openinfer.config import DynamicBatching

from conftest import concurrent

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs it)")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")

EXAMPLES = openinfer.examples_path()
# V2 datatype -> torch dtype, for the types the "double" models are generated for.
TORCH_TYPES = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "FP32": torch.float32,
    "FP64": torch.float64, "BF16": torch.bfloat16,
}  # fmt: skip
NUMPY_TYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": np.uint16,
}  # fmt: skip


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Tagged(torch.nn.Module):
    """A Tensor and a List[str] in, both out: TYPE_STRING tensors are forward()'s List[str]."""

    def forward(self, x: torch.Tensor, words: list[str]) -> tuple[torch.Tensor, list[str]]:
        return x * len(words), [w + "#" + str(i) for i, w in enumerate(words)]


class SumProd(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"prod": a * b, "sum": a + b}


class RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1)


class BatchProbe(torch.nn.Module):
    """Doubles its input and reports, per row, the batch size forward() saw."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen = torch.full([x.size(0), 1], x.size(0), dtype=torch.int32)
        return x * 2, seen


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Strict(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.size(-1) == 3, "the last dimension must be 3")
        return x


def tensor_cfg(kind: str, name: str, dtype: str, dims: list[int], extra: str = "") -> str:
    return f'{kind} [ {{ name: "{name}" data_type: TYPE_{dtype} dims: {dims} {extra} }} ]\n'


def save(repo: Path, name: str, module: torch.nn.Module, config: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


def build_repo(repo: Path) -> None:
    for name in ("mlp", "cnn"):
        shutil.copytree(EXAMPLES / name, repo / name)
    for dt in TORCH_TYPES:
        save(
            repo, f"double_{dt.lower()}", Double(),
            'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
            + tensor_cfg("input", "INPUT__0", dt, [-1])
            + tensor_cfg("output", "OUTPUT__0", dt, [-1]),
        )  # fmt: skip
    save(
        repo, "add_sub", AddSub(),
        'backend: "pytorch"\n'
        + 'input [ { name: "b" data_type: TYPE_INT64 dims: [ 3 ] }, { name: "a" data_type: TYPE_INT64 dims: [ 3 ] } ]\n'
        + 'output [ { name: "DIFF__1" data_type: TYPE_INT64 dims: [ 3 ] }, { name: "SUM__0" data_type: TYPE_INT64 dims: [ 3 ] } ]\n'
        + 'parameters [ { key: "INFERENCE_MODE" value: { string_value: "false" } }, '
        + '{ key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }, '
        + '{ key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } } ]\n',
    )  # fmt: skip
    save(
        repo, "sum_prod", SumProd(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        + 'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        + 'output [ { name: "sum" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "prod" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
    )  # fmt: skip
    save(
        repo, "reshaped", RowSum(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        + tensor_cfg("input", "INPUT__0", "FP32", [4], "reshape: { shape: [ 2, 2 ] }")
        + tensor_cfg("output", "OUTPUT__0", "FP32", [2]),
    )  # fmt: skip
    save(
        repo, "reshaped_any", RowSum(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        + tensor_cfg("input", "INPUT__0", "FP32", [-1], "reshape: { shape: [ 2, 2 ] }")
        + tensor_cfg("output", "OUTPUT__0", "FP32", [2]),
    )  # fmt: skip
    save(
        repo, "batched", BatchProbe(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        + tensor_cfg("input", "INPUT__0", "FP32", [-1])
        + 'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        + "dynamic_batching { max_queue_delay_microseconds: 20000 }\n",
    )  # fmt: skip
    save(repo, "identity", Identity(), None)  # config-less, no example_inputs: FP32, any shape
    save(repo, "strict", Strict(), None)
    # Broken ones: each must be unavailable with its reason, the rest stay up.
    (repo / "bad_file" / "1").mkdir(parents=True)
    (repo / "bad_file" / "1" / "model.pt").write_bytes(b"this is not a zip archive")
    save(
        repo, "bad_dtype", Double(),
        tensor_cfg("input", "INPUT__0", "FLOAT", [-1]) + tensor_cfg("output", "OUTPUT__0", "FP32", [-1]),
    )  # fmt: skip
    save(
        repo, "bad_names", AddSub(),
        'platform: "pytorch_libtorch"\n'
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "y" data_type: TYPE_FP32 dims: [ 3 ] },\n'
        + '        { name: "z" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        + tensor_cfg("output", "OUTPUT__0", "FP32", [3]),
    )  # fmt: skip
    # Triton's fallbacks: names that are neither all forward() arguments nor all NAME__index
    # (a mix here) go in the config's order, and so do outputs not all NAME__index.
    save(
        repo, "config_order", AddSub(),
        'platform: "pytorch_libtorch"\n'
        + 'input [ { name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "IN__1" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        + 'output [ { name: "sum" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "diff" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
    )  # fmt: skip
    # NAME__index read as Triton reads it: the index is what follows the first "__".
    save(
        repo, "first_delimiter", AddSub(),
        'platform: "pytorch_libtorch"\n'
        + 'input [ { name: "Y__1" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "X__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        + 'output [ { name: "D__1" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "S__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
    )  # fmt: skip
    save(
        repo, "bad_strings", Double(),
        tensor_cfg("input", "INPUT__0", "STRING", [2, 2]) + tensor_cfg("output", "OUTPUT__0", "STRING", [-1]),
    )  # fmt: skip
    save(
        repo, "tagged", Tagged(),
        tensor_cfg("input", "INPUT__0", "FP32", [-1]).replace(" ]\n", ", ")
        + '{ name: "INPUT__1" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        + tensor_cfg("output", "OUTPUT__0", "FP32", [-1]).replace(" ]\n", ", ")
        + '{ name: "OUTPUT__1" data_type: TYPE_STRING dims: [ -1 ] } ]\n',
    )  # fmt: skip
    save(
        repo, "bad_gpu", Double(),
        tensor_cfg("input", "INPUT__0", "FP32", [-1]) + tensor_cfg("output", "OUTPUT__0", "FP32", [-1])
        + "instance_group [ { kind: KIND_GPU gpus: [ 7 ] } ]\n",
    )  # fmt: skip
    save(
        repo, "bad_threads", Double(),
        tensor_cfg("input", "INPUT__0", "FP32", [-1]) + tensor_cfg("output", "OUTPUT__0", "FP32", [-1])
        + 'parameters [ { key: "INTER_OP_THREAD_COUNT" value: { string_value: "-1" } } ]\n',
    )  # fmt: skip


def batch_probe(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["INPUT0"]
    return {"OUTPUT0": x * 2, "SEEN": np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)}


PY_BATCHED = Model(
    "py_batched", batch_probe, max_batch_size=8, instances=2,
    inputs=[Tensor("INPUT0", "INT64", [-1, -1])],
    outputs=[Tensor("OUTPUT0", "INT64", [-1, -1]), Tensor("SEEN", "INT32", [-1, 1])],
    dynamic_batching=DynamicBatching(max_queue_delay_microseconds=20000),
)  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("torch_repo")
    build_repo(path)
    return path


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[openinfer.Server]:
    with openinfer.serve(repo, models=[PY_BATCHED], http_port=0, threads=2, log=False) as srv:
        yield srv


def infer(url: str, model: str, inputs: list[dict[str, Any]], **extra: Any) -> tuple[int, dict[str, Any]]:
    r = requests.post(f"{url}/v2/models/{model}/infer", json={"inputs": inputs, **extra}, timeout=60)
    return r.status_code, r.json()


def v2_input(name: str, datatype: str, array: np.ndarray) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}


def output(body: dict[str, Any], name: str, dtype: Any) -> np.ndarray:
    (out,) = [o for o in body["outputs"] if o["name"] == name]
    return np.array(out["data"], dtype=dtype).reshape(out["shape"])


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The in-process call as the examples' INTRA_OP_THREAD_COUNT 1 has the server make it:
    torch's kernels split work by thread count, and so round differently."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(before)


def test_examples_equal_the_in_process_call(server: openinfer.Server) -> None:
    rng = np.random.default_rng(0)
    mlp = torch.jit.load(str(EXAMPLES / "mlp" / "1" / "model.pt"))
    x = rng.standard_normal((5, 16), dtype=np.float32)
    status, body = infer(server.url, "mlp", [v2_input("INPUT__0", "FP32", x)])
    assert status == 200, body
    with one_thread():
        want = mlp(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(output(body, "OUTPUT__0", np.float32), want)

    cnn = torch.jit.load(str(EXAMPLES / "cnn" / "1" / "model.pt"))
    images = rng.standard_normal((3, 1, 28, 28), dtype=np.float32)
    status, body = infer(server.url, "cnn", [v2_input("image", "FP32", images)])
    assert status == 200, body
    with one_thread():
        want_dict = cnn(torch.from_numpy(images))
    for name in ("logits", "probabilities"):
        np.testing.assert_array_equal(output(body, name, np.float32), want_dict[name].numpy())


def test_binary_round_trip_is_exact(server: openinfer.Server) -> None:
    mlp = torch.jit.load(str(EXAMPLES / "mlp" / "1" / "model.pt"))
    x = np.random.default_rng(1).standard_normal((2, 16), dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 16],
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    r = requests.post(
        f"{server.url}/v2/models/mlp/infer", data=header + x.tobytes(), timeout=30,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    got = np.frombuffer(r.content[n:], dtype=np.float32).reshape(2, 4)
    with torch.inference_mode():
        np.testing.assert_array_equal(got, mlp(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("datatype", list(TORCH_TYPES))
def test_datatypes(server: openinfer.Server, datatype: str) -> None:
    rng = np.random.default_rng(2)
    if datatype == "BOOL":
        t = torch.from_numpy(rng.integers(0, 2, (2, 5)).astype(bool))
    elif datatype in ("FP16", "FP32", "FP64", "BF16"):  # JSON carries BF16 as its float values
        t = torch.from_numpy(rng.standard_normal((2, 5))).to(TORCH_TYPES[datatype])
    else:
        t = torch.from_numpy(rng.integers(0, 50, (2, 5))).to(TORCH_TYPES[datatype])
    wire = t.float().numpy() if datatype == "BF16" else t.numpy()
    status, body = infer(server.url, f"double_{datatype.lower()}", [v2_input("INPUT__0", datatype, wire)])
    assert status == 200, body
    want = Double()(t)
    if datatype == "BF16":  # shortest text that reads back as the same bfloat16
        got = torch.from_numpy(output(body, "OUTPUT__0", np.float32)).to(torch.bfloat16)
        assert torch.equal(got, want)
    else:
        np.testing.assert_array_equal(output(body, "OUTPUT__0", want.numpy().dtype), want.numpy())


def test_forward_argument_names_and_indexed_outputs(server: openinfer.Server) -> None:
    a, b = np.array([[5, 7, 9]]), np.array([[1, 2, 3]])
    status, body = infer(
        server.url, "add_sub", [v2_input("a", "INT64", a[0]), v2_input("b", "INT64", b[0])]
    )
    assert status == 200, body
    assert output(body, "SUM__0", np.int64).tolist() == [6, 9, 12]
    assert output(body, "DIFF__1", np.int64).tolist() == [4, 5, 6]
    # Only one output asked for, by name.
    status, body = infer(
        server.url, "add_sub", [v2_input("a", "INT64", a[0]), v2_input("b", "INT64", b[0])],
        outputs=[{"name": "DIFF__1"}],
    )  # fmt: skip
    assert status == 200 and [o["name"] for o in body["outputs"]] == ["DIFF__1"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_io_names_as_tritons_pytorch_backend_matches_them(server: openinfer.Server, protocol: str) -> None:
    """A mix of a forward() argument and NAME__index falls back to the config's order (Triton
    logs a warning and does the same); so do outputs not all NAME__index; NAME__index takes the
    index after the first "__", whatever the config's order. Through tritonclient."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")
    a, b = np.array([1, 2, 3], np.float32), np.array([10, 20, 40], np.float32)

    def run(model: str, names: tuple[str, str], outs: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
        inputs = [lib.InferInput(n, [3], "FP32") for n in names]
        for i, v in zip(inputs, (a, b)):
            i.set_data_from_numpy(v)
        result = client.infer(model, inputs)
        return result.as_numpy(outs[0]), result.as_numpy(outs[1])

    total, diff = run("config_order", ("a", "IN__1"), ("sum", "diff"))
    assert total.tolist() == [11, 22, 43] and diff.tolist() == [-9, -18, -37]
    # X__0 is forward()'s a, Y__1 its b; S__0 the sum, D__1 the difference.
    total, diff = run("first_delimiter", ("X__0", "Y__1"), ("S__0", "D__1"))
    assert total.tolist() == [11, 22, 43] and diff.tolist() == [-9, -18, -37]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_list_of_strings_in_and_out(server: openinfer.Server, protocol: str) -> None:
    """TYPE_STRING inputs reach forward() as List[str] and a List[str] result is a BYTES output,
    as in Triton's pytorch backend; empty strings, non-ASCII bytes and an empty list too."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")
    for words in (["ab", "", "caf\u00e9"], []):
        x = np.array([1.5, 2.0], np.float32)
        inputs = [lib.InferInput("INPUT__0", [2], "FP32"), lib.InferInput("INPUT__1", [len(words)], "BYTES")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.array([w.encode() for w in words], dtype=np.object_))
        result = client.infer("tagged", inputs)
        assert result.as_numpy("OUTPUT__0").tolist() == (x * len(words)).tolist()
        tags = result.as_numpy("OUTPUT__1")
        assert [t.decode() for t in tags.tolist()] == [w + "#" + str(i) for i, w in enumerate(words)]
        assert tags.shape == (len(words),)


def test_dict_outputs_and_reshape(server: openinfer.Server) -> None:
    a = np.array([[1.5, 2.0], [3.0, -1.0]], dtype=np.float32)
    b = np.array([[2.0, 0.5], [1.0, 4.0]], dtype=np.float32)
    status, body = infer(
        server.url, "sum_prod", [v2_input("INPUT__0", "FP32", a), v2_input("INPUT__1", "FP32", b)]
    )
    assert status == 200, body
    np.testing.assert_array_equal(output(body, "sum", np.float32), a + b)
    np.testing.assert_array_equal(output(body, "prod", np.float32), a * b)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)  # forward() sees [3, 2, 2]
    status, body = infer(server.url, "reshaped", [v2_input("INPUT__0", "FP32", x)])
    assert status == 200, body
    np.testing.assert_array_equal(output(body, "OUTPUT__0", np.float32), x.reshape(3, 2, 2).sum(-1))
    # A variable dimension reshaped to a fixed one: a request whose size does not fit is the
    # client's mistake.
    status, body = infer(server.url, "reshaped_any", [v2_input("INPUT__0", "FP32", x)])
    assert status == 200, body
    np.testing.assert_array_equal(output(body, "OUTPUT__0", np.float32), x.reshape(3, 2, 2).sum(-1))
    status, body = infer(server.url, "reshaped_any", [v2_input("INPUT__0", "FP32", x[:, :3])])
    assert status == 400 and "input 'INPUT__0': shape [3,3] cannot be reshaped to [3,2,2]" in body["error"], body


def test_configless(server: openinfer.Server) -> None:
    meta = requests.get(f"{server.url}/v2/models/cnn", timeout=10).json()
    assert meta["platform"] == "pytorch_torchscript"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
    meta = requests.get(f"{server.url}/v2/models/identity", timeout=10).json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1]}]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # any shape, returned as is
    status, body = infer(server.url, "identity", [v2_input("x", "FP32", x)])
    assert status == 200, body
    np.testing.assert_array_equal(output(body, "OUTPUT__0", np.float32), x)
    empty = np.zeros((0, 3), dtype=np.float32)  # zero-size tensors are not from_blob'd
    status, body = infer(server.url, "identity", [v2_input("x", "FP32", empty)])
    assert status == 200 and body["outputs"][0]["shape"] == [0, 3]


def test_model_errors_are_500_and_the_server_stays_up(server: openinfer.Server) -> None:
    status, body = infer(server.url, "strict", [v2_input("x", "FP32", np.zeros((2, 4), np.float32))])
    assert status == 500 and "the last dimension must be 3" in body["error"], body
    status, body = infer(server.url, "strict", [v2_input("x", "FP32", np.zeros((2, 3), np.float32))])
    assert status == 200
    status, body = infer(server.url, "mlp", [v2_input("INPUT__0", "FP32", np.zeros((1, 15), np.float32))])
    assert status == 400 and "expected shape [-1,16]" in body["error"]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad_file", "cannot load TorchScript module"),
        ("bad_dtype", "data_type must be one of"),
        ("bad_names", "input name(s) 'x', 'y', 'z' match no forward() argument (a, b) and do not follow the "
                      "NAME__index convention, so inputs go to forward() in the config's order: it declares 3 for 2"),
        ("bad_strings", "Triton only supports 1 dimensional List of String as input for 'INPUT__0' for model "
                        "'bad_strings'"),
        ("bad_gpu", "KIND_GPU"),
        ("bad_threads", "parameter INTER_OP_THREAD_COUNT must be a non-negative integer, got '-1'"),
    ],
)
def test_broken_models_are_unavailable_with_reason(server: openinfer.Server, model: str, reason: str) -> None:
    if model == "bad_gpu" and torch.cuda.is_available():
        reason = "instance_group names GPU 7"
    r = requests.get(f"{server.url}/v2/models/{model}/ready", timeout=10)
    assert r.status_code == 400 and r.json()["ready"] is False
    status, body = infer(server.url, model, [v2_input("INPUT__0", "FP32", np.zeros(3, np.float32))])
    assert status == 503 and reason in body["error"], body
    assert model in server.failed and reason in server.failed[model][1]
    assert "mlp" in server.models  # the others stay up
    assert requests.get(f"{server.url}/v2/models/mlp/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("model", ["batched", "py_batched"])
def test_dynamic_batching_gives_each_client_its_rows(server: openinfer.Server, model: str) -> None:
    torch_model = model == "batched"
    dt, np_dt, name = ("FP32", np.float32, "INPUT__0") if torch_model else ("INT64", np.int64, "INPUT0")
    outs = ("OUTPUT__0", "OUTPUT__1") if torch_model else ("OUTPUT0", "SEEN")

    def client(i: int) -> int:
        seen = 0
        with requests.Session() as s:
            for k in range(6):
                rows = 1 + (i + k) % 3
                width = 4 if (i + k) % 4 else 5  # two shapes in flight: only like ones batch
                x = (np.arange(rows * width, dtype=np_dt).reshape(rows, width) + 1000 * i + 100 * k)
                r = s.post(
                    f"{server.url}/v2/models/{model}/infer", timeout=60,
                    json={"inputs": [v2_input(name, dt, x)]},
                )  # fmt: skip
                assert r.status_code == 200, r.text
                body = r.json()
                np.testing.assert_array_equal(output(body, outs[0], np_dt), x * 2)
                batch = output(body, outs[1], np.int32)
                assert batch.shape == (rows, 1)
                seen = max(seen, int(batch.max()))
                assert rows <= seen <= 8
        return seen

    seen = concurrent(16, client)
    assert max(seen) > 3, f"no request was batched with another: {seen}"


def test_batched_shapes_never_mix(server: openinfer.Server) -> None:
    """Requests whose shapes past dimension 0 differ run in separate batches."""

    def client(i: int) -> None:
        width = 2 + i % 3
        x = np.full((1, width), i, dtype=np.float32)
        status, body = infer(server.url, "batched", [v2_input("INPUT__0", "FP32", x)])
        assert status == 200, body
        np.testing.assert_array_equal(output(body, "OUTPUT__0", np.float32), x * 2)

    concurrent(12, client)


def test_python_batching_model_validation() -> None:
    with pytest.raises(ValueError, match="first dimension is the batch"):
        Model("m", batch_probe, max_batch_size=4, dynamic_batching=True,
              inputs=[Tensor("INPUT0", "INT64", [3])], outputs=[Tensor("OUTPUT0", "INT64", [3])])  # fmt: skip


def test_shim_builds_into_a_keyed_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openinfer import _torch_build

    key = _torch_build.build_key()
    version = torch.__version__.split("+")[0]
    assert key.startswith(f"torch{version}-") and f"-cxxabi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}-" in key
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(_torch_build.ShimBuildError, match="no c\\+\\+ compiler found"):
        _torch_build.build(tmp_path / "out")


COLD_CACHE_CHILD = """
import sys, numpy as np, openinfer
with openinfer.serve(sys.argv[1], http_port=0, log=False) as srv:
    assert srv.failed == {}, srv.failed
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    out = openinfer.Client(srv.url).infer("mlp", {"INPUT__0": x})["OUTPUT__0"]
    np.save(sys.argv[2], out)
"""


def _package_without_shim(tmp_path: Path) -> Path:
    """A copy of the installed package with no prebuilt shim (as a wheel built without torch
    installs), and a repository with the mlp example; returns tmp_path/repo."""
    from openinfer import _torch_build

    installed = Path(openinfer.__file__).resolve().parent
    pkg = tmp_path / "pkg" / "openinfer"
    pkg.mkdir(parents=True)
    for f in [*installed.rglob("*.py"), *installed.glob("_core*.so")]:
        if "examples" in f.relative_to(installed).parts:
            continue  # package data, not the package's modules
        (pkg / f.relative_to(installed)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, pkg / f.relative_to(installed))
    src = _torch_build.source_dir()
    for rel in (*_torch_build.SHIM_SOURCES, *_torch_build.C_SOURCES):
        (pkg / "_csrc" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, pkg / "_csrc" / rel)
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "mlp", repo / "mlp")
    return repo


def test_cold_cache_compiles_the_shim_and_serves(tmp_path: Path) -> None:
    """A fresh install whose package has no prebuilt shim and whose cache is empty compiles
    the shim on first use, saying so in one line that names the cache, and serves a
    TorchScript model. Under make test-asan the child runs with the sanitizer preloaded,
    which the compiler must not inherit."""
    repo = _package_without_shim(tmp_path)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg"), "OPENINFER_CACHE_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-c", COLD_CACHE_CHILD, str(repo), str(tmp_path / "out.npy")],
                       env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    said = [line for line in r.stderr.splitlines() if "libtorch shim" in line]
    assert len(said) == 1 and "compiling the libtorch shim" in said[0], r.stderr[-4000:]
    assert str(cache / "torch_shim") in said[0] and torch.__version__ in said[0]
    assert list((cache / "torch_shim").glob("libopeninfer_torch-*.so")), "no shim in the cold cache"
    mlp = torch.jit.load(str(EXAMPLES / "mlp" / "1" / "model.pt"))
    with torch.inference_mode():
        want = mlp(torch.arange(16, dtype=torch.float32).reshape(1, 16)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-5, atol=1e-6)


NO_COMPILER_CHILD = """
import sys, openinfer
with openinfer.serve(sys.argv[1], http_port=0, log=False) as srv:
    print(srv.failed["mlp"])
    assert srv.failed.keys() == {"mlp"}, srv.failed
"""


def test_cold_cache_without_a_compiler_fails_the_model_clearly(tmp_path: Path) -> None:
    """No prebuilt shim, an empty cache and no C++ compiler on PATH: the TorchScript model
    fails to load with a message saying what to install, the server serves the rest, and
    nothing claims to be compiling."""
    repo = _package_without_shim(tmp_path)
    shutil.copytree(EXAMPLES / "simple", repo / "simple")
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(PYTHONPATH=str(tmp_path / "pkg"), OPENINFER_CACHE_DIR=str(tmp_path / "cache"), PATH=str(empty_path))
    r = subprocess.run([sys.executable, "-c", NO_COMPILER_CHILD, str(repo)],
                       env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    assert "no c++ compiler found (tried g++, c++, clang++)" in r.stdout, r.stdout
    assert "apt-get install g++" in r.stdout and "CXX" in r.stdout
    assert "compiling" not in r.stderr, r.stderr
    assert not list((tmp_path / "cache").glob("torch_shim/*.so"))


def test_child_environment_drops_only_the_sanitizers() -> None:
    from openinfer._torch_build import child_environment

    env = child_environment({
        "LD_PRELOAD": "/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so /opt/libjemalloc.so:libubsan.so.1",
        "ASAN_OPTIONS": "detect_leaks=1", "LSAN_OPTIONS": "x", "UBSAN_OPTIONS": "y", "PATH": "/bin",
    })  # fmt: skip
    assert env == {"LD_PRELOAD": "/opt/libjemalloc.so", "PATH": "/bin"}
    assert "LD_PRELOAD" not in child_environment({"LD_PRELOAD": "libasan.so"})


@pytest.mark.gpu
def test_cuda_instances_match_the_cpu_call(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    shutil.copytree(EXAMPLES / "mlp", tmp_path / "mlp")
    config = (tmp_path / "mlp" / "config.pbtxt").read_text().replace("KIND_CPU", "KIND_GPU gpus: [ 0 ]")
    (tmp_path / "mlp" / "config.pbtxt").write_text(config)
    mlp = torch.jit.load(str(EXAMPLES / "mlp" / "1" / "model.pt")).cuda()
    x = np.random.default_rng(3).standard_normal((8, 16), dtype=np.float32)
    with openinfer.serve(tmp_path, http_port=0, log=False) as srv:
        assert srv.failed == {}, srv.failed
        status, body = infer(srv.url, "mlp", [v2_input("INPUT__0", "FP32", x)])
        assert status == 200, body
        with torch.inference_mode():
            want = mlp(torch.from_numpy(x).cuda()).cpu().numpy()
        np.testing.assert_allclose(output(body, "OUTPUT__0", np.float32), want, rtol=1e-5, atol=1e-6)
        results = concurrent(8, lambda i: infer(srv.url, "mlp", [v2_input("INPUT__0", "FP32", x)]))
        for status, body in results:
            assert status == 200
            np.testing.assert_allclose(output(body, "OUTPUT__0", np.float32), want, rtol=1e-5, atol=1e-6)
