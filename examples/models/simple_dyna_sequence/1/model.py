"""OUTPUT = (INPUT + START + END * CORRID) * READY (INT32, the UINT64 correlation id wrapping to
INT32), as Triton's simple_dyna_sequence example computes it."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    corrid = inputs["CORRID"].astype(np.int32)
    total = inputs["INPUT"] + inputs["START"] + inputs["END"] * corrid
    return {"OUTPUT": total * inputs["READY"]}
