"""Optional inputs (`optional: true` in config.pbtxt), as Triton serves them: the model loads,
a request may leave such an input out and the model sees only the inputs sent; Triton's
identity backend answers zeros for a missing one; an ensemble passes an optional input on only
when it was sent; with dynamic batching, requests with different sets of inputs never share a
batch; a request without a required input is refused in Triton's words ("expected number of
inputs between 1 and 3 ..."). Through tritonclient over HTTP and gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import concurrent, triton_grpc, triton_http

IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 2 ] optional: true },
        { name: "INPUT2" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 2 ] },
         { name: "OUTPUT2" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# A Python model that answers, for each row, how many inputs it was given and the sum of them:
# a request batched with one that sent other inputs would see a count that is not its own.
SEEN = '''
import threading
import numpy as np

batches = []
lock = threading.Lock()


def infer(inputs):
    rows = next(iter(inputs.values())).shape[0]
    with lock:
        batches.append((rows, tuple(sorted(inputs))))
    return {"COUNT": np.full((rows, 1), len(inputs), dtype=np.int32)}
'''

SEEN_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "C" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""

ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, -1 ] },
        { name: "Y" data_type: TYPE_INT32 dims: [ 1, 2 ] optional: true } ]
output [ { name: "X_OUT" data_type: TYPE_FP32 dims: [ 1, -1 ] },
         { name: "Y_OUT" data_type: TYPE_INT32 dims: [ 1, 2 ] } ]
ensemble_scheduling { step [ {
  model_name: "identity_opt" model_version: -1
  input_map { key: "INPUT0" value: "X" } input_map { key: "INPUT1" value: "Y" }
  output_map { key: "OUTPUT0" value: "X_OUT" } output_map { key: "OUTPUT1" value: "Y_OUT" } } ] }
"""


def _write(repo: Path, name: str, config: str, model_py: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    if model_py is not None:
        (repo / name / "1" / "model.py").write_text(model_py)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("optional")
    _write(repo, "identity_opt", f'backend: "identity"\nmax_batch_size: 8\n{IO}')
    _write(repo, "identity_opt_nobatch", f'backend: "identity"\nmax_batch_size: 0\n{IO}')
    _write(repo, "seen", SEEN_CONFIG, SEEN)
    _write(repo, "ensemble_opt", ENSEMBLE)
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    assert srv.failed == {}, srv.failed
    yield srv
    srv.stop()


def _client(server: openinfer.Server, protocol: str) -> tuple[Any, Any]:
    return (httpclient, triton_http(server)) if protocol == "http" else (grpcclient, triton_grpc(server))


def _input(mod: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    i = mod.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model, lead", [("identity_opt", [2]), ("identity_opt_nobatch", [])])
def test_identity_answers_zeros_for_a_missing_optional_input(server: openinfer.Server, protocol: str, model: str,
                                                            lead: list[int]) -> None:
    mod, client = _client(server, protocol)
    x = np.arange(3 * (lead[0] if lead else 1), dtype=np.float32).reshape([*lead, 3])
    r = client.infer(model, [_input(mod, "INPUT0", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.zeros([*lead, 2], dtype=np.int32))
    assert r.as_numpy("OUTPUT2").tolist() == np.full([*lead, 1], b"", dtype=np.object_).tolist()
    # Sent, the optional input is answered as any other.
    y = np.arange(2 * (lead[0] if lead else 1), dtype=np.int32).reshape([*lead, 2]) + 7
    r = client.infer(model, [_input(mod, "INPUT0", x, "FP32"), _input(mod, "INPUT1", y, "INT32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), y)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_missing_required_input_in_tritons_words(server: openinfer.Server, protocol: str) -> None:
    mod, client = _client(server, protocol)
    y = np.zeros([1, 2], dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_opt", [_input(mod, "INPUT1", y, "INT32")])
    assert e.value.message() == (
        "[request id: <id_unknown>] expected number of inputs between 1 and 3 but got 1 inputs for model "
        "'identity_opt'. Got input(s) ['INPUT1'], but missing required input(s) ['INPUT0']. Please provide all "
        "required input(s)."
    )
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_python_model_sees_only_the_inputs_sent(server: openinfer.Server, protocol: str) -> None:
    mod, client = _client(server, protocol)
    one = np.ones([1, 1], dtype=np.float32)
    for names in (["C"], ["A", "C"], ["A", "B", "C"]):
        r = client.infer("seen", [_input(mod, n, one, "FP32") for n in names])
        assert r.as_numpy("COUNT").tolist() == [[len(names)]]


def test_requests_with_different_inputs_never_share_a_batch(server: openinfer.Server) -> None:
    """Twelve requests at once (each its own client), three sets of inputs: each answer counts
    its own inputs, and no batch the model ran mixed sets."""
    sets = [["C"], ["A", "C"], ["A", "B", "C"]]

    def one(i: int) -> int:
        names = sets[i % 3]
        mod = httpclient if i % 2 else grpcclient
        port = server.http_port if i % 2 else server.grpc_port
        client = mod.InferenceServerClient(f"127.0.0.1:{port}")  # made, used and closed on this thread
        try:
            rows = 1 + i % 2
            x = np.ones([rows, 1], dtype=np.float32)
            r = client.infer("seen", [_input(mod, n, x, "FP32") for n in names])
            return int(r.as_numpy("COUNT").sum() // rows)
        finally:
            client.close()

    counts = concurrent(12, one)
    assert counts == [len(sets[i % 3]) for i in range(12)]
    seen_sets = {names for _, names in _batches(server)}
    assert seen_sets <= {tuple(s) for s in sets}


def _batches(server: openinfer.Server) -> list[tuple[int, tuple[str, ...]]]:
    """The model module's record of the batches it ran (the model runs in this process)."""
    import sys

    for module in list(sys.modules.values()):
        batches = getattr(module, "batches", None)
        if isinstance(batches, list) and getattr(module, "__file__", "").endswith("seen/1/model.py"):
            return list(batches)
    pytest.fail("the 'seen' model's module is not loaded in this process")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_passes_an_optional_input_only_when_sent(server: openinfer.Server, protocol: str) -> None:
    mod, client = _client(server, protocol)
    x = np.arange(3, dtype=np.float32).reshape([1, 3])
    r = client.infer("ensemble_opt", [_input(mod, "X", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("X_OUT"), x)
    np.testing.assert_array_equal(r.as_numpy("Y_OUT"), np.zeros([1, 2], dtype=np.int32))
    y = np.array([[5, 6]], dtype=np.int32)
    r = client.infer("ensemble_opt", [_input(mod, "X", x, "FP32"), _input(mod, "Y", y, "INT32")])
    np.testing.assert_array_equal(r.as_numpy("Y_OUT"), y)


def test_config_reports_optional_and_other_backends_refuse_it(server: openinfer.Server, tmp_path: Path) -> None:
    config = triton_http(server).get_model_config("identity_opt")
    assert [i.get("optional", False) for i in config["input"]] == [False, True, True]
    _write(tmp_path, "torch_opt", f'platform: "pytorch_libtorch"\nmax_batch_size: 8\n{IO}')
    with openinfer.serve(tmp_path, http_port=0, grpc_port=0, log=False) as srv:
        assert "input[1].optional is not supported by openinfer (only Python, identity and ensemble models " \
            "take optional inputs)" in srv.failed["torch_opt"][1]
