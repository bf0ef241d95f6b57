"""FEATURES = RAW / 255 as FP32: the scaling the mlp example model expects of its input."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"FEATURES": inputs["RAW"].astype(np.float32) / np.float32(255.0)}
