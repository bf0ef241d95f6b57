"""OUTPUT0 = INPUT0: the input array goes back as is (the server sends it without a copy)."""

from __future__ import annotations

import numpy as np


def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}
