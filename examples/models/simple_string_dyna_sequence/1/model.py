"""Accumulates INPUT over a sequence in the implicit state ACCUMULATOR (restarted by START);
OUTPUT = (sum + END * int(CORRID)) * READY, CORRID being a string that holds an integer."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    start = inputs["START"] != 0
    total = np.where(start, inputs["INPUT"], inputs["ACCUMULATOR_IN"] + inputs["INPUT"])
    corrid = np.array([[int(c)] for c in inputs["CORRID"].reshape(-1)], dtype=np.int32)
    return {
        "OUTPUT": (total + inputs["END"] * corrid) * inputs["READY"],
        "ACCUMULATOR_OUT": total,
    }
