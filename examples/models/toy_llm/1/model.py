"""A deterministic toy language model with the interface of Triton's vLLM backend, for OpenAI's
API without a download: text_input in; text_output, finish_reason, num_input_tokens and
num_output_tokens out, one response per token when `stream` is true, one in all otherwise.

Tokens are UTF-8 bytes (the tokenizer is `tokenize` below). The continuation is read from TEXT,
starting at a place the prompt picks (and, with a temperature above 0, the seed: a random place
without one; the temperature defaults to 0, so that the toy is deterministic), up to the end of
the sentence (finish_reason "stop"), a stop sequence ("stop", the sequence left out) or
max_tokens ("length"). A toy has one candidate per step, so top_p and the
penalties are accepted and change nothing.
"""

from __future__ import annotations

import json
import random
import time

import triton_python_backend_utils as pb_utils

from openinfer._examples.vllm_io import answer_each, flag, response, sampling, text_input

TEXT = (
    "The quick brown fox jumps over the lazy dog. A small model answers every question with a sentence. "
    "Servers stream tokens to clients as they are made. Every request gets its own answer. "
)
CONTEXT = 4096  # tokens: the prompt and its completion together
DEFAULT_MAX_TOKENS = 16
SAMPLING_KEYS = {"max_tokens", "stop", "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"}


def tokenize(text: str) -> list[int]:
    """The byte-level tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


def continuation(prompt: str, params: dict) -> tuple[str, str]:
    """The completion of `prompt` and why it ended ("stop" or "length")."""
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
            return text[:at], "stop"
    return text, "stop" if text.endswith(".") else "length"


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("token_delay_ms", {}).get("string_value", "0")
        self.delay = float(delay) / 1000

    def execute(self, requests: list) -> None:
        answer_each(requests, self._generate)

    def _generate(self, request: object, sender: object) -> None:
        prompt = text_input(request)
        text, finish = continuation(prompt, sampling(request, SAMPLING_KEYS, "toy_llm"))
        n_in = len(tokenize(prompt))
        echo = "" if flag(request, "exclude_input_in_output", True) else prompt
        if not flag(request, "stream", False):
            sender.send(response(echo + text, finish, n_in, len(tokenize(text))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        tokens = tokenize(text)
        for i, token in enumerate(tokens):
            if sender.is_cancelled():
                break
            time.sleep(self.delay)
            piece = (echo if i == 0 else "") + bytes([token]).decode()
            sender.send(response(piece, finish if i == len(tokens) - 1 else None, n_in, 1))
        if not tokens:
            sender.send(response(echo, finish, n_in, 0))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
