"""Writes the example TorchScript models into examples/models, deterministically (fixed
seeds): an MLP (``mlp``, with a Triton config.pbtxt and dynamic batching) and a small CNN
(``cnn``, served with no config.pbtxt at all: openinfer reads forward()'s signature and
probes the module's ``example_inputs``).

    python examples/make_torchscript.py [REPO]

Both files are a few tens of kilobytes and are committed; rerun this after changing them.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

MLP_CONFIG = """\
name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 8, 16 ] max_queue_delay_microseconds: 500 }
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
"""


class MLP(nn.Module):
    """16 -> 32 -> 32 -> 4 with ReLU: a small tabular classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """1x28x28 images -> 10 logits and 10 probabilities (a dict: two named outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Linear(8 * 7 * 7, 10)
        # Read by openinfer to learn the input and output shapes without a config.pbtxt.
        self.example_inputs = torch.zeros(1, 1, 28, 28)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.features(image).flatten(1))
        return {"logits": logits, "probabilities": torch.softmax(logits, dim=1)}


def write(repo: Path) -> None:
    torch.manual_seed(0)
    mlp = torch.jit.script(MLP().eval())
    torch.manual_seed(1)
    cnn = torch.jit.script(CNN().eval())
    for name, module in (("mlp", mlp), ("cnn", cnn)):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        module.save(str(repo / name / "1" / "model.pt"))
    (repo / "mlp" / "config.pbtxt").write_text(textwrap.dedent(MLP_CONFIG))


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "models")
