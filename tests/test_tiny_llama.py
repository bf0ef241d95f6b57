"""The tiny Llama builder (openinfer._examples.tiny_llama): deterministic from its seed, atomic,
and a model that transformers loads, chats with and generates from; and the example that serves
it (examples/models/tiny_llama) through OpenAI's API, read by the openai SDK. Skipped without
transformers (the `llm` extra)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import openinfer

pytest.importorskip("transformers")
pytest.importorskip("torch")

openai = pytest.importorskip("openai")

from openinfer._examples import tiny_llama  # noqa: E402

EXAMPLE = openinfer.examples_path() / "tiny_llama"
BOUND = 60.0

FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.build(tmp_path_factory.mktemp("tiny") / "model")


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_same_seed_same_files_other_seed_other_weights(built: Path, tmp_path: Path) -> None:
    again = tiny_llama.build(tmp_path / "again")
    assert set(_contents(built)) == FILES
    assert _contents(again) == _contents(built)
    other = _contents(tiny_llama.build(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != _contents(built)["model.safetensors"]
    assert other["tokenizer.json"] == _contents(built)["tokenizer.json"]


def test_build_leaves_no_temporary_folder_and_keeps_a_finished_one(built: Path, tmp_path: Path) -> None:
    dest = tiny_llama.build(tmp_path / "m")
    before = (dest / "model.safetensors").stat().st_mtime_ns
    assert tiny_llama.build(dest) == dest  # built already: kept, the new build dropped
    assert (dest / "model.safetensors").stat().st_mtime_ns == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_transformers_loads_it_chats_and_generates(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert len(tok) == tiny_llama.VOCAB_SIZE == model.config.vocab_size
    assert model.config.head_dim == 64 and model.config.num_hidden_layers == 2
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    # The role markers are single tokens; the corpus's words are merged (fewer tokens than bytes).
    assert ids[0, :2].tolist() == [tok.bos_token_id, tok.convert_tokens_to_ids("<|user|>")]
    assert len(tok("The tiny llama walks").input_ids) < len("The tiny llama walks")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 8)
    assert tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()  # noqa: E203


def test_the_examples_tokenizer_is_the_builders(tmp_path: Path) -> None:
    """examples/models/tiny_llama holds the tokenizer's files (for its chat template and clients'
    token counts): what `--tokenizer-only` writes."""
    tiny_llama.write_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (EXAMPLE / name).read_bytes() == (tmp_path / name).read_bytes(), name


# ---- served: examples/models/tiny_llama through OpenAI's API ------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[openinfer.Server]:
    srv = openinfer.serve(openinfer.examples_path(), model_control_mode="explicit", load_models=["tiny_llama"],
                          http_port=0, grpc_port=None, metrics_port=None, threads=2, log=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture()
def client(served: openinfer.Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=BOUND, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(EXAMPLE)


HI = [{"role": "user", "content": "Tell me about the weather in the mountains."}]


def test_a_streamed_chat_is_the_unstreamed_one_in_pieces_with_the_tokenizers_counts(
    client: openai.OpenAI, tokenizer: object
) -> None:
    whole = client.chat.completions.create(model="tiny_llama", messages=HI, max_tokens=12, seed=7)
    chunks = list(client.chat.completions.create(model="tiny_llama", messages=HI, max_tokens=12, seed=7,
                                                 stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1  # streamed as made, not in one piece
    assert "".join(pieces) == whole.choices[0].message.content
    assert chunks[-1].usage == whole.usage
    prompt = tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    assert whole.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False).input_ids)
    finish = whole.choices[0].finish_reason
    assert finish == "stop" or whole.usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish


def test_greedy_completion_honours_stop_and_echo(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="tiny_llama", prompt="The tiny llama", max_tokens=24, temperature=0)
    again = client.completions.create(model="tiny_llama", prompt="The tiny llama", max_tokens=24, temperature=0)
    assert plain.choices[0].text == again.choices[0].text  # greedy: the same every time
    text = plain.choices[0].text
    stop = next(ch for ch in text[3:] if ch.isalpha())
    cut = client.completions.create(model="tiny_llama", prompt="The tiny llama", max_tokens=24, temperature=0,
                                    stop=[stop], echo=True)
    assert cut.choices[0].text == "The tiny llama" + text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens <= plain.usage.completion_tokens


def test_seed_and_temperature_decide_the_sample(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return client.completions.create(model="tiny_llama", prompt="Once upon a time", max_tokens=16,
                                         temperature=1.5, top_p=0.9, seed=seed).choices[0].text

    assert sample(1) == sample(1)
    assert len({sample(s) for s in range(2, 6)}) > 1


def test_logprobs_are_the_models_log_softmax_streamed_or_not(client: openai.OpenAI, tokenizer: object,
                                                             built: Path) -> None:
    """Greedy: the sampled token is the likeliest, its logprob the top one; the first token's
    top_logprobs are the log-softmax of the model's logits (the same weights, run here); a
    stream's chunks carry the same tokens as the whole answer, one entry per token made."""
    import torch
    from transformers import AutoModelForCausalLM

    kw = {"model": "tiny_llama", "messages": HI, "max_tokens": 8, "temperature": 0, "logprobs": True,
          "top_logprobs": 3}
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for t in content:
        assert [c.logprob for c in t.top_logprobs] == sorted((c.logprob for c in t.top_logprobs), reverse=True)
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob) and len(t.top_logprobs) == 3
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]

    prompt = tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(built)(ids).logits[0, -1]
    expected = torch.log_softmax(logits.float(), dim=-1).topk(3)
    assert [c.logprob for c in content[0].top_logprobs] == pytest.approx(expected.values.tolist(), abs=1e-4)
    assert [c.token for c in content[0].top_logprobs] == [tokenizer.decode([i]) for i in expected.indices.tolist()]


def test_a_sampled_tokens_logprob_is_at_most_the_likeliests(client: openai.OpenAI) -> None:
    done = client.completions.create(model="tiny_llama", prompt="Once upon a time", max_tokens=12, temperature=1.5,
                                     seed=3, logprobs=2)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == done.usage.completion_tokens
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= max(top.values()) + 1e-6
        if token != "\ufffd":  # a part of a character: others decode the same, and the dict keeps one
            assert top[token] == value and len(top) in (2, 3)  # the 2 likeliest, and the sampled one


def test_max_tokens_past_the_context_is_refused_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="exceeds tiny_llama's context of 512 tokens"):
        client.completions.create(model="tiny_llama", prompt="hi", max_tokens=600)


def test_penalties_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        client.completions.create(model="tiny_llama", prompt="hi", max_tokens=2, frequency_penalty=1.0)


def test_the_example_repository_serves_at_once_and_tiny_llama_once_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Served with the whole example repository, tiny_llama (seconds of imports) loads after
    start-up on a thread of its own: the rest serves meanwhile (here its load is held until the
    test lets it go), then it answers."""
    import threading

    import requests

    go = threading.Event()
    load = openinfer.Server._load_deferred_examples

    def held(self: openinfer.Server) -> None:
        go.wait(BOUND)
        load(self)

    monkeypatch.setattr(openinfer.Server, "_load_deferred_examples", held)
    with openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, metrics_port=None, threads=2,
                         log=False) as srv:
        assert requests.get(f"{srv.url}/v2/models/toy_llm/ready", timeout=BOUND).status_code == 200
        assert requests.get(f"{srv.url}/v2/models/tiny_llama/ready", timeout=BOUND).status_code != 200
        go.set()
        deadline = time.monotonic() + 120
        while requests.get(f"{srv.url}/v2/models/tiny_llama/ready", timeout=BOUND).status_code != 200:
            assert time.monotonic() < deadline, "tiny_llama never became ready"
            time.sleep(0.2)
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", timeout=BOUND, max_retries=0) as c:
            reply = c.chat.completions.create(model="tiny_llama", messages=HI, max_tokens=4, seed=1)
        assert reply.usage.completion_tokens <= 4


def test_an_example_whose_folder_fails_during_its_later_load_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error of the file system while tiny_llama loads after start-up (EMFILE, seen under
    ASan when the process is out of descriptors) leaves it out with one warning naming it and
    why, not a traceback from its thread; the rest of the repository serves on."""
    import errno
    import logging
    import os

    import requests

    from openinfer._control.control import ModelControl

    load = ModelControl._load

    def out_of_descriptors(self: ModelControl, name: str, *args: object, **kwargs: object) -> object:
        if name == "tiny_llama":
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return load(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelControl, "_load", out_of_descriptors)
    warning = f"example tiny_llama is not served: {os.strerror(errno.EMFILE)}"
    with caplog.at_level(logging.WARNING, logger="openinfer"), openinfer.serve(
        openinfer.examples_path(), http_port=0, grpc_port=None, metrics_port=None, log=False
    ) as srv:
        deadline = time.monotonic() + BOUND
        while warning not in caplog.messages:
            assert time.monotonic() < deadline, caplog.messages
            time.sleep(0.05)
        assert requests.get(f"{srv.url}/v2/models/tiny_llama/ready", timeout=BOUND).status_code == 400
        assert requests.get(f"{srv.url}/v2/models/toy_llm/ready", timeout=BOUND).status_code == 200
