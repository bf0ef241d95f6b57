"""A Triton `model.py` behaves as it does in Triton (issue 39): what model.py imports from beside
it, optional inputs, response parameters, outputs checked by name, over tritonclient HTTP and gRPC."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

import openinfer

from conftest import pending_requests, triton_grpc, triton_http, wait_for

PROLOGUE = "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"
DECOUPLED = "model_transaction_policy { decoupled: true }\n"


def config(name: str, inputs: list[tuple], outputs: list[tuple], extra: str = "") -> str:
    """A Triton Python model's config.pbtxt; each tensor (name, type, dims[, optional])."""

    def tensors(kind: str, items: list[tuple]) -> str:
        return "".join(
            f'{kind} [{{ name: "{t[0]}", data_type: TYPE_{t[1]}, dims: [ {t[2]} ]{", optional: true" if t[3:] else ""} }}]\n'
            for t in items
        )

    return f'name: "{name}"\nbackend: "python"\n' + tensors("input", inputs) + tensors("output", outputs) + extra


def siblings_config(name: str) -> str:
    return config(name, [("IN", "FP32", "-1")], [("OUT", "STRING", "1")])

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


# Answers which of its inputs a request carried (get_input_tensor_by_name is None for the
# others), in the shape of its input A (a row each, batched).
OPTIONAL_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                sent = [n for n in ("A", "B", "C") if pb_utils.get_input_tensor_by_name(request, n) is not None]
                shape = pb_utils.get_input_tensor_by_name(request, "A").as_numpy().shape
                out = pb_utils.Tensor("SENT", np.full(shape, " ".join(sent).encode(), dtype=np.object_))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)
OPTIONAL_CONFIG = config(
    "optional", [("A", "FP32", "1"), ("B", "FP32", "1", True), ("C", "FP32", "1", True)], [("SENT", "STRING", "1")]
)

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
SHAPE_CONFIG = config("produced_shape", [("N", "INT32", "1")], [("OUT", "FP32", "-1, 1")])

# Answers with the TritonError whose code it is sent (logging at each of Logger's levels first).
ERROR_CODE_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for level in (pb_utils.Logger.INFO, pb_utils.Logger.WARNING, pb_utils.Logger.ERROR, pb_utils.Logger.VERBOSE):
                pb_utils.Logger.log("error_code at level " + str(level), level)
            codes = [int(pb_utils.get_input_tensor_by_name(r, "CODE").as_numpy().reshape(-1)[0]) for r in requests]
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("code " + str(c), c)) for c in codes]
    """
)
ERROR_CODE_CONFIG = config("error_code", [("CODE", "INT32", "1")], [("OUT", "INT32", "1")])
# Sends its one response with the final flag, then raises: Triton logs the error, sends nothing.
RAISES_AFTER_FINAL_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                out = pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            raise ValueError("after the final flag")
    """
)
RAISES_AFTER_FINAL_CONFIG = config(
    "raises_after_final", [("CODE", "INT32", "1")], [("OUT", "INT32", "1")], DECOUPLED
)

# A decoupled target that sends one response, then waits (10 s at most) for its request to be
# cancelled and writes whether it was to the file the caller names.
CANCEL_TARGET_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
                deadline = time.monotonic() + 10
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
                path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0].decode()
                with open(path + ".part", "w") as f:
                    f.write("cancelled" if request.is_cancelled() else "not cancelled")
                os.replace(path + ".part", path)  # the caller sees it whole
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
)
CANCEL_TARGET_CONFIG = config("cancel_target", [("PATH", "STRING", "1")], [("OUT", "INT32", "1")], DECOUPLED)
# Streams from cancel_target, cancels the stream after its first response, and answers what
# the target wrote.
CANCEL_CALLER_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                path = pb_utils.get_input_tensor_by_name(request, "PATH")
                stream = pb_utils.InferenceRequest(model_name="cancel_target", inputs=[path],
                                                   requested_output_names=["OUT"]).exec(decoupled=True)
                next(iter(stream))
                stream.cancel()
                file = path.as_numpy()[0].decode()
                deadline = time.monotonic() + 15
                while not os.path.exists(file) and time.monotonic() < deadline:
                    time.sleep(0.01)
                with open(file) as f:
                    seen = f.read()
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=np.object_))]))
            return responses
    """
)
CANCEL_CALLER_CONFIG = config("cancel_caller", [("PATH", "STRING", "1")], [("SEEN", "STRING", "1")])

# Doubles its input through torch, by DLPack both ways (torch imported in execute: the test
# needs it, the repository does not).
DLPACK_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            from torch.utils.dlpack import from_dlpack
            responses = []
            for request in requests:
                x = from_dlpack(pb_utils.get_input_tensor_by_name(request, "IN").to_dlpack())
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", x * 2)]))
            return responses
    """
)
DLPACK_CONFIG = config("dlpack", [("IN", "FP32", "-1")], [("OUT", "FP32", "-1")])

# Answers with response parameters of a type Triton refuses (a float).
BAD_PARAMETERS_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([], parameters={"ok": 1, "ratio": 0.5}) for _ in requests]
    """
)

# OPTIONAL_MODEL batched with a queue delay far past any test's bound (BATCH_DELAY_S): only a
# request that cannot join sends a pending batch early.
BATCH_DELAY_S = 300
BATCHED_CONFIG = config(
    "batched", [("A", "FP32", "1"), ("B", "FP32", "1", True), ("C", "FP32", "1", True)], [("SENT", "STRING", "1")],
    f"max_batch_size: 8\ndynamic_batching {{ max_queue_delay_microseconds: {BATCH_DELAY_S * 1_000_000} }}\n",
)
BOUND = 60.0  # seconds: a bound for a hung test, not a measurement


def add_model(repo: Path, name: str, model_py: str, config: str) -> Path:
    """<name>/config.pbtxt and <name>/1/model.py, as Triton lays a model out; returns <name>/."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def add_siblings(repo: Path, name: str, utils_folder: str, extra: str = "") -> None:
    folder = add_model(repo, name, SIBLINGS_MODEL, siblings_config(name) + extra)
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
    add_model(repo, "error_code", ERROR_CODE_MODEL, ERROR_CODE_CONFIG)
    add_model(repo, "dlpack", DLPACK_MODEL, DLPACK_CONFIG)
    add_model(repo, "batched", OPTIONAL_MODEL, BATCHED_CONFIG)
    add_model(repo, "bad_parameters", BAD_PARAMETERS_MODEL, ERROR_CODE_CONFIG.replace('"error_code"', '"bad_parameters"'))
    add_model(repo, "cancel_target", CANCEL_TARGET_MODEL, CANCEL_TARGET_CONFIG)
    add_model(repo, "cancel_caller", CANCEL_CALLER_MODEL, CANCEL_CALLER_CONFIG)
    add_model(repo, "raises_after_final", RAISES_AFTER_FINAL_MODEL, RAISES_AFTER_FINAL_CONFIG)
    add_model(repo, "bad(name)", OPTIONAL_MODEL, OPTIONAL_CONFIG.replace('"optional"', '"bad(name)"', 1))
    add_siblings(repo, "in_workers", "1", "instance_group [{ kind: KIND_CPU, count: 2 }]")
    return repo


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[openinfer.Server]:
    options = {"http_port": 0, "grpc_port": 0, "threads": 2, "log": False}
    with openinfer.serve(repo, model_control_mode="explicit", load_models=["*"], **options) as server:
        yield server


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


def test_an_unloaded_models_modules_leave_sys_modules(tmp_path: Path) -> None:
    """In-process models share one interpreter: a model.py load's modules (named uniquely to the
    load) leave sys.modules when the model is unloaded, replaced by a reload, fails to load or
    the server stops, so that load and unload cycles do not keep every old version's code."""
    import sys

    import tritonclient.http as httpclient

    def loads(name: str) -> list[str]:
        return [m for m in sys.modules if m.startswith(f"_openinfer_model_{name}_v1_") and "." not in m]

    add_siblings(tmp_path, "kept", "1")
    add_model(tmp_path, "plain", "def infer(inputs):\n    return {'OUT': inputs['IN']}\n",
              'backend: "python" input { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } '
              'output { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }')
    add_siblings(tmp_path, "failing", "1")
    failing = SIBLINGS_MODEL.replace("def initialize(self, args):", "def initialize(self, args):\n        1 / 0")
    assert failing != SIBLINGS_MODEL
    (tmp_path / "failing" / "1" / "model.py").write_text(failing)
    finalized = tmp_path / "finalized.txt"
    (tmp_path / "kept" / "1" / "model.py").write_text(SIBLINGS_MODEL + textwrap.dedent(f"""
        def _finalize(self):
            with open({str(finalized)!r}, "a") as f:
                f.write("x")
        TritonPythonModel.finalize = _finalize
    """))
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False, model_control_mode="explicit") as srv:
        client = httpclient.InferenceServerClient(srv.url.split("//")[1])
        for name in ("kept", "plain"):
            client.load_model(name)
            assert len(loads(name)) == 1
            client.load_model(name)  # a reload replaces the version: its first load leaves
            assert len(loads(name)) == 1
            client.unload_model(name)
            assert loads(name) == []
        assert finalized.read_text() == "xx"  # the replaced version was finalized, then the unloaded one
        with pytest.raises(Exception, match="division by zero"):
            client.load_model("failing")
        assert loads("failing") == []
        client.load_model("kept")
    assert loads("kept") == []


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


@pytest.mark.parametrize(("script", "models"), [("simple_http_model_control.py", 7), ("simple_grpc_model_control.py", 8)])
def test_tritons_model_control_examples_unchanged(tmp_path: Path, script: str, models: int) -> None:
    """Triton's model-control examples load the example `simple` with the override
    {"max_batch_size":"16"}, a whole config in Triton's sense: `simple`'s model.py describes
    its inputs and outputs itself, as Triton's auto-complete would."""
    from test_triton_python_backend import run_client

    examples = openinfer.examples_path()
    others = sorted(p.name for p in examples.iterdir() if p.is_dir() and p.name != "simple")
    for name in ["simple", *others[: models - 1]]:
        shutil.copytree(examples / name, tmp_path / name)
    server = openinfer.serve(
        tmp_path, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False, model_control_mode="explicit"
    )
    try:
        assert "PASS: model control" in run_client(server, Path(__file__).parent / "triton_client_examples" / script)
    finally:
        server.stop()


# Triton's TritonError codes as its http_server.cc and grpc_utils.cc answer them.
TRITON_STATUS = [
    ("UNKNOWN", 0, "400", "UNKNOWN"),
    ("INTERNAL", 1, "500", "INTERNAL"),
    ("NOT_FOUND", 2, "404", "NOT_FOUND"),
    ("INVALID_ARG", 3, "400", "INVALID_ARGUMENT"),
    ("UNAVAILABLE", 4, "503", "UNAVAILABLE"),
    ("UNSUPPORTED", 5, "501", "UNIMPLEMENTED"),
    ("ALREADY_EXISTS", 6, "400", "ALREADY_EXISTS"),
    ("CANCELLED", 7, "400", "CANCELLED"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_error_codes_map_as_tritons_frontends_map_them(srv: openinfer.Server, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    from openinfer._backends import triton_utils as pb

    client, module = client_and_module(srv, protocol)
    for name, code, http, grpc in TRITON_STATUS:
        assert getattr(pb.TritonError, name) == code
        with pytest.raises(InferenceServerException) as e:
            client.infer("error_code", [tensor(module, "CODE", np.array([code], np.int32))])  # type: ignore[attr-defined]
        assert e.value.message() == f"code {code}"
        assert e.value.status() == (http if protocol == "http" else f"StatusCode.{grpc}"), name


def test_an_exception_after_the_final_flag_is_logged_not_sent(srv: openinfer.Server) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    client = triton_grpc(srv)
    got: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("raises_after_final", [tensor(grpcclient, "CODE", np.array([0], np.int32))])
    result, error = got.get(timeout=30)
    assert error is None and result.as_numpy("OUT").tolist() == [7]
    client.stop_stream()
    assert got.empty()  # no error followed the response
    # Over HTTP a decoupled model answers through the generate extension, as in Triton.
    answer = requests.post(f"{srv.url}/v2/models/raises_after_final/generate", json={"CODE": [0]}, timeout=30)
    assert answer.status_code == 200 and answer.json()["OUT"] == 7, answer.text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_parameters_named_triton_are_refused_as_triton_refuses_them(srv: openinfer.Server, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    client, module = client_and_module(srv, protocol)
    with pytest.raises(InferenceServerException) as e:
        client.infer("optional", [tensor(module, "A", np.ones(1, np.float32))], parameters={"triton_mine": 1})  # type: ignore[attr-defined]
    if protocol == "http":
        assert e.value.status() == "400"
        assert e.value.message() == ("parameter keys starting with 'triton_' are reserved for Triton usage and "
                                     "should not be specified.")  # fmt: skip
    else:
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                                     "following keys starting with 'triton_' are allowed: "
                                     "triton_enable_empty_final_response")  # fmt: skip


def test_a_grpc_header_value_with_trailing_whitespace_is_accepted(srv: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient

    client = triton_grpc(srv)
    inputs = [tensor(grpcclient, "A", np.ones(1, np.float32))]
    result = client.infer("optional", inputs, headers={"x-request-tag": "tagged "})
    assert result.as_numpy("SENT")[0] == b"A"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cancelling_a_bls_stream_reaches_the_target_request(srv: openinfer.Server, protocol: str, tmp_path: Path) -> None:
    client, module = client_and_module(srv, protocol)
    path = np.array([str(tmp_path / "seen.txt").encode()], dtype=np.object_)
    result = client.infer("cancel_caller", [tensor(module, "PATH", path)])  # type: ignore[attr-defined]
    assert result.as_numpy("SEEN")[0] == b"cancelled"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_inputs_to_dlpack_works_as_in_triton(srv: openinfer.Server, protocol: str) -> None:
    pytest.importorskip("torch")
    client, module = client_and_module(srv, protocol)
    x = np.array([1.5, -2.0, 3.0], np.float32)
    result = client.infer("dlpack", [tensor(module, "IN", x)])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_name_the_stub_refuses_fails_to_load_in_tritons_words(srv: openinfer.Server, protocol: str) -> None:
    client, _ = client_and_module(srv, protocol)
    if protocol == "http":
        index = {m["name"]: m for m in client.get_model_repository_index()}
    else:
        index = {m.name: {"state": m.state, "reason": m.reason} for m in client.get_model_repository_index().models}
    assert index["bad(name)"]["state"] == "UNAVAILABLE"
    assert index["bad(name)"]["reason"] == "Invalid stub name: contains invalid characters"


UPLOADED_CONFIG = json.dumps({
    "backend": "python",
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]}],
})  # fmt: skip
UPLOADED_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = pb_utils.Tensor("OUT", np.array([b"uploaded"], dtype=np.object_))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
    """
)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_code_sent_with_a_load_runs_where_strangers_cannot_load(srv: openinfer.Server, protocol: str) -> None:
    """The test server listens on 127.0.0.1 only, so the load's model.py is taken, as Triton takes it."""
    client, module = client_and_module(srv, protocol)
    name = f"uploaded_{protocol}"
    client.load_model(name, config=UPLOADED_CONFIG, files={"file:1/model.py": UPLOADED_MODEL.encode()})
    result = client.infer(name, [tensor(module, "IN", np.zeros(1, np.float32))])  # type: ignore[attr-defined]
    assert result.as_numpy("OUT")[0] == b"uploaded"


def test_model_code_sent_with_a_load_is_refused_where_strangers_could_load() -> None:
    from openinfer._control.control import ModelControl
    from openinfer.errors import InferenceServerError

    control = ModelControl(None, None, [], mode="explicit", load_code=False)
    try:
        with pytest.raises(InferenceServerError) as e:
            control._write_files("m", {"1/model.py": b"pass"})
        assert e.value.status == 400
        assert "restrict it (--http-restricted-api / --grpc-restricted-protocol model-repository:KEY=VALUE)" in (
            e.value.message)
    finally:
        control.close(0)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_response_parameters_are_type_checked_as_triton_checks_them(srv: openinfer.Server, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    client, module = client_and_module(srv, protocol)
    with pytest.raises(InferenceServerException) as e:
        client.infer("bad_parameters", [tensor(module, "CODE", np.array([0], np.int32))])  # type: ignore[attr-defined]
    assert e.value.message().startswith(
        "Failed to process the request(s) for model 'bad_parameters_0', message: TritonModelException: Expect "
        "parameters values to have type bool/int/str, found type <class 'float'>")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_with_other_inputs_sends_the_pending_batch_at_once(srv: openinfer.Server, protocol: str) -> None:
    """As Triton's dynamic batcher: the first request would wait BATCH_DELAY_S for company; the
    second, which cannot join it (another set of inputs), makes it go at once (the second fills
    a batch of its own: max_batch_size rows go at once too). Both answer within BOUND, a fifth
    of the delay: the order of events shows it, not a measured time."""
    import threading

    _, module = client_and_module(srv, protocol)
    sent: dict[str, list[bytes]] = {}

    def send(names: list[str], rows: int) -> None:
        port = srv.http_port if protocol == "http" else srv.grpc_port
        client = module.InferenceServerClient(f"127.0.0.1:{port}")  # type: ignore[attr-defined]
        try:  # made, used and closed on this thread
            result = client.infer("batched", [tensor(module, n, np.ones((rows, 1), np.float32)) for n in names])
            sent[" ".join(names)] = result.as_numpy("SENT").reshape(-1).tolist()
        finally:
            client.close()

    first = threading.Thread(target=send, args=(["A"], 1), daemon=True)
    first.start()
    wait_for(lambda: pending_requests(srv, "batched") == 1, "queued, waiting for company")
    send(["A", "B"], 8)
    first.join(BOUND)
    assert sent == {"A": [b"A"], "A B": [b"A B"] * 8}, "the first request still waits for its batch's company"


# A BYTES output made of numbers and a bool, which Triton writes as str(item).
MIXED_BYTES_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            mixed = np.array([1, 2.5, True, "s", b"b"], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", mixed)]) for _ in requests]
    """
)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_outputs_of_numbers_are_written_as_triton_writes_them(tmp_path: Path, protocol: str) -> None:
    add_model(tmp_path, "mixed", MIXED_BYTES_MODEL, config("mixed", [("IN", "FP32", "-1")], [("OUT", "STRING", "5")]))
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 1, "log": False}
    with openinfer.serve(tmp_path, **options) as server:
        client, module = client_and_module(server, protocol)
        result = client.infer("mixed", [tensor(module, "IN", np.zeros(1, np.float32))])  # type: ignore[attr-defined]
        assert result.as_numpy("OUT").tolist() == [b"1", b"2.5", b"True", b"s", b"b"]


# Says what auto_complete_config saw of the config (Triton gives it JSON: lists for repeated
# fields) and doubles IN.
SHAPES_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        seen = None

        @staticmethod
        def auto_complete_config(model_config):
            c = model_config.as_dict()
            TritonPythonModel.seen = [type(c["input"]).__name__, type(c["input"][0]["dims"]).__name__,
                                      type(c["instance_group"]).__name__]
            return model_config

        def execute(self, requests):
            seen = np.array([json.dumps(self.seen).encode()], dtype=np.object_)
            return [pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2),
                pb_utils.Tensor("SEEN", seen)]) for r in requests]
    """
)

# Each repeated field written once, without brackets, as text format allows (and Triton reads).
SINGLE_FIELDS_CONFIG = """name: "single"
backend: "python"
input { name: "IN" data_type: TYPE_FP32 dims: 4 }
output { name: "OUT" data_type: TYPE_FP32 dims: 4 reshape { shape: [ 2, 2 ] } }
output { name: "SEEN" data_type: TYPE_STRING dims: 1 }
instance_group { kind: KIND_CPU }
parameters { key: "k" value: { string_value: "v" } }
"""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_repeated_fields_written_once_without_brackets(tmp_path: Path, protocol: str) -> None:
    """`input { ... }` and `dims: 4` are a repeated field's one item in text format: the model
    loads (the server did not start), auto_complete_config sees lists as in Triton, an output's
    reshape applies."""
    add_model(tmp_path, "single", SHAPES_MODEL, SINGLE_FIELDS_CONFIG)
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 1, "log": False}
    with openinfer.serve(tmp_path, **options) as server:
        assert server.failed == {}, server.failed
        client, module = client_and_module(server, protocol)
        x = np.arange(4, dtype=np.float32)
        result = client.infer("single", [tensor(module, "IN", x)])  # type: ignore[attr-defined]
        np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)
        assert json.loads(result.as_numpy("SEEN")[0]) == ["list", "list", "list"]


# Answers its request's parameters (the forwarded headers among them) as JSON.
PARAMETERS_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([r.parameters().encode()], dtype=np.object_))])
                    for r in requests]
    """
)


def test_header_forward_patterns_in_re2_syntax_with_tritons_case_handling(tmp_path: Path) -> None:
    """tritonserver matches "(?i)" + the pattern with RE2: "(?-i)" at its start makes it case
    sensitive (and must not stop the server), and RE2's "(?:" and \\d are understood."""
    import tritonclient.grpc as grpcclient

    add_model(tmp_path, "params", PARAMETERS_MODEL, siblings_config("params"))
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 1, "log": False}
    with openinfer.serve(tmp_path, http_header_forward_pattern=r"(?-i)^x-\d",
                         grpc_header_forward_pattern=r"^(?:x|y)-\d", **options) as server:  # fmt: skip
        body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [0]}]}
        answer = requests.post(f"{server.url}/v2/models/params/infer", json=body, timeout=30,
                               headers={"x-1": "kept", "X-2": "other case", "x-a": "no digit"})  # fmt: skip
        assert json.loads(answer.json()["outputs"][0]["data"][0]) == {"x-1": "kept"}
        result = triton_grpc(server).infer("params", [tensor(grpcclient, "IN", np.zeros(1, np.float32))],
                                           headers={"y-7": "kept", "z-7": "no", "x-b": "no"})  # fmt: skip
        assert json.loads(result.as_numpy("OUT")[0]) == {"y-7": "kept"}


PARAMS_ENSEMBLE_CONFIG = config("params_ensemble", [("IN", "FP32", "-1")], [("OUT", "STRING", "1")]).replace(
    'backend: "python"', 'platform: "ensemble"'
) + (
    'ensemble_scheduling { step [ { model_name: "params" model_version: -1 '
    'input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }\n'
)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ensemble_passes_its_request_parameters_to_its_steps(tmp_path: Path, protocol: str) -> None:
    add_model(tmp_path, "params", PARAMETERS_MODEL, siblings_config("params"))
    (tmp_path / "params_ensemble" / "1").mkdir(parents=True)
    (tmp_path / "params_ensemble" / "config.pbtxt").write_text(PARAMS_ENSEMBLE_CONFIG)
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 1, "log": False}
    with openinfer.serve(tmp_path, **options) as server:
        client, module = client_and_module(server, protocol)
        result = client.infer("params_ensemble", [tensor(module, "IN", np.zeros(1, np.float32))],  # type: ignore[attr-defined]
                              parameters={"colour": "blue", "count": 3})  # fmt: skip
        assert json.loads(result.as_numpy("OUT")[0]) == {"colour": "blue", "count": 3}


# Decoupled and dynamically batched, as Triton serves it: two responses for each request.
TWICE_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                for k in (1, 2):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x * k).astype(np.float32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
)
TWICE_CONFIG = config(
    "twice", [("IN", "FP32", "1")], [("OUT", "FP32", "1")],
    "max_batch_size: 8\ndynamic_batching { }\n" + DECOUPLED,
)


def test_a_decoupled_model_with_dynamic_batching_is_served(tmp_path: Path) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    add_model(tmp_path, "twice", TWICE_MODEL, TWICE_CONFIG)
    options = {"http_port": 0, "grpc_port": 0, "metrics_port": None, "threads": 1, "log": False}
    with openinfer.serve(tmp_path, **options) as server:
        client = triton_grpc(server)
        got: queue.SimpleQueue = queue.SimpleQueue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("twice", [tensor(grpcclient, "IN", np.full((1, 1), 3, np.float32))])
        answers = [got.get(timeout=30) for _ in range(2)]
        client.stop_stream()
        assert [(e, r.as_numpy("OUT").tolist()) for r, e in answers] == [(None, [[3.0]]), (None, [[6.0]])]
        stream = requests.post(f"{server.url}/v2/models/twice/generate_stream", json={"IN": [5]}, timeout=30)
        events = [json.loads(line[5:]) for line in stream.text.splitlines() if line.startswith("data:")]
        assert [e["OUT"] for e in events] == [5.0, 10.0], stream.text


@pytest.mark.parametrize("mode", ["triton_grpc_error", "in_stream"])
def test_triton_grpc_error_ends_a_stream_with_the_errors_status(srv: openinfer.Server, mode: str) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    client = triton_grpc(srv)
    got: queue.SimpleQueue = queue.SimpleQueue()
    headers = {"triton_grpc_error": "true"} if mode == "triton_grpc_error" else None
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers=headers)
    client.async_stream_infer("error_code", [tensor(grpcclient, "CODE", np.array([3], np.int32))])
    _, error = got.get(timeout=30)
    assert error is not None and "code 3" in error.message()
    if mode == "triton_grpc_error":  # the stream ended with the model's status
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
    else:  # the error travelled in the stream, which goes on
        client.async_stream_infer("optional", [tensor(grpcclient, "A", np.ones(1, np.float32))])
        result, error = got.get(timeout=30)
        assert error is None and result.as_numpy("SENT")[0] == b"A"
    client.stop_stream()
