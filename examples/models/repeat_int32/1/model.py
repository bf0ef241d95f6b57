"""Triton's decoupled "repeat_int32": for each element of IN, after DELAY[i] ms, one response
with OUT = [IN[i]] and IDX = [i]; IN of shape [0] gives no response."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    values, delays = inputs["IN"], inputs["DELAY"]
    if values.shape != delays.shape:
        raise ValueError(
            f"expected IN and DELAY shape to match, got {list(values.shape)} and {list(delays.shape)}."
        )
    for idx in range(values.size):
        time.sleep(int(delays[idx]) / 1000)
        yield {"OUT": values[idx : idx + 1].copy(), "IDX": np.array([idx], dtype=np.uint32)}
