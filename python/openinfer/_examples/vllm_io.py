"""What the example language models (examples/models/toy_llm, tiny_llama) share: the inputs and
outputs of Triton's vLLM backend, read and written through Triton's Python-backend utilities."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import numpy as np

from .._backends import triton_utils as pb_utils


def flag(request: object, name: str, default: bool) -> bool:
    """A BOOL input (`stream`, `exclude_input_in_output`), `default` when not sent."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else bool(t.as_numpy().reshape(-1)[0])


def text_input(request: object) -> str:
    """The prompt (`text_input`)."""
    return pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()


def sampling(request: object, supported: set[str], model: str) -> dict:
    """The `sampling_parameters` JSON object ({} when not sent); ValueError naming the keys
    outside `supported`."""
    t = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    params = json.loads(t.as_numpy().reshape(-1)[0]) if t is not None else {}
    unknown = sorted(set(params) - supported)
    if unknown:
        raise ValueError(f"sampling parameters {unknown} are not supported by {model}")
    return params


# One token's log probabilities: (token id, logprob, rank from 1, decoded text) of the sampled
# token first, then of the likeliest.
Candidates = list[tuple[int, float, int, str]]


def logprobs_asked(request: object, params: dict) -> int | None:
    """How many likeliest tokens the client asked besides the sampled one (sampling_parameters'
    `logprobs`, vLLM's SamplingParams.logprobs) when `return_logprobs` is sent, else None."""
    if not flag(request, "return_logprobs", False) or params.get("logprobs") is None:
        return None
    return int(params["logprobs"])


def logprobs_json(tokens: list[Candidates]) -> str:
    """The `logprobs` output of Triton's vLLM backend for one response's tokens: a list with,
    per token, {token_id: {"logprob", "rank", "decoded_token"}} in the candidates' order (a
    sampled token among the likeliest appears once, where it came first, as in vLLM's dict)."""
    return json.dumps([{str(tid): {"logprob": lp, "rank": rank, "decoded_token": text} for tid, lp, rank, text in step}
                       for step in tokens])


@functools.lru_cache(maxsize=4096)
def _constant(value: bytes | int, dtype: type) -> np.ndarray:
    """A one-item output array made once and shared, read-only, by every response that carries
    the same finish reason or count: a streamed answer's tokens repeat them."""
    array = np.array([value], dtype=dtype)
    array.flags.writeable = False
    return array


def response(text: str, finish: str | None, n_in: int, n_out: int, logprobs: str | None = None) -> object:
    """One response: its text, why the completion ended (None: not yet), the prompt's tokens,
    the tokens this response carries and, when asked, their `logprobs` (logprobs_json)."""
    tensors = [
        pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
        pb_utils.Tensor("finish_reason", _constant((finish or "").encode(), np.object_)),
        pb_utils.Tensor("num_input_tokens", _constant(n_in, np.uint32)),
        pb_utils.Tensor("num_output_tokens", _constant(n_out, np.uint32)),
    ]
    if logprobs is not None:
        tensors.append(pb_utils.Tensor("logprobs", np.array([logprobs.encode()], dtype=np.object_)))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def answer_each(requests: list, generate: Callable[[object, object], None]) -> None:
    """A decoupled execute: `generate(request, sender)` for each request in turn; one that raises
    ValueError (a request the model cannot honour) ends with INVALID_ARG, a 400 for OpenAI's
    client."""
    for request in requests:
        sender = request.get_response_sender()
        try:
            generate(request, sender)
        except ValueError as e:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
