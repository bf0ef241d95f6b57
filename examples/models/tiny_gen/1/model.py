"""A tiny text generator that needs no download: it continues the prompt from a short
public-domain text it carries (after the last word of the prompt it knows, else from the
start), one word per token, each sent as soon as it is ready (TEXT, with INDEX its position),
DELAY_MS milliseconds apart. Deterministic: the same prompt gives the same answer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

_WORDS = (
    "it was the best of times it was the worst of times it was the age of wisdom it was the age "
    "of foolishness it was the epoch of belief it was the epoch of incredulity it was the season "
    "of light it was the season of darkness it was the spring of hope it was the winter of despair "
    "we had everything before us we had nothing before us we were all going direct to heaven we "
    "were all going direct the other way"
).split()


def _continuation(prompt: str) -> Iterator[str]:
    words = prompt.lower().split()
    start = 0
    if words and words[-1] in _WORDS:
        start = _WORDS.index(words[-1]) + 1
    i = start
    while True:
        yield _WORDS[i % len(_WORDS)]
        i += 1


def infer(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    prompt = inputs["PROMPT"].reshape(-1)[0]
    prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
    max_tokens = int(inputs["MAX_TOKENS"].reshape(-1)[0])
    delay = int(inputs["DELAY_MS"].reshape(-1)[0]) / 1000
    if max_tokens < 0:
        raise ValueError(f"MAX_TOKENS must be >= 0, got {max_tokens}")
    words = _continuation(prompt)
    for index in range(max_tokens):
        if delay:
            time.sleep(delay)
        token = next(words) + " "
        yield {"TEXT": np.array([token.encode()], dtype=object), "INDEX": np.array([index], dtype=np.int32)}
