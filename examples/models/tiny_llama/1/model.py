"""A tiny Llama-architecture model (openinfer._examples.tiny_llama: random weights, built into the
cache on first use) served with the interface of Triton's vLLM backend: text_input in;
text_output, finish_reason, num_input_tokens, num_output_tokens and (asked by return_logprobs)
logprobs out, one response per token when `stream` is true, one in all otherwise.

Generation is transformers' model run step by step with its KV cache, so each token goes out as it
is made. The sampling parameters are vLLM's: temperature (1 unless given; 0 is greedy), top_p,
seed (a request's own generator), max_tokens (16 unless given) and stop; the end-of-sequence token
also stops it. The penalties are refused: this loop does not apply them. Log probabilities are
vLLM's default kind: the log-softmax of the step's raw logits (before temperature and top_p), for
the sampled token and the `logprobs` likeliest.
"""

from __future__ import annotations

import inspect

import triton_python_backend_utils as pb_utils

from openinfer._examples.vllm_io import (Candidates, answer_each, flag, logprobs_asked, logprobs_json, response,
                                         sampling, text_input)

DEFAULT_MAX_TOKENS = 16
SAMPLING_KEYS = {"max_tokens", "stop", "temperature", "top_p", "seed", "logprobs"}


def _sampling(request: object) -> dict:
    params = sampling(request, SAMPLING_KEYS, "tiny_llama")
    stops = params.get("stop") or []
    params["stop"] = [stops] if isinstance(stops, str) else list(stops)
    return params


class _Text:
    """The completion's text as its tokens come, released only where it is final: not in the
    middle of a UTF-8 character (byte-level tokens split them) and not where a stop sequence
    may be starting."""

    def __init__(self, tokenizer: object, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already released
        self.stopped = False

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for stop in self.stops:
            at = text.find(stop, self.sent)  # held back: a stop cannot start in what went out
            if at >= 0:
                self.stopped = True
                return self._release(text[:at], len(text[:at]))
        if text.endswith("\ufffd"):  # a character's bytes still coming
            return ""
        hold = max((len(s) - 1 for s in self.stops), default=0)
        return self._release(text, max(self.sent, len(text) - hold))

    def rest(self) -> str:
        """What was held back, at the end of a completion not ended by a stop sequence."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return "" if self.stopped else self._release(text, len(text))

    def _release(self, text: str, upto: int) -> str:
        piece, self.sent = text[self.sent:upto], max(self.sent, upto)
        return piece


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        from openinfer._examples import tiny_llama

        hf_logging.disable_progress_bar()  # a bar per load on the server's stderr
        folder = tiny_llama.cached()
        self.torch = torch
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.model = LlamaForCausalLM.from_pretrained(folder).eval()
        self.eos = self.model.config.eos_token_id
        # The KV cache's argument and output: `cache` from transformers 5.2x, `past_key_values` before.
        self.cache_name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.context = self.model.config.max_position_embeddings

    def execute(self, requests: list) -> None:
        answer_each(requests, self._generate)

    def _tokens(self, params: dict, ids: list[int], cancelled: object, top: int | None) -> object:
        """The completion's token ids, one at a time, sampled as `params` say, until max_tokens,
        the end-of-sequence token, or `cancelled()`; each with its candidates when `top` (the
        likeliest asked) is not None."""
        torch = self.torch
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        generator = torch.Generator()
        if params.get("seed") is not None:
            generator.manual_seed(int(params["seed"]))
        else:
            generator.seed()  # from the system
        past, step = None, torch.tensor([ids])
        with torch.inference_mode():
            for _ in range(int(params.get("max_tokens", DEFAULT_MAX_TOKENS))):
                if cancelled():
                    return
                out = self.model(input_ids=step, use_cache=True, **{self.cache_name: past})
                past, logits = getattr(out, self.cache_name), out.logits[0, -1]
                token = _sample(torch, logits, temperature, top_p, generator)
                yield token, None if top is None else self._candidates(logits, token, top)
                if token == self.eos:
                    return
                step = torch.tensor([[token]])

    def _candidates(self, logits: object, token: int, top: int) -> Candidates:
        """The sampled token, then the `top` likeliest, with their log probabilities and ranks."""
        logprobs = self.torch.log_softmax(logits.float(), dim=-1)
        rank = int((logprobs > logprobs[token]).sum()) + 1
        values, ids = logprobs.topk(top)
        pairs = [(token, float(logprobs[token]), rank)]
        pairs += [(int(i), float(v), r) for r, (v, i) in enumerate(zip(values, ids), 1)]
        return [(i, v, r, self.tokenizer.decode([i], skip_special_tokens=False)) for i, v, r in pairs]

    def _generate(self, request: object, sender: object) -> None:
        prompt = text_input(request)
        params = _sampling(request)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        max_tokens = int(params.get("max_tokens", DEFAULT_MAX_TOKENS))
        if not ids:
            raise ValueError("the prompt is empty: tiny_llama needs at least one token to continue")
        if max_tokens < 1 or len(ids) + max_tokens > self.context:
            raise ValueError(
                f"max_tokens {max_tokens} with a prompt of {len(ids)} tokens exceeds tiny_llama's context of "
                f"{self.context} tokens"
            )
        stream = flag(request, "stream", False)
        top = logprobs_asked(request, params)
        text = _Text(self.tokenizer, params["stop"])
        pieces = ["" if flag(request, "exclude_input_in_output", True) else prompt]
        steps: list[Candidates] = []  # the candidates of the tokens not yet sent

        def logprobs() -> str | None:
            return None if top is None else logprobs_json(steps)

        made = counted = 0  # tokens made, and counted in the responses sent
        finish = "length"
        for token, candidates in self._tokens(params, ids, sender.is_cancelled, top):
            made += 1
            if candidates is not None:
                steps.append(candidates)
            if token == self.eos:
                finish = "stop"
                break
            pieces.append(text.add(token))
            if text.stopped:
                finish = "stop"
                break
            if stream and any(pieces):
                sender.send(response("".join(pieces), None, len(ids), made - counted, logprobs()))
                pieces, counted, steps = [], made, []
        pieces.append(text.rest())
        sender.send(response("".join(pieces), finish, len(ids), made - counted, logprobs()),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _sample(torch: object, logits: object, temperature: float, top_p: float, generator: object) -> int:
    """The next token: the likeliest at temperature 0, else drawn from the softmax at
    `temperature`, cut to the smallest set of tokens whose probability reaches `top_p`."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p  # the first always stays
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
