"""The ``cnn`` example as a PyTorch 2 AOTInductor package: the same network and weights (read
from ``model.pt``, the TorchScript example), exported by ``torch.export`` with a dynamic batch
dimension and compiled by AOTInductor. Its dict result becomes two outputs (``OUTPUT__0`` and
``OUTPUT__1``, or ``RESULT[logits]`` and ``RESULT[probabilities]``).

    python export.py model.pt2

A package holds code compiled for one torch version, so none is committed: openinfer runs this
when it serves its bundled examples and the cache has no package for the installed torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


class CNN(nn.Module):
    """1x28x28 images -> 10 logits and 10 probabilities (examples/make_torchscript.py's)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Linear(8 * 7 * 7, 10)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.features(image).flatten(1))
        return {"logits": logits, "probabilities": torch.softmax(logits, dim=1)}


def main(out: str) -> None:
    model = CNN().eval()
    model.load_state_dict(torch.jit.load(str(Path(__file__).resolve().with_name("model.pt"))).state_dict())
    batch = torch.export.Dim("batch", min=1, max=1024)
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(2, 1, 28, 28),), dynamic_shapes=({0: batch},))
        torch._inductor.aoti_compile_and_package(program, package_path=out)


if __name__ == "__main__":
    main(sys.argv[1])
