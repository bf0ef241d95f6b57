"""A Triton `model.py` behaves as it does in Triton (issue 39): what model.py imports from beside
it, optional inputs, response parameters, outputs checked by name, over tritonclient HTTP and gRPC."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http

PROLOGUE = "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"

# A model that says which of its helper modules it sees: `utils` (version folder for `first`,
# model folder for `second`; in worker processes for `in_workers`), a package `helpers`, a relative import, and a lazy import in execute.
SIBLINGS_MODEL = PROLOGUE + textwrap.dedent(
    """
    import utils
    from helpers.names import NAME as PACKAGE_NAME
    from . import near

    class TritonPythonModel:
        def initialize(self, args):
            from utils import NAME
            self.at_init = NAME

        def execute(self, requests):
            import utils as later
            seen = [utils.NAME, self.at_init, later.NAME, PACKAGE_NAME, near.NAME]
            out = pb_utils.Tensor("OUT", np.array([json.dumps(seen).encode()], dtype=np.object_))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
    """
)
SIBLINGS_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [{{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }}]
"""


# Answers which of its inputs a request carried (get_input_tensor_by_name is None for the others).
OPTIONAL_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                sent = [n for n in ("A", "B", "C") if pb_utils.get_input_tensor_by_name(request, n) is not None]
                out = pb_utils.Tensor("SENT", np.array([" ".join(sent).encode()], dtype=np.object_))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)
OPTIONAL_CONFIG = """
name: "optional"
backend: "python"
input [{ name: "A", data_type: TYPE_FP32, dims: [ 1 ] },
       { name: "B", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
       { name: "C", data_type: TYPE_FP32, dims: [ 1 ], optional: true }]
output [{ name: "SENT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# Produces OUT in a shape of its own choosing (the rank the config declares or not).
SHAPE_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0]
                out = pb_utils.Tensor("OUT", np.arange(n, dtype=np.float32))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)
SHAPE_CONFIG = """
name: "produced_shape"
backend: "python"
input [{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1, 1 ] }]
"""


def add_model(repo: Path, name: str, model_py: str, config: str) -> Path:
    """<name>/config.pbtxt and <name>/1/model.py, as Triton lays a model out; returns <name>/."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def add_siblings(repo: Path, name: str, utils_folder: str, config: str = "") -> None:
    folder = add_model(repo, name, SIBLINGS_MODEL, SIBLINGS_CONFIG.format(name=name) + config)
    (folder / utils_folder / "utils.py").write_text(f"NAME = 'utils of {name}'\n")
    (folder / "helpers").mkdir()
    (folder / "helpers" / "__init__.py").write_text("")
    (folder / "helpers" / "names.py").write_text(f"NAME = 'helpers of {name}'\n")
    (folder / "1" / "near.py").write_text(f"NAME = 'near of {name}'\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("fidelity_repo")
    add_siblings(repo, "first", "1")
    add_siblings(repo, "second", ".")
    add_model(repo, "optional", OPTIONAL_MODEL, OPTIONAL_CONFIG)
    add_model(repo, "produced_shape", SHAPE_MODEL, SHAPE_CONFIG)
    add_siblings(repo, "in_workers", "1", "instance_group [{ kind: KIND_CPU, count: 2 }]")
    return repo


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[openinfer.Server]:
    server = openinfer.serve(
        repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False,
        model_control_mode="explicit", load_models=["*"],
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def client_and_module(srv: openinfer.Server, protocol: str) -> tuple[object, object]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return (triton_http(srv), httpclient) if protocol == "http" else (triton_grpc(srv), grpcclient)


def tensor(module: object, name: str, array: np.ndarray) -> object:
    datatype = "BYTES" if array.dtype == np.object_ else {"float32": "FP32", "int32": "INT32"}[str(array.dtype)]
    t = module.InferInput(name, list(array.shape), datatype)  # type: ignore[attr-defined]
    t.set_data_from_numpy(array)
    return t


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_model_imports_its_own_sibling_modules(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    for name in ("first", "second", "in_workers"):
        result = client.infer(name, [tensor(module, "IN", np.zeros(1, np.float32))])  # type: ignore[attr-defined]
        seen = json.loads(result.as_numpy("OUT")[0])
        assert seen == [f"utils of {name}"] * 3 + [f"helpers of {name}", f"near of {name}"]


def test_sibling_modules_leave_no_trace_in_the_server_process(srv: openinfer.Server, repo: Path) -> None:
    import sys

    assert "utils" not in sys.modules and "helpers" not in sys.modules
    assert not [p for p in sys.path if p.startswith(str(repo))]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_optional_inputs_any_allowed_subset(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    one = np.ones(1, np.float32)
    for names in (["A"], ["A", "C"], ["A", "B", "C"]):
        result = client.infer("optional", [tensor(module, n, one) for n in names])  # type: ignore[attr-defined]
        assert result.as_numpy("SENT")[0].decode() == " ".join(names)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_optional_inputs_missing_required_one_in_tritons_words(srv: openinfer.Server, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    client, module = client_and_module(srv, protocol)
    with pytest.raises(InferenceServerException) as e:
        client.infer("optional", [tensor(module, "B", np.ones(1, np.float32))])  # type: ignore[attr-defined]
    assert "expected number of inputs between 1 and 3 but got 1 inputs for model 'optional'. Got input(s) ['B'], " \
        "but missing required input(s) ['A']. Please provide all required input(s)." in e.value.message()
    assert e.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_are_checked_by_name_not_rank(srv: openinfer.Server, protocol: str) -> None:
    client, module = client_and_module(srv, protocol)
    result = client.infer("produced_shape", [tensor(module, "N", np.array([4], np.int32))])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(4, dtype=np.float32))
    config = client.get_model_config("produced_shape", **({"as_json": True} if protocol == "grpc" else {}))
    config = config.get("config", config)
    assert [int(d) for d in config["output"][0]["dims"]] == [-1, 1]  # the declaration is kept
