"""The models of tests/test_torch_aoti.py and their compilation into PT2 packages. A module
of its own, importing torch and numpy only, so that the packages compile in a child process
that does not load openinfer (under ASan its extension needs the preloaded runtime, which the
compiler the child starts must not inherit)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

# Triton's torch_aoti test datatypes, one input each (INPUT__0..5), in this order.
DTYPES = ["INT8", "INT16", "INT32", "INT64", "FP16", "FP32"]
NUMPY = {"INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32}  # fmt: skip


class Typed(torch.nn.Module):
    """One input per datatype, each [B, 3] (FP32: [B, 4], through a linear layer): outputs
    are exact for the integers, and a row of FP32 depends only on that row."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, a, b, c, d, e, f):  # type: ignore[no-untyped-def]
        return a + 1, b * 2, c - 3, d * 4, e * 2, torch.relu(self.linear(f))


class Named(torch.nn.Module):
    """Triton's README example: positional args, a dict argument, kwargs, and a dict result
    holding tensors, a tuple and dicts (some of them the inputs themselves)."""

    def forward(self, hdata, vdata, options, *, kwarg1, kw_arg2):  # type: ignore[no-untyped-def]
        return {
            "AAA": hdata + vdata,
            "ZZZ": hdata - vdata,
            "BBB": (hdata, vdata),
            "CCC": options,
            "DDD": {"KA": kwarg1, "KB": kw_arg2},
        }


class Accumulate(torch.nn.Module):
    """OUTPUT = sum of x's row + STATE (0 at START): a running sum kept as implicit state;
    x has a variable second dimension."""

    def forward(self, x, start, state):  # type: ignore[no-untyped-def]
        out = x.sum(dim=1, keepdim=True) + state * (1 - start).to(state.dtype)
        return out, out


class Complex(torch.nn.Module):
    """Static shapes and a complex output, which has no V2 datatype: the load must say so."""

    def forward(self, x):  # type: ignore[no-untyped-def]
        return x + 1, torch.view_as_complex(x.reshape(2, 2, 2).contiguous())


def typed_inputs(rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.integers(-50, 50, size=(rows, 3)).astype(NUMPY[t]) for t in DTYPES[:4]]
    out.append(rng.standard_normal((rows, 3)).astype(np.float16))
    out.append(rng.standard_normal((rows, 4)).astype(np.float32))
    return out


def compile_packages(out: Path) -> None:
    """Compiles the packages into `out` (typed.pt2, named.pt2, acc.pt2, complex.pt2)."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    with torch.no_grad():
        ep = torch.export.export(
            Typed().eval(), tuple(torch.from_numpy(a) for a in typed_inputs(2)),
            dynamic_shapes=tuple({0: batch} for _ in DTYPES),
        )  # fmt: skip
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "typed.pt2"))
        h = [torch.zeros(1, 4) for _ in range(6)]  # distinct tensors: export keeps aliases
        ep = torch.export.export(
            Named().eval(), (h[0], h[1], {"keyA": h[2], "key2": h[3]}), {"kwarg1": h[4], "kw_arg2": h[5]}
        )
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "named.pt2"))
        n = torch.export.Dim("n", min=1, max=4096)
        ep = torch.export.export(
            Accumulate().eval(), (torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int32), torch.zeros(2, 1)),
            dynamic_shapes=({0: batch, 1: n}, {0: batch}, {0: batch}),
        )  # fmt: skip
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "acc.pt2"))
        ep = torch.export.export(Complex().eval(), (torch.zeros(2, 4),))
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "complex.pt2"))


if __name__ == "__main__":
    compile_packages(Path(sys.argv[1]))
