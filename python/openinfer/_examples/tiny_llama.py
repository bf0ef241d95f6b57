"""A tiny Llama-architecture language model, built locally from nothing downloaded: random weights
from a seed and a byte-level BPE tokenizer trained on a few kilobytes of text kept beside this file
(``tiny_llama_corpus.txt``). It talks nonsense, fast, which is what a serving example, a test and a
benchmark of the serving path need; any server that loads a Hugging Face folder (transformers,
vLLM) loads it.

    python -m openinfer._examples.tiny_llama DEST [--seed N]

`build` needs torch, transformers and tokenizers (``pip install 'openinfer[llm]'``). Building twice
with the same seed (and the same library versions) writes identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CORPUS = Path(__file__).with_name("tiny_llama_corpus.txt")
VOCAB_SIZE = 512
BOS, EOS = "<s>", "</s>"
# Role markers, as Llama-style chat templates write them; special so that a user's text cannot
# forge one (the tokenizer never merges into them).
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# hidden 256 over 4 heads: head dimension 64, the smallest vLLM's CPU attention takes.
ARCHITECTURE = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 512,
}
ROPE_THETA = 10000.0  # transformers' default for Llama


def train_tokenizer() -> "tokenizers.Tokenizer":  # type: ignore[name-defined]  # noqa: F821
    """Byte-level BPE (GPT-2's byte alphabet, so every text encodes) with VOCAB_SIZE entries,
    trained on CORPUS; the special tokens take the first ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS.read_text(encoding="utf-8")], trainer=trainer)
    return tok


def _write(out: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    # Written here rather than by transformers' tokenizer, whose class names differ between its
    # versions: PreTrainedTokenizerFast reads tokenizer.json in all of them (and in vLLM).
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": ARCHITECTURE["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    })  # fmt: skip
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        tie_word_embeddings=False,
        **ARCHITECTURE,
    )
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 names the rope base and the dtype differently from 4.x (what vLLM may
    # bring): both spellings, so either reads the same model.
    saved = json.loads((out / "config.json").read_text())
    _write_json(out / "config.json", {**saved, "rope_theta": ROPE_THETA, "torch_dtype": "float32"})
    mask = _umask()  # mkdtemp's 0700 (and some writers' 0600) would keep it from other users
    os.chmod(out, 0o777 & ~mask)
    for path in out.iterdir():
        os.chmod(path, 0o666 & ~mask)


def _write_json(path: Path, value: dict[str, object]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def build(dest: Path, seed: int = 0) -> Path:
    """Writes the model's Hugging Face folder (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, generation_config.json) at `dest` and returns it. Built beside it under
    a temporary name and renamed into place, so `dest` appears whole; where another builder got
    there first, its folder is kept."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write(tmp, seed)
        try:
            os.rename(tmp, dest)
        except OSError:  # dest exists: built meanwhile by someone else
            if not (dest / "model.safetensors").is_file():
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="the weights' random seed")
    args = parser.parse_args()
    print(build(args.dest, args.seed))


if __name__ == "__main__":
    main()
