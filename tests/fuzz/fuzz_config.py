"""Fuzz target for config.pbtxt (python/openinfer/config.py) under atheris, libFuzzer for
Python: the input, as UTF-8 text (what load_config reads; other bytes are refused there before
parsing), goes through the text-format parser and ModelConfig.from_dict. The contract is that
a config is either read or refused with ConfigError naming where and why: any other exception
(a RecursionError from deep nesting, a TypeError from an unexpected value kind, ...) is a bug
and ends the run with the input saved.

    .venv/bin/python tests/fuzz/fuzz_config.py -max_total_time=60 WORKDIR tests/fuzz/corpus/fuzz_config
    .venv/bin/python tests/fuzz/fuzz_config.py --replay tests/fuzz/corpus/fuzz_config   (no atheris needed)

`make fuzz` runs the first form (with PYTHONPATH=python).

Coverage comes from atheris's bytecode instrumentation, applied function by function rather
than with atheris.instrument_imports: atheris 2.3.0 on CPython 3.11 miscompiles some loops (the
back edge of `while True:` in _Parser.list lands one instruction late, so `self.peek()` runs
on the wrong object). Each function is therefore instrumented only if the seed corpus parses
to the same results with it instrumented as without; the others run as they are (and say so).
"""

from __future__ import annotations

import sys
from pathlib import Path


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


def _files(paths: list[str]) -> list[Path]:
    return [f for p in map(Path, paths) for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]


def _outcome(data: bytes) -> str:
    """What parsing `data` gives, as text to compare runs with."""
    try:
        test_one_input(data)
        from openinfer.config import ModelConfig, parse

        return repr(ModelConfig.from_dict(parse(data.decode("utf-8"), "config.pbtxt"), "config.pbtxt"))
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return f"{type(e).__name__}: {e}"


def instrument(seeds: list[bytes]) -> None:
    """Instruments every function of openinfer.config that atheris compiles faithfully (see
    the module docstring)."""
    import types

    import openinfer.config as config
    from atheris.instrument_bytecode import patch_code

    functions = []
    for name, obj in vars(config).items():
        if isinstance(obj, types.FunctionType) and obj.__module__ == config.__name__:
            functions.append((name, obj))
        elif isinstance(obj, type) and obj.__module__ == config.__name__:
            for attr, member in vars(obj).items():
                member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if isinstance(member, types.FunctionType):
                    functions.append((f"{name}.{attr}", member))
    want = [_outcome(s) for s in seeds]
    for name, fn in functions:
        plain = fn.__code__
        fn.__code__ = patch_code(plain, True)
        if [_outcome(s) for s in seeds] != want:
            fn.__code__ = plain
            print(f"fuzz_config: {name} left uninstrumented (atheris changes what it does)", file=sys.stderr)


def replay(paths: list[str]) -> int:
    files = _files(paths)
    for f in files:
        test_one_input(f.read_bytes())
    print(f"replayed {len(files)} inputs")
    return 0


def main() -> None:
    if sys.argv[1:2] == ["--replay"]:
        sys.exit(replay(sys.argv[2:]))
    import atheris

    seeds = [f.read_bytes() for f in _files([a for a in sys.argv[1:] if not a.startswith("-")])]
    instrument(seeds)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
