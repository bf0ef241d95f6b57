"""The ``mlp`` example as a PyTorch 2 AOTInductor package: the same network and weights (read
from ``model.pt``, the TorchScript example), exported by ``torch.export`` with a dynamic batch
dimension (so that openinfer batches requests) and compiled by AOTInductor.

    python export.py model.pt2 [cpu|cuda]

With ``cuda`` the package is compiled for the GPU (served by an instance of KIND_GPU).

A package holds code compiled for one torch version, so none is committed: openinfer runs this
when it serves its bundled examples and the cache has no package for the installed torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


class MLP(nn.Module):
    """16 -> 32 -> 32 -> 4 with ReLU (examples/make_torchscript.py's)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main(out: str, device: str = "cpu") -> None:
    model = MLP().eval()
    model.load_state_dict(torch.jit.load(str(Path(__file__).resolve().with_name("model.pt"))).state_dict())
    model.to(device)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(2, 16, device=device),), dynamic_shapes=({0: batch},))
        torch._inductor.aoti_compile_and_package(program, package_path=out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
