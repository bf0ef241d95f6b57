"""PyTorch 2 AOTInductor packages (model.pt2, platform torch_aoti) through the libtorch shim,
over real sockets with tritonclient (HTTP and gRPC): Triton's torch_aoti datatypes, both of
Triton's naming conventions (INPUT__i/OUTPUT__i and ARGS/KWARGS/RESULT from the call spec),
config-less and configured serving, a variable dimension, two instances, dynamic batching,
sequence batching with implicit state, bad requests (400 naming the input), bad packages (the
load fails with the reason while the rest serves), and CUDA (`gpu`).

Compiling a package takes tens of seconds, so the packages are compiled once per session
into a temporary directory and copied into each test's repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer

from conftest import concurrent

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs it)")
if shutil.which("g++") is None and shutil.which("c++") is None:
    pytest.skip("compiling a PT2 package needs a C++ compiler", allow_module_level=True)

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from aoti_models import DTYPES, NUMPY, Typed, typed_inputs  # noqa: E402


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The packages, compiled once for the session (each up to a minute on 2 cores), in
    a child process without the sanitizer runtime of an ASan run (which the compiler it starts
    would inherit, and fail under LeakSanitizer)."""
    from openinfer._torch_build import child_environment

    out = tmp_path_factory.mktemp("pt2")
    script = Path(__file__).resolve().parent / "aoti_models.py"
    done = subprocess.run([sys.executable, str(script), str(out)], env=child_environment(), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return {name: out / f"{name}.pt2" for name in ("typed", "named", "acc", "complex")}


def put(repo: Path, name: str, package: Path, config: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(package, repo / name / "1" / "model.pt2")
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


def typed_config(extra: str = "", max_batch_size: int = 0) -> str:
    batch = [] if max_batch_size else [-1]
    ins = ", ".join(
        f'{{ name: "INPUT__{i}" data_type: TYPE_{t} dims: {[*batch, 4 if t == "FP32" else 3]} }}'
        for i, t in enumerate(DTYPES)
    )
    outs = ", ".join(
        f'{{ name: "OUTPUT__{i}" data_type: TYPE_{t} dims: {[*batch, 3]} }}' for i, t in enumerate(DTYPES)
    )
    return (
        f'platform: "torch_aoti"\nmax_batch_size: {max_batch_size}\ninput [ {ins} ]\noutput [ {outs} ]\n'
        + extra
    )


NAMED_FORWARD = """\
    backend: "pytorch"
    platform: "torch_aoti"
    input [
      { name: "ARGS[0]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "ARGS[1]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "ARGS[2][keyA]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "ARGS[2][key2]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "KWARGS[kwarg1]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "KWARGS[kw_arg2]" data_type: TYPE_FP32 dims: [ 1, 4 ] }
    ]
    output [
      { name: "RESULT[AAA]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[BBB][0]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[BBB][1]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[CCC][keyA]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[CCC][key2]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[DDD][KA]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[DDD][KB]" data_type: TYPE_FP32 dims: [ 1, 4 ] },
      { name: "RESULT[ZZZ]" data_type: TYPE_FP32 dims: [ 1, 4 ] }
    ]
"""

ACC_CONFIG = """\
    platform: "torch_aoti"
    max_batch_size: 8
    sequence_batching {
      control_input [ { name: "INPUT__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
      state [ { input_name: "INPUT__2" output_name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
    }
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("aoti_repo")
    put(repo, "typed_auto", packages["typed"], None)
    put(repo, "typed", packages["typed"], typed_config('instance_group [ { count: 2 kind: KIND_CPU } ]\n'))
    put(repo, "typed_batched", packages["typed"], typed_config(
        "dynamic_batching { max_queue_delay_microseconds: 5000000 }\n", max_batch_size=8))  # fmt: skip
    put(repo, "named", packages["named"], NAMED_FORWARD)
    put(repo, "named_auto", packages["named"], None)
    put(repo, "acc", packages["acc"], ACC_CONFIG)
    # Broken ones: the rest of the repository serves.
    put(repo, "not_a_zip", packages["named"], None)
    (repo / "not_a_zip" / "1" / "model.pt2").write_bytes(b"definitely not a zip archive")
    put(repo, "bad_library", packages["named"], None)
    _corrupt_library(repo / "bad_library" / "1" / "model.pt2")
    put(repo, "fixed_batch", packages["named"], NAMED_FORWARD + "max_batch_size: 4\n")
    put(repo, "unknown_input", packages["named"], NAMED_FORWARD.replace("KWARGS[kw_arg2]", "KWARGS[nope]"))
    put(repo, "wrong_dtype", packages["typed"], typed_config().replace("TYPE_INT16", "TYPE_INT32", 1))
    put(repo, "cuda_on_cpu", packages["named"], None)
    put(repo, "complex_output", packages["complex"], None)
    _retarget(repo / "cuda_on_cpu" / "1" / "model.pt2", "cuda")
    with openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False) as srv:
        yield srv


def _rewrite(path: Path, change: Any) -> None:
    """Rewrites the zip at `path`, passing each member's (name, bytes) through `change`."""
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members:
            z.writestr(name, change(name, data))


def _corrupt_library(path: Path) -> None:
    _rewrite(path, lambda n, d: b"\x7fELF garbage" if n.endswith(".so") else d)


def _retarget(path: Path, device: str) -> None:
    """The package's metadata says it was compiled for `device`."""
    _rewrite(path, lambda n, d: d.replace(b'"cpu"', f'"{device}"'.encode()) if n.endswith("metadata.json") else d)


def clients(srv: openinfer.Server) -> list[Any]:
    return [
        (httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")),
        (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")),
    ]


def call(mod: Any, client: Any, model: str, arrays: dict[str, tuple[str, np.ndarray]], **kw: Any) -> Any:
    inputs = []
    for name, (dtype, a) in arrays.items():
        i = mod.InferInput(name, list(a.shape), dtype)
        i.set_data_from_numpy(a)
        inputs.append(i)
    return client.infer(model, inputs, **kw)


def typed_reference(arrays: list[np.ndarray]) -> list[np.ndarray]:
    model = Typed().eval()
    with torch.no_grad():
        return [t.numpy() for t in model(*(torch.from_numpy(a) for a in arrays))]


@pytest.mark.parametrize("model", ["typed_auto", "typed"])
def test_every_datatype_over_http_and_grpc(server: openinfer.Server, model: str) -> None:
    arrays = typed_inputs(3, seed=1)
    want = typed_reference(arrays)
    for mod, client in clients(server):
        try:
            result = call(mod, client, model, {f"INPUT__{i}": (t, a) for i, (t, a) in enumerate(zip(DTYPES, arrays))})
            for i, t in enumerate(DTYPES):
                got = result.as_numpy(f"OUTPUT__{i}")
                assert got.dtype == NUMPY[t]
                if t == "FP32":
                    np.testing.assert_allclose(got, want[i], rtol=1e-5, atol=1e-6)
                else:
                    np.testing.assert_array_equal(got, want[i])
        finally:
            client.close()


def test_configless_reports_the_package_interface(server: openinfer.Server) -> None:
    meta = requests.get(f"{server.url}/v2/models/typed_auto", timeout=10).json()
    assert meta["platform"] == "torch_aoti"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        (f"INPUT__{i}", t, [-1, 4 if t == "FP32" else 3]) for i, t in enumerate(DTYPES)
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        (f"OUTPUT__{i}", t, [-1, 3]) for i, t in enumerate(DTYPES)
    ]
    config = requests.get(f"{server.url}/v2/models/typed_auto/config", timeout=10).json()
    assert config["platform"] == "torch_aoti" and config["backend"] == "pytorch"
    assert config["default_model_filename"] == "model.pt2"
    assert [i["name"] for i in config["input"]] == [f"INPUT__{i}" for i in range(6)]
    # A package whose call spec has dicts and kwargs: flattened in call-spec order.
    meta = requests.get(f"{server.url}/v2/models/named_auto", timeout=10).json()
    assert [t["name"] for t in meta["inputs"]] == [f"INPUT__{i}" for i in range(6)]
    assert [t["shape"] for t in meta["outputs"]] == [[1, 4]] * 8


def test_forward_based_names(server: openinfer.Server) -> None:
    rng = np.random.default_rng(2)
    x = {n: rng.standard_normal((1, 4)).astype(np.float32) for n in ("h", "v", "ka", "k2", "kw1", "kw2")}
    arrays = {
        "ARGS[0]": x["h"], "ARGS[1]": x["v"], "ARGS[2][keyA]": x["ka"], "ARGS[2][key2]": x["k2"],
        "KWARGS[kwarg1]": x["kw1"], "KWARGS[kw_arg2]": x["kw2"],
    }  # fmt: skip
    want = {
        "RESULT[AAA]": x["h"] + x["v"], "RESULT[ZZZ]": x["h"] - x["v"], "RESULT[BBB][0]": x["h"],
        "RESULT[BBB][1]": x["v"], "RESULT[CCC][keyA]": x["ka"], "RESULT[CCC][key2]": x["k2"],
        "RESULT[DDD][KA]": x["kw1"], "RESULT[DDD][KB]": x["kw2"],
    }  # fmt: skip
    for mod, client in clients(server):
        try:
            result = call(mod, client, "named", {k: ("FP32", a) for k, a in arrays.items()})
            for name, value in want.items():
                np.testing.assert_array_equal(result.as_numpy(name), value, err_msg=name)
        finally:
            client.close()
    # The same package config-less: ordinal names in call-spec order (dict in insertion order).
    ordinal = {f"INPUT__{i}": ("FP32", a) for i, a in enumerate(arrays.values())}
    mod, client = clients(server)[0]
    result = call(mod, client, "named_auto", ordinal)
    order = ["RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[CCC][keyA]",
             "RESULT[CCC][key2]", "RESULT[DDD][KA]", "RESULT[DDD][KB]"]  # fmt: skip
    for i, name in enumerate(order):
        np.testing.assert_array_equal(result.as_numpy(f"OUTPUT__{i}"), want[name], err_msg=name)


def test_bad_requests_are_400_naming_the_input(server: openinfer.Server) -> None:
    arrays = typed_inputs(2)
    good = {f"INPUT__{i}": (t, a) for i, (t, a) in enumerate(zip(DTYPES, arrays))}

    def post(inputs: dict[str, tuple[str, np.ndarray]]) -> tuple[int, str]:
        body = {"inputs": [{"name": n, "datatype": t, "shape": list(a.shape), "data": a.ravel().tolist()}
                           for n, (t, a) in inputs.items()]}  # fmt: skip
        r = requests.post(f"{server.url}/v2/models/typed_auto/infer", json=body, timeout=30)
        return r.status_code, r.json().get("error", "")

    status, error = post({**good, "INPUT__2": ("INT64", arrays[2].astype(np.int64))})
    assert status == 400 and "INPUT__2" in error and "INT32" in error and "INT64" in error, error
    status, error = post({**good, "INPUT__5": ("FP32", np.zeros((2, 5), np.float32))})
    assert status == 400 and "INPUT__5" in error and "[-1,4]" in error, error
    status, error = post({k: v for k, v in good.items() if k != "INPUT__3"})
    assert status == 400 and "INPUT__3" in error, error
    # Inputs that share the package's dynamic batch size must agree on it.
    status, error = post({**good, "INPUT__1": ("INT16", np.zeros((3, 3), np.int16))})
    assert status == 400 and "INPUT__0" in error and "INPUT__1" in error, error
    assert post(good)[0] == 200  # the server stays up and serves the model


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("not_a_zip", "cannot load PT2 package"),
        ("bad_library", "cannot load PT2 package"),
        ("fixed_batch", "was exported with a fixed dimension 0 of 1"),
        ("unknown_input", 'Input "KWARGS[nope]" is not found in model input map'),
        ("wrong_dtype", "input 'INPUT__1' is INT32 in config.pbtxt, but the package takes INT16"),
        ("cuda_on_cpu", "the package was compiled for CUDA"),
        ("complex_output", "output OUTPUT__1 has a torch dtype with no V2 datatype"),
    ],
)
def test_bad_packages_fail_the_load_with_the_reason(server: openinfer.Server, model: str, reason: str) -> None:
    assert model in server.failed and reason in server.failed[model][1], server.failed.get(model)
    assert requests.get(f"{server.url}/v2/models/{model}/ready", timeout=10).status_code == 400
    assert requests.get(f"{server.url}/v2/models/typed/ready", timeout=10).status_code == 200


def test_bad_library_reports_the_loader_reason(server: openinfer.Server) -> None:
    reason = server.failed["bad_library"][1]
    assert ".so" in reason, reason  # the loader's dlopen error names the library it could not map


def test_two_instances_serve_concurrent_clients(server: openinfer.Server) -> None:
    # The references before the clients start: Typed() seeds torch's global generator and draws
    # its weights from it, which threads building one each at once would interleave.
    given = [typed_inputs(1 + i % 3, seed=10 + i) for i in range(6)]
    wants = [typed_reference(arrays) for arrays in given]

    def client(i: int) -> None:
        arrays, want = given[i], wants[i]
        mod, c = clients(server)[i % 2]
        try:
            for _ in range(5):
                result = call(mod, c, "typed", {f"INPUT__{k}": (t, a) for k, (t, a) in enumerate(zip(DTYPES, arrays))})
                np.testing.assert_array_equal(result.as_numpy("OUTPUT__3"), want[3])
                np.testing.assert_allclose(result.as_numpy("OUTPUT__5"), want[5], rtol=1e-5, atol=1e-6)
        finally:
            c.close()

    concurrent(6, client)


def test_dynamic_batching_rows_equal_unbatched_calls(server: openinfer.Server) -> None:
    # 8 rows in all, the model's max_batch_size: the batch goes once all have come, however
    # slowly they came (within the 5 s queue delay), not when a short delay has passed.
    per_client = [typed_inputs(rows, seed=100 + i) for i, rows in enumerate((1, 2, 1, 2, 1, 1))]
    mod, c = clients(server)[0]
    alone = []
    for arrays in per_client:  # one at a time: each call is its own batch
        result = call(mod, c, "typed_auto", {f"INPUT__{k}": (t, a) for k, (t, a) in enumerate(zip(DTYPES, arrays))})
        alone.append([result.as_numpy(f"OUTPUT__{k}") for k in range(6)])
    c.close()
    before = requests.get(f"{server.url}/v2/models/typed_batched/stats", timeout=10).json()["model_stats"][0]

    def client(i: int) -> list[np.ndarray]:
        mod, c = clients(server)[i % 2]
        try:
            inputs = {f"INPUT__{k}": (t, a) for k, (t, a) in enumerate(zip(DTYPES, per_client[i]))}
            result = call(mod, c, "typed_batched", inputs)
            return [result.as_numpy(f"OUTPUT__{k}") for k in range(6)]
        finally:
            c.close()

    batched = concurrent(6, client)
    for i in range(6):
        for k in range(6):
            np.testing.assert_allclose(batched[i][k], alone[i][k], rtol=1e-6, atol=1e-6)
    after = requests.get(f"{server.url}/v2/models/typed_batched/stats", timeout=10).json()["model_stats"][0]
    runs = after["execution_count"] - before["execution_count"]
    served = after["inference_count"] - before["inference_count"]
    assert served == sum(a[0].shape[0] for a in per_client)
    assert runs < 6, (runs, served)  # some requests shared a call


def test_sequence_with_implicit_state_and_a_variable_dimension(server: openinfer.Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        sums = {7: 0.0, 8: 0.0}
        steps = [(7, [1.0]), (8, [10.0, 1.0]), (7, [2.0, 3.0, 4.0]), (8, [20.0]), (7, [3.0])]
        for step, (seq, values) in enumerate(steps):
            x = np.array([values], np.float32)
            i = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            result = client.infer("acc", [i], sequence_id=seq, sequence_start=step < 2, sequence_end=step >= 3)
            sums[seq] += sum(values)
            assert float(result.as_numpy("OUTPUT__0")[0, 0]) == sums[seq]
    finally:
        client.close()


@pytest.mark.gpu
def test_cuda_package_runs_on_the_instance_gpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = Typed().eval().cuda()
    arrays = typed_inputs(2)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with torch.no_grad():
        ep = torch.export.export(model, tuple(torch.from_numpy(a).cuda() for a in arrays),
                                 dynamic_shapes=tuple({0: batch} for _ in DTYPES))  # fmt: skip
        package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "typed.pt2"))
        want = [t.cpu().numpy() for t in model(*(torch.from_numpy(a).cuda() for a in arrays))]
    gpu = torch.cuda.device_count() - 1
    group = f"instance_group [ {{ kind: KIND_GPU gpus: [ {gpu} ] }} ]\n"
    put(tmp_path / "repo", "typed", Path(package), typed_config(group))
    with openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=None, log=False) as srv:
        assert not srv.failed, srv.failed
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
        inputs = {f"INPUT__{k}": (t, a) for k, (t, a) in enumerate(zip(DTYPES, arrays))}
        result = call(httpclient, client, "typed", inputs)
        client.close()
        for k in range(6):
            np.testing.assert_allclose(result.as_numpy(f"OUTPUT__{k}"), want[k], rtol=1e-3, atol=1e-3)
