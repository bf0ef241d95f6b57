"""A character-level text generator small enough to need no download: a fixed bigram table
(built at import from a short public-domain text) continues the prompt one character at a time,
and each word goes out as one token (TEXT, with INDEX its position) as soon as it is complete,
DELAY_MS milliseconds apart. Deterministic: the same prompt gives the same answer."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import numpy as np

_CORPUS = (
    "it was the best of times it was the worst of times it was the age of wisdom it was the age "
    "of foolishness it was the epoch of belief it was the epoch of incredulity it was the season "
    "of light it was the season of darkness it was the spring of hope it was the winter of despair "
    "we had everything before us we had nothing before us we were all going direct to heaven we "
    "were all going direct the other way "
)

_NEXT: dict[str, str] = {}
_counts: dict[str, Counter[str]] = defaultdict(Counter)
for _a, _b in zip(_CORPUS, _CORPUS[1:]):
    _counts[_a][_b] += 1
for _a, _c in _counts.items():
    # The two likeliest followers alternate with the position, so the text does not loop at once.
    _NEXT[_a] = "".join(ch for ch, _ in _c.most_common(2))


def _characters(prompt: str) -> Iterator[str]:
    last = prompt[-1:].lower() if prompt else " "
    if last not in _NEXT:
        last = " "
    step = 0
    while True:
        choices = _NEXT[last]
        last = choices[(step // 3) % len(choices)]
        step += 1
        yield last


def infer(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    prompt = inputs["PROMPT"].reshape(-1)[0]
    prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
    max_tokens = int(inputs["MAX_TOKENS"].reshape(-1)[0])
    delay = int(inputs["DELAY_MS"].reshape(-1)[0]) / 1000
    if max_tokens < 0:
        raise ValueError(f"MAX_TOKENS must be >= 0, got {max_tokens}")
    word, index = "", 0
    for ch in _characters(prompt):
        if index >= max_tokens:
            return
        word += ch
        if ch == " " and word.strip():
            if delay:
                time.sleep(delay)
            yield {"TEXT": np.array([word.encode()], dtype=object), "INDEX": np.array([index], dtype=np.int32)}
            word, index = "", index + 1
        elif ch == " ":
            word = ""
