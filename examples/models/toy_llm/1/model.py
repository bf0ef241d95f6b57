"""A deterministic toy language model with the interface of Triton's vLLM backend, for OpenAI's
API without a download: text_input in; text_output, finish_reason, num_input_tokens,
num_output_tokens and (asked by return_logprobs) logprobs out, one response per token when
`stream` is true, one in all otherwise.

Tokens are UTF-8 bytes (the tokenizer is `tokenize` below). The continuation is read from TEXT,
starting at a place the prompt picks (and, with a temperature above 0, the seed: a random place
without one; the temperature defaults to 0, so that the toy is deterministic), up to the end of
the sentence (finish_reason "stop"), a stop sequence ("stop", the sequence left out) or
max_tokens ("length"). A toy has one candidate per step, so top_p and the
penalties are accepted and change nothing.

Its log probabilities are made up, the same at every step: the token it gives has probability
1/2, and the distinct bytes that follow it in TEXT 1/4, 1/8, ... (rank r: log 2^-r).
"""

from __future__ import annotations

import json
import math
import random
import time

import triton_python_backend_utils as pb_utils

from openinfer._examples.vllm_io import (Candidates, answer_each, flag, logprobs_asked, logprobs_json, response,
                                         sampling, text_input)

TEXT = (
    "The quick brown fox jumps over the lazy dog. A small model answers every question with a sentence. "
    "Servers stream tokens to clients as they are made. Every request gets its own answer. "
)
CONTEXT = 4096  # tokens: the prompt and its completion together
DEFAULT_MAX_TOKENS = 16
SAMPLING_KEYS = {"max_tokens", "stop", "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty",
                 "logprobs"}


def tokenize(text: str) -> list[int]:
    """The byte-level tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


def continuation(prompt: str, params: dict) -> tuple[str, str, int]:
    """The completion of `prompt`, why it ended ("stop" or "length") and where in TEXT it starts."""
    max_tokens = int(params.get("max_tokens", DEFAULT_MAX_TOKENS))
    prompt_tokens = len(tokenize(prompt))
    if max_tokens < 1 or prompt_tokens + max_tokens > CONTEXT:
        raise ValueError(
            f"max_tokens {max_tokens} with a prompt of {prompt_tokens} tokens exceeds toy_llm's context of "
            f"{CONTEXT} tokens"
        )
    start = sum(tokenize(prompt)) % len(TEXT)
    if float(params.get("temperature", 0)) > 0:
        sampler = random.Random(params.get("seed"))  # no seed: seeded from the system
        start = (start + sampler.randrange(len(TEXT))) % len(TEXT)
    text = ""
    for i in range(max_tokens):
        text += TEXT[(start + i) % len(TEXT)]
        if text.endswith("."):
            break
    stops = params.get("stop") or []
    for stop in [stops] if isinstance(stops, str) else stops:
        at = text.find(stop)
        if at >= 0:
            return text[:at], "stop", start
    return text, "stop" if text.endswith(".") else "length", start


def candidates(position: int, top: int) -> Candidates:
    """The token at TEXT[position] (rank 1) and the distinct bytes after it, `top` in all (at
    least the token itself), with the toy's log probabilities."""
    seen: list[int] = []
    for i in range(len(TEXT)):
        byte = ord(TEXT[(position + i) % len(TEXT)])
        if byte not in seen:
            seen.append(byte)
        if len(seen) == max(top, 1):
            break
    return [(byte, -rank * math.log(2), rank, chr(byte)) for rank, byte in enumerate(seen, 1)]


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("token_delay_ms", {}).get("string_value", "0")
        self.delay = float(delay) / 1000

    def execute(self, requests: list) -> None:
        answer_each(requests, self._generate)

    def _generate(self, request: object, sender: object) -> None:
        prompt = text_input(request)
        params = sampling(request, SAMPLING_KEYS, "toy_llm")
        text, finish, start = continuation(prompt, params)
        top = logprobs_asked(request, params)
        n_in = len(tokenize(prompt))
        echo = "" if flag(request, "exclude_input_in_output", True) else prompt

        def logprobs(first: int, n: int) -> str | None:  # of the text's tokens first .. first + n
            return None if top is None else logprobs_json([candidates(start + i, top) for i in range(first, first + n)])

        tokens = tokenize(text)
        if not flag(request, "stream", False):
            sender.send(response(echo + text, finish, n_in, len(tokens), logprobs(0, len(tokens))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i, token in enumerate(tokens):
            if sender.is_cancelled():
                break
            if self.delay:  # a sleep, even of 0, is a syscall and hands the GIL over
                time.sleep(self.delay)
            piece = (echo if i == 0 else "") + bytes([token]).decode()
            sender.send(response(piece, finish if i == len(tokens) - 1 else None, n_in, 1, logprobs(i, 1)))
        if not tokens:
            sender.send(response(echo, finish, n_in, 0, logprobs(0, 0)))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
