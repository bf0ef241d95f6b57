"""OUTPUT = (INPUT + START) * READY (INT32), as Triton's simple_sequence example computes it."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT": (inputs["INPUT"] + inputs["START"]) * inputs["READY"]}
