"""Writes the example ONNX model into examples/models: ``mlp_onnx``, the network of the
TorchScript ``mlp`` example (its weights, read from ``mlp/1/model.pt``) as an ONNX graph of
Gemm and Relu nodes built with the onnx helper API, with a Triton config.pbtxt for
onnxruntime and dynamic batching. Deterministic: the same weights give the same model, and
tests/test_onnx.py checks that this script reproduces the committed file.

    python examples/make_onnx.py [REPO]

The file is about 10 kB; rerun this after changing the mlp example.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper, numpy_helper

CONFIG = """\
name: "mlp_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 8, 16 ] max_queue_delay_microseconds: 500 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def build(mlp_file: Path) -> onnx.ModelProto:
    """The ONNX graph of the TorchScript MLP in `mlp_file` (16 -> 32 -> 32 -> 4, ReLU)."""
    import torch

    state = torch.jit.load(str(mlp_file), map_location="cpu").state_dict()
    layers = sorted({k.rsplit(".", 1)[0] for k in state if k.endswith(".weight")}, key=lambda k: int(k.split(".")[-1]))
    nodes, inits = [], []
    x = "INPUT__0"
    for i, layer in enumerate(layers):
        w, b = f"w{i}", f"b{i}"
        inits += [
            numpy_helper.from_array(state[f"{layer}.weight"].numpy(), w),
            numpy_helper.from_array(state[f"{layer}.bias"].numpy(), b),
        ]
        last = i == len(layers) - 1
        out = "OUTPUT__0" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [out if last else f"g{i}"], transB=1))  # x W^T + b
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        x = out
    width_in = int(state[f"{layers[0]}.weight"].shape[1])
    width_out = int(state[f"{layers[-1]}.weight"].shape[0])
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT__0", TensorProto.FLOAT, ["batch", width_in])],
        [helper.make_tensor_value_info("OUTPUT__0", TensorProto.FLOAT, ["batch", width_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="openinfer")
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    onnx.checker.check_model(model)
    return model


def write(repo: Path) -> None:
    model = build(repo / "mlp" / "1" / "model.pt")
    (repo / "mlp_onnx" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(repo / "mlp_onnx" / "1" / "model.onnx"))
    (repo / "mlp_onnx" / "config.pbtxt").write_text(CONFIG)


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "models")
