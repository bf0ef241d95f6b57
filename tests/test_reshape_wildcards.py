"""`reshape` with variable dimensions, as Triton maps them: the k-th -1 of an input's reshape
takes the size the request gave the k-th -1 of its dims (core infer_request.cc), and an output's
dims take theirs from the produced shape where its reshape has -1s
(InferenceResponse::Output::Reshape); also at an ensemble's step. An ONNX model that sums the
last axis shows what the session was given. Through tritonclient HTTP and gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer

onnx = pytest.importorskip("onnx", reason="onnx is not installed (requirements-test.txt has it)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements-test.txt has it)")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

WILD = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape: { shape: [ -1, 2, 2 ] } },
        { name: "W" data_type: TYPE_FP32 dims: [ -1, -1 ] reshape: { shape: [ -1, 1, -1 ] } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape: { shape: [ -1, 2, 2 ] } },
         { name: "Z" data_type: TYPE_FP32 dims: [ -1, 2 ] },
         { name: "V" data_type: TYPE_FP32 dims: [ -1, -1 ] reshape: { shape: [ -1, 1, -1 ] } },
         { name: "R" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]
"""

ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "EX" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "EW" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
output [ { name: "EY" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "ER" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]
ensemble_scheduling { step [ { model_name: "wild" model_version: -1
  input_map [ { key: "X" value: "EX" }, { key: "W" value: "EW" } ]
  output_map [ { key: "Y" value: "EY" }, { key: "R" value: "ER" } ] } ] }
"""


def _wild(repo: Path) -> None:
    """Y = X and V = W as the session has them; Z and R sum X's and W's last axes."""
    nodes = [helper.make_node("Identity", ["X"], ["Y"]), helper.make_node("ReduceSum", ["X", "axis"], ["Z"], keepdims=0),
             helper.make_node("Identity", ["W"], ["V"]), helper.make_node("ReduceSum", ["W", "axis"], ["R"], keepdims=0)]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "wild", [vi("X", T.FLOAT, ["B", "N", 2, 2]), vi("W", T.FLOAT, ["B", "M", 1, "K"])],
        [vi("Y", T.FLOAT, ["B", "N", 2, 2]), vi("Z", T.FLOAT, ["B", "N", 2]), vi("V", T.FLOAT, ["B", "M", 1, "K"]),
         vi("R", T.FLOAT, ["B", "M", 1])],
        [numpy_helper.from_array(np.array([3], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "wild" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "wild" / "1" / "model.onnx"))
    (repo / "wild" / "config.pbtxt").write_text(WILD)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("repo")
    _wild(repo)
    with openinfer.serve(str(repo), http_port=0, grpc_port=0, log=False) as srv:
        yield srv


def _client(server: openinfer.Server, protocol: str) -> Any:
    lib = httpclient if protocol == "http" else grpcclient
    port = server.http_port if protocol == "http" else server.grpc_port
    return lib, lib.InferenceServerClient(f"127.0.0.1:{port}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wildcards_map_as_triton_maps_them(server: openinfer.Server, protocol: str) -> None:
    lib, client = _client(server, protocol)
    x = np.arange(3 * 5 * 4, dtype=np.float32).reshape(3, 5, 4)
    w = np.arange(3 * 2 * 7, dtype=np.float32).reshape(3, 2, 7)
    inputs = [lib.InferInput("X", list(x.shape), "FP32"), lib.InferInput("W", list(w.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(w)
    result = client.infer("wild", inputs)
    np.testing.assert_array_equal(result.as_numpy("Y"), x)  # reported in its dims: [3, 5, 4]
    np.testing.assert_array_equal(result.as_numpy("Z"), x.reshape(3, 5, 2, 2).sum(axis=3))
    np.testing.assert_array_equal(result.as_numpy("V"), w)
    # W [3, 2, 7] reached the session as [3, 2, 1, 7]: its -1s took 2 and 7, in order.
    np.testing.assert_array_equal(result.as_numpy("R"), w.sum(axis=2, keepdims=True))
    ens = [lib.InferInput("EX", list(x.shape), "FP32"), lib.InferInput("EW", list(w.shape), "FP32")]
    ens[0].set_data_from_numpy(x)
    ens[1].set_data_from_numpy(w)
    result = client.infer("ens", ens)
    np.testing.assert_array_equal(result.as_numpy("EY"), x)
    np.testing.assert_array_equal(result.as_numpy("ER"), w.sum(axis=2, keepdims=True))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_shape_the_reshape_cannot_take_is_refused(server: openinfer.Server, protocol: str) -> None:
    lib, client = _client(server, protocol)
    x = np.zeros((1, 2, 3), np.float32)  # dims [-1, 4]: 3 is not 4
    w = np.zeros((1, 2, 2), np.float32)
    inputs = [lib.InferInput("X", list(x.shape), "FP32"), lib.InferInput("W", list(w.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(w)
    with pytest.raises(InferenceServerException) as e:
        client.infer("wild", inputs)
    assert "X" in e.value.message() and e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
