"""Writes examples/models/toy_llm/tokenizer.json: the toy's byte-level tokenizer (token id = the
UTF-8 byte) in Hugging Face's format, for clients that count tokens themselves (aiperf's
--tokenizer, transformers' AutoTokenizer). A BPE model without merges over GPT-2's byte-level
alphabet, so it encodes exactly as the toy's own `tokenize` does.

    .venv/bin/python scripts/toy_tokenizer.py   (needs `tokenizers`)
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "examples" / "models" / "toy_llm" / "tokenizer.json"


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, by byte value (what ByteLevel maps bytes to)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def build() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: b for b, c in enumerate(byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(build(), encoding="utf-8")
