"""Fuzz target for config.pbtxt (python/openinfer/config.py) under atheris, libFuzzer for
Python: the input, as UTF-8 text (what load_config reads; other bytes are refused there before
parsing), goes through the text-format parser and ModelConfig.from_dict. The contract is that
a config is either read or refused with ConfigError naming where and why: any other exception
(a RecursionError from deep nesting, a TypeError from an unexpected value kind, ...) is a bug
and ends the run with the input saved.

    .venv/bin/python tests/fuzz/fuzz_config.py -max_total_time=60 WORKDIR tests/fuzz/corpus/fuzz_config
    .venv/bin/python tests/fuzz/fuzz_config.py --replay tests/fuzz/corpus/fuzz_config   (no atheris needed)

`make fuzz` runs the first form (with PYTHONPATH=python).

Coverage comes from atheris's bytecode instrumentation, function by function (see
atheris_functions.py).
"""

from __future__ import annotations

import types

from atheris_functions import run


def test_one_input(data: bytes) -> None:
    from openinfer.config import ConfigError, ModelConfig, parse

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        config = ModelConfig.from_dict(parse(text, "config.pbtxt"), "config.pbtxt")
    except ConfigError as e:
        if not str(e).startswith("config.pbtxt"):
            raise AssertionError(f"a ConfigError that does not say where: {e}") from None
        return
    config.instances  # what the repository reads next


def _outcome(data: bytes) -> str:
    """What parsing `data` gives, as text to compare runs with."""
    try:
        test_one_input(data)
        from openinfer.config import ModelConfig, parse

        return repr(ModelConfig.from_dict(parse(data.decode("utf-8"), "config.pbtxt"), "config.pbtxt"))
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return f"{type(e).__name__}: {e}"


def _modules() -> list[types.ModuleType]:
    import openinfer.config

    return [openinfer.config]


if __name__ == "__main__":
    run(test_one_input, _outcome, _modules, "fuzz_config")
