"""Repository scanning without a server: good and broken models, version policies, and
declarations from config.pbtxt or model.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from openinfer import Tensor, examples_path
from openinfer._repository.repository import LoadedModel, scan

ADD_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [
  {{ name: "A" data_type: TYPE_INT32 dims: [ 2 ] }},
  {{ name: "B" data_type: TYPE_INT32 dims: [ 2 ] }}
]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{extra}
"""

ADD_PY = """
def infer(inputs):
    return {"SUM": inputs["A"] + inputs["B"]}
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def add_model(
    repo: Path, name: str, versions: list[str], extra: str = "", config: bool = True
) -> None:
    if config:
        write(repo / name / "config.pbtxt", ADD_CONFIG.format(name=name, extra=extra))
    for version in versions:
        write(repo / name / version / "model.py", ADD_PY)


def by_key(loaded: list[LoadedModel]) -> dict[tuple[str, int | None], LoadedModel]:
    return {(m.name, m.version): m for m in loaded}


def test_good_model_from_config(tmp_path: Path) -> None:
    add_model(tmp_path, "add", ["1"], extra="instance_group [ { count: 3 kind: KIND_CPU } ]")
    (entry,) = scan(tmp_path)
    assert (entry.name, entry.version, entry.error) == ("add", 1, None)
    assert entry.config["backend"] == "python" and entry.config["max_batch_size"] == 4
    model = entry.model
    assert model is not None
    assert model.inputs == (Tensor("A", "INT32", (-1, 2)), Tensor("B", "INT32", (-1, 2)))
    assert model.outputs == (Tensor("SUM", "INT32", (-1, 2)),)
    assert (model.max_batch_size, model.version, model.instances, model.platform) == (
        4,
        1,
        3,
        "python",
    )
    a = np.array([[1, 2]], dtype=np.int32)
    np.testing.assert_array_equal(model.handler({"A": a, "B": a}, None, ("SUM",))["SUM"], [[2, 4]])


def test_without_batching_dims_are_the_full_shape(tmp_path: Path) -> None:
    write(
        tmp_path / "m" / "config.pbtxt",
        'input { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] }\n'
        'output { name: "Y" data_type: TYPE_STRING dims: [ 1 ] }',
    )
    write(tmp_path / "m" / "1" / "model.py", ADD_PY)
    (entry,) = scan(tmp_path)
    assert entry.model is not None and entry.model.max_batch_size == 0
    assert entry.model.inputs == (Tensor("X", "FP32", (-1, 3)),)
    assert entry.model.outputs == (Tensor("Y", "BYTES", (1,)),)


def test_declaration_from_model_py_without_config(tmp_path: Path) -> None:
    write(
        tmp_path / "noconf" / "2" / "model.py",
        """
        from openinfer import Tensor

        MAX_BATCH_SIZE = 16
        INPUTS = [Tensor("X", "FP32", [-1, 3])]
        OUTPUTS = [Tensor("Y", "FP32", [-1, 3])]

        def infer(inputs, parameters):
            return {"Y": inputs["X"] * parameters.get("scale", 1)}
        """,
    )
    (entry,) = scan(tmp_path)
    assert entry.error is None and entry.config == {}
    model = entry.model
    assert model is not None and (model.name, model.version, model.max_batch_size) == (
        "noconf",
        2,
        16,
    )
    assert model.inputs == (Tensor("X", "FP32", (-1, 3)),)
    x = np.ones((1, 3), dtype=np.float32)
    np.testing.assert_array_equal(model.handler({"X": x}, b'{"scale": 3}', ("Y",))["Y"], x * 3)


def test_model_py_declaration_errors_are_reported(tmp_path: Path) -> None:
    write(
        tmp_path / "nobatch" / "1" / "model.py",
        """
        from openinfer import Tensor
        MAX_BATCH_SIZE = 4
        INPUTS = [Tensor("X", "FP32", [3])]
        OUTPUTS = [Tensor("Y", "FP32", [-1, 3])]
        def infer(inputs):
            return {}
        """,
    )
    write(tmp_path / "undeclared" / "1" / "model.py", ADD_PY)
    loaded = by_key(scan(tmp_path))
    assert loaded["nobatch", 1].model is None
    assert "model.py: model 'nobatch': input 'X' has shape [3]" in str(loaded["nobatch", 1].error)
    assert "no inputs or outputs declared" in str(loaded["undeclared", 1].error)


def test_broken_models_fail_alone(tmp_path: Path) -> None:
    add_model(tmp_path, "good", ["1"])
    add_model(tmp_path, "syntax", ["1"])
    write(tmp_path / "syntax" / "1" / "model.py", "def infer(inputs):\n    return {\n")
    add_model(tmp_path, "noinfer", ["1"])
    write(tmp_path / "noinfer" / "1" / "model.py", "def predict(inputs):\n    return {}\n")
    add_model(tmp_path, "raises", ["1"])
    write(tmp_path / "raises" / "1" / "model.py", "import sys\nraise RuntimeError('no GPU here')\n")
    add_model(tmp_path, "exits", ["1"])
    write(tmp_path / "exits" / "1" / "model.py", "import sys\nsys.exit(3)\n")
    add_model(tmp_path, "badconfig", ["1"])
    write(tmp_path / "badconfig" / "config.pbtxt", "max_batch_size: 8\ninput [ { name: 'x' }")
    add_model(tmp_path, "misnamed", ["1"])
    write(tmp_path / "misnamed" / "config.pbtxt", 'name: "other"')
    add_model(tmp_path, "plan", ["1"], extra="")
    write(tmp_path / "plan" / "config.pbtxt", 'platform: "tensorrt_plan"')
    (tmp_path / "noversions").mkdir()
    add_model(tmp_path, "empty", [])
    (tmp_path / "empty" / "1").mkdir()

    modules_before = set(sys.modules)  # an earlier test's model "raises" may be imported still
    loaded = by_key(scan(tmp_path))
    assert loaded["good", 1].model is not None
    errors = {key: entry.error or "" for key, entry in loaded.items() if entry.model is None}
    assert errors["syntax", 1].endswith("syntax/1/model.py:2: SyntaxError: '{' was never closed")
    assert errors["noinfer", 1].endswith("noinfer/1/model.py defines no infer(inputs) function")
    assert errors["raises", 1].endswith("raises/1/model.py:2: RuntimeError: no GPU here")
    assert errors["exits", 1].endswith("exits/1/model.py:2: SystemExit: 3")
    assert errors["badconfig", None].endswith(
        "badconfig/config.pbtxt:2:22: expected ',' or ']' in the list of 'input', got end of file"
    )
    assert "name 'other' differs from the directory name 'misnamed'" in errors["misnamed", None]
    assert errors["plan", 1].startswith("backend 'tensorrt_plan' is not supported")
    assert errors["noversions", None].endswith(
        "noversions has no numeric version directory (e.g. noversions/1/)"
    )
    assert errors["empty", 1].endswith("empty/1 holds no model.py, model.pt, model.pt2 or model.onnx")
    assert len(loaded) == 10
    imported = " ".join(set(sys.modules) - modules_before)
    assert "_openinfer_model_good_v1_" in imported and "_openinfer_model_raises_v1_" not in imported  # failed ones dropped


def test_broken_torchscript_is_reported(tmp_path: Path) -> None:
    (tmp_path / "resnet" / "1").mkdir(parents=True)
    (tmp_path / "resnet" / "1" / "model.pt").write_bytes(b"PK\x03\x04")
    write(tmp_path / "traced" / "config.pbtxt", 'platform: "pytorch_libtorch"')
    (tmp_path / "traced" / "1").mkdir()
    (tmp_path / "traced" / "1" / "model.pt").write_bytes(b"PK\x03\x04")
    loaded = scan(tmp_path)
    assert [(m.name, m.version, m.model) for m in loaded] == [("resnet", 1, None), ("traced", 1, None)]
    for m in loaded:
        assert m.error is not None
        assert m.error.startswith("torch unavailable: ") or (
            m.error.startswith(f"cannot load TorchScript module {tmp_path / m.name / '1' / 'model.pt'}: ")
        ), m.error


def test_default_model_filename(tmp_path: Path) -> None:
    add_model(tmp_path, "custom", [], extra='default_model_filename: "add.py"')
    write(tmp_path / "custom" / "1" / "add.py", ADD_PY)
    add_model(tmp_path, "missing", ["1"], extra='default_model_filename: "other.py"')
    loaded = by_key(scan(tmp_path))
    assert loaded["custom", 1].model is not None
    assert str(loaded["missing", 1].error).endswith(
        "missing/1/other.py (default_model_filename) does not exist"
    )


@pytest.mark.parametrize(
    ("policy", "served", "failed"),
    [
        ("", [10], []),  # Triton's default: the latest version only
        ("version_policy: { latest: { num_versions: 2 } }", [3, 10], []),
        ("version_policy: { latest: { num_versions: 9 } }", [1, 3, 10], []),
        ("version_policy: { all {} }", [1, 3, 10], []),
        ("version_policy: { specific: { versions: [1, 4, 10] } }", [1, 10], [4]),
    ],
)
def test_version_policies(
    tmp_path: Path, policy: str, served: list[int], failed: list[int]
) -> None:
    add_model(tmp_path, "add", ["1", "3", "10", "notes", "2a"], extra=policy)
    loaded = scan(tmp_path)
    assert [m.version for m in loaded if m.model is not None] == served
    missing = [m for m in loaded if m.model is None]
    assert [m.version for m in missing] == failed
    for m in missing:
        directory = tmp_path / "add" / str(m.version)
        assert m.error == (
            f"version {m.version} is listed in version_policy but {directory} does not exist"
        )
    assert [m.version for m in loaded] == sorted(served + failed)


def test_non_model_entries_are_ignored(tmp_path: Path) -> None:
    add_model(tmp_path, "add", ["1"])
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / ".git" / "1").mkdir(parents=True)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "add" / "1" / "__pycache__").mkdir()
    (tmp_path / "add" / "notes.txt").write_text("")
    assert [(m.name, m.version) for m in scan(tmp_path)] == [("add", 1)]


def test_model_files_never_collide(tmp_path: Path) -> None:
    for name in ("one", "two"):
        add_model(tmp_path, name, [])
        write(
            tmp_path / name / "1" / "model.py",
            f"""
            NAME = "{name}"
            def infer(inputs):
                return {{"SUM": NAME}}
            """,
        )
    loaded = [m.model for m in scan(tmp_path) + scan(tmp_path) if m.model]
    assert [m.handler({}, None, ("SUM",))["SUM"] for m in loaded] == ["one", "two", "one", "two"]
    modules = {m.fn.__module__ for m in loaded}
    assert len(modules) == 4 and all(name in sys.modules for name in modules)


def test_scan_rejects_a_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        scan(tmp_path / "nope")


def test_example_repository() -> None:
    loaded = [
        m for m in scan(examples_path(), optional_torch=True)
        if m.name not in ("cnn", "cnn_pt2", "mlp", "mlp_onnx", "mlp_pt2", "tiny_llama")
    ]
    assert [(m.name, m.version, m.error) for m in loaded] == [
        ("identity_fp32", 1, None),
        ("mlp_ensemble", 1, None),
        ("mlp_preprocess", 1, None),
        ("repeat_int32", 1, None),
        ("simple", 1, None),
        ("simple_dyna_sequence", 1, None),
        ("simple_identity", 1, None),
        ("simple_int8", 1, None),
        ("simple_sequence", 1, None),
        ("simple_string", 1, None),
        ("simple_string_dyna_sequence", 1, None),
        ("tiny_gen", 1, None),
        ("toy_llm", 1, None),
    ]
    models = {m.name: m.model for m in loaded if m.model}
    assert [name for name, m in models.items() if m.decoupled] == ["repeat_int32", "tiny_gen", "toy_llm"]
    assert models["identity_fp32"].inputs == (Tensor("INPUT0", "FP32", None),)  # any shape
    assert models["simple"].inputs[0] == Tensor("INPUT0", "INT32", (-1, 16))
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    out = models["simple"].handler({"INPUT0": a, "INPUT1": b}, None, ("OUTPUT0", "OUTPUT1"))
    np.testing.assert_array_equal(out["OUTPUT0"], a + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], a - 1)
    strings = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    ones = np.array([[b"1"] * 16], dtype=object)
    out = models["simple_string"].handler(
        {"INPUT0": strings, "INPUT1": ones}, None, ("OUTPUT0", "OUTPUT1")
    )
    assert out["OUTPUT0"].tolist() == [[str(i + 1).encode() for i in range(16)]]  # type: ignore[attr-defined]
    assert out["OUTPUT1"].tolist() == [[str(i - 1).encode() for i in range(16)]]  # type: ignore[attr-defined]
    x = np.linspace(0, 1, 6, dtype=np.float32).reshape(1, 2, 3)
    assert models["identity_fp32"].handler({"INPUT0": x}, None, ("OUTPUT0",))["OUTPUT0"] is x


REQUIRING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


def _requiring(root: Path, modules: str) -> Path:
    (root / "needy" / "1").mkdir(parents=True)
    (root / "needy" / "1" / "model.py").write_text(REQUIRING_MODEL)
    (root / "needy" / "config.pbtxt").write_text(
        'backend: "python"\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        f'parameters {{ key: "openinfer_requires" value {{ string_value: "{modules}" }} }}\n'
    )
    return root


def test_a_model_whose_required_modules_are_missing_fails_naming_them(tmp_path: Path) -> None:
    [entry] = scan(_requiring(tmp_path, "numpy, no_such_module_a,no_such_module_b"))
    assert entry.model is None
    assert entry.error == (
        "modules unavailable: model needy imports no_such_module_a, no_such_module_b, which are not installed"
    )
    [entry] = scan(_requiring(tmp_path / "present", "numpy,json"))
    assert entry.error is None and entry.model is not None


def test_an_example_whose_modules_are_missing_is_left_out_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    names = {m.name for m in scan(examples_path(), optional_torch=True)}
    assert "tiny_llama" not in names and "toy_llm" in names
    assert (
        "example tiny_llama is not served: model tiny_llama imports transformers, which is not installed "
        "(pip install 'openinfer[llm]' to serve it)"
    ) in caplog.messages


def test_import_does_not_load_torch(tmp_path: Path) -> None:
    # Python models only: describing a TorchScript model does need torch. (The extension is
    # loaded: pb_utils' Tensor and InferenceResponse, which any model.py may import, are built on
    # its types.)
    for name in ("simple", "identity_fp32"):
        (tmp_path / name).symlink_to(examples_path() / name)
    code = (
        "import sys, openinfer, openinfer._repository.repository, openinfer.cli, openinfer.testing;"
        f"openinfer._repository.repository.scan({str(tmp_path)!r});"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_torchscript_without_torch(tmp_path: Path) -> None:
    """Where torch cannot be imported, a TorchScript model fails with that reason, and the
    bundled examples serve their Python models only (and are ready); the PT2 examples are left
    out with one line each saying why."""
    (tmp_path / "net" / "1").mkdir(parents=True)
    (tmp_path / "net" / "1" / "model.pt").write_bytes(b"PK\x03\x04")
    code = f"""
import sys
sys.modules["torch"] = None  # import torch raises ImportError
import openinfer
from openinfer._repository.repository import scan
(entry,) = scan({str(tmp_path)!r})
assert entry.model is None and entry.error.startswith("torch unavailable: serving TorchScript models needs torch"), entry
with openinfer.serve(http_port=0, log=False) as server:
    assert set(server.models) - {{"mlp_onnx"}} == {{"identity_fp32", "mlp_preprocess", "repeat_int32", "simple", "simple_string",
                                                 "simple_identity", "simple_int8",
                                                 "simple_sequence", "simple_dyna_sequence",
                                                 "simple_string_dyna_sequence", "tiny_gen", "toy_llm"}}, server.models
    assert server.failed == {{}}, server.failed
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    said = sorted(line for line in r.stderr.splitlines() if "_pt2" in line)
    assert [line.split(" is not served: ")[0] for line in said] == ["example cnn_pt2", "example mlp_pt2"], said
    assert all("torch cannot be imported" in line for line in said), said


def test_a_fault_in_loading_one_model_fails_that_model_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """An exception no loader expected (a fault of the server's own, not a model's error) fails
    that version, logged with its traceback; the others load, and serve() starts."""
    import openinfer
    from openinfer._repository import repository

    add_model(tmp_path, "good", ["1"])
    add_model(tmp_path, "faulty", ["1"])
    real = repository._load_version

    def load_version(name: str, *args: object) -> object:
        if name == "faulty":
            raise AttributeError("'str' object has no attribute 'get'")
        return real(name, *args)

    monkeypatch.setattr(repository, "_load_version", load_version)
    loaded = by_key(scan(tmp_path))
    assert loaded["good", 1].model is not None
    assert loaded["faulty", 1].error == "failed to load: AttributeError: 'str' object has no attribute 'get'"
    assert "loading version 1 of model 'faulty' failed unexpectedly" in caplog.text
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, metrics_port=None, log=False) as server:
        assert set(server.failed) == {"faulty"}
        import requests

        assert requests.get(f"{server.url}/v2/models/good/ready", timeout=30).status_code == 200
