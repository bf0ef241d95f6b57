"""The tiny Llama builder (openinfer._examples.tiny_llama): deterministic from its seed, atomic,
and a model that transformers loads, chats with and generates from. Skipped without
transformers (the `llm` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from openinfer._examples import tiny_llama  # noqa: E402

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
