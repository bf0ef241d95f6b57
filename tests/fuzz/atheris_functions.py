"""Coverage for the Python fuzz targets under atheris, applied function by function rather than
with atheris.instrument_imports: atheris 2.3.0 on CPython 3.11 miscompiles some loops (the back
edge of `while True:` in config._Parser.list lands one instruction late, so `self.peek()` runs on
the wrong object). Each function of the given modules is therefore instrumented only if the seed
corpus gives the same outcomes with it instrumented as without; the others run as they are (and
say so on standard error)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path


def files(paths: Iterable[str]) -> list[Path]:
    """The files named, and those of the directories named."""
    return [f for p in map(Path, paths) for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]


def instrument(modules: Iterable[types.ModuleType], seeds: list[bytes], outcome: Callable[[bytes], str],
               target: str) -> None:
    """Instruments every function and method defined in `modules` that atheris compiles
    faithfully: `outcome` (what one input gives, as text) must not change for any seed."""
    from atheris.instrument_bytecode import patch_code

    functions = []
    for module in modules:
        for name, obj in vars(module).items():
            if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
                functions.append((f"{module.__name__}.{name}", obj))
            elif isinstance(obj, type) and obj.__module__ == module.__name__:
                for attr, member in vars(obj).items():
                    member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                    if isinstance(member, types.FunctionType):
                        functions.append((f"{module.__name__}.{name}.{attr}", member))
    want = [outcome(s) for s in seeds]
    for name, fn in functions:
        plain = fn.__code__
        fn.__code__ = patch_code(plain, True)
        if [outcome(s) for s in seeds] != want:
            fn.__code__ = plain
            print(f"{target}: {name} left uninstrumented (atheris changes what it does)", file=sys.stderr)


def run(test_one_input: Callable[[bytes], None], outcome: Callable[[bytes], str],
        modules: Callable[[], Iterable[types.ModuleType]], name: str) -> None:
    """A Python target's command line: `--replay FILES...` runs each input once (the corpus
    check of tests/test_fuzz_corpus.py); otherwise libFuzzer through atheris over the modules
    `modules()` imports, seeded from the corpus files among the arguments."""
    if sys.argv[1:2] == ["--replay"]:
        inputs = files(sys.argv[2:])
        for f in inputs:
            test_one_input(f.read_bytes())
        print(f"replayed {len(inputs)} inputs")
        sys.exit(0)
    import atheris

    seeds = [f.read_bytes() for f in files([a for a in sys.argv[1:] if not a.startswith("-")])]
    instrument(modules(), seeds, outcome, name)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
