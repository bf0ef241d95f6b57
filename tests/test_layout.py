"""The house's layout holds: csrc's includes go one way (core <- codec <- transport <- client and
backends <- server <- python bindings), and python/openinfer's import graph has no cycle. Both
read the sources only (no build, no import), so a change that breaks the direction fails here
before anyone has to notice it in review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
PKG = ROOT / "python" / "openinfer"

# csrc's layers, lowest first. A file may include its own directory's headers and those of a
# lower layer, never a higher one nor a sibling of the same rank (client/ and backends/ both sit
# over transport and below server, and neither knows the other: the Python client is not a
# backend, and a backend never opens a connection). codec/ is pure functions over buffers;
# transport/ may use a codec (http2.c inflates bodies with codec/compress.h).
LAYERS = {
    "core": 0,
    "codec": 1,
    "transport": 2,
    "client": 3,
    "backends": 3,
    "server": 4,
    "python": 5,
}
# Vendored headers (ONNX Runtime's C API) are below everything.
VENDORED = {"third_party"}

# Includes that go up today, each with why; anything else that goes up fails the test.
UPWARD_ALLOWED = {
    # The Python backend runs Python models in the server's own interpreter: its tensor <-> numpy
    # conversions (bridge.c) and the numpy C API's one-time import (numpy_api.h) belong to the
    # bindings, which also build the worker processes' side, so the backend borrows them rather
    # than keeping a second copy. It is the one backend that knows CPython.
    ("backends/python_backend.h", "python/numpy_api.h"),
    ("backends/python_backend.c", "python/bridge.h"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _c_files() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in {".c", ".h", ".cpp"} and "third_party" not in p.parts)


def _includes() -> list[tuple[str, str]]:
    """(including file, included path), both relative to csrc/, for every include that names a
    csrc directory (generated protobuf headers and system headers are left out)."""
    out = []
    for path in _c_files():
        rel = path.relative_to(CSRC).as_posix()
        for inc in INCLUDE.findall(path.read_text(errors="replace")):
            top = inc.split("/", 1)[0]
            if "/" in inc and (top in LAYERS or top in VENDORED):
                out.append((rel, inc))
    return out


def test_every_csrc_directory_has_a_layer() -> None:
    """A new top-level directory under csrc/ must be placed in LAYERS (or VENDORED) here."""
    dirs = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert dirs <= set(LAYERS) | VENDORED, sorted(dirs - set(LAYERS) - VENDORED)


def test_csrc_includes_go_one_way() -> None:
    includes = _includes()
    assert len(includes) > 100, "the include scan found too little: is csrc/ where it was?"
    upward = []
    for src, inc in includes:
        src_top, inc_top = src.split("/", 1)[0], inc.split("/", 1)[0]
        if inc_top in VENDORED or inc_top == src_top:
            continue
        if LAYERS[inc_top] >= LAYERS[src_top] and (src, inc) not in UPWARD_ALLOWED:
            upward.append(f"{src} includes {inc}")
    order = "core <- codec <- transport <- client|backends <- server <- python"
    assert not upward, f"includes against the layers ({order}):\n" + "\n".join(upward)


def test_upward_exceptions_still_exist() -> None:
    """An exception that the code no longer needs is removed from UPWARD_ALLOWED, so the list
    stays the true list."""
    assert UPWARD_ALLOWED <= set(_includes())


def test_server_front_doors_are_leaves() -> None:
    """server/api/ holds the protocol front ends over server/infer.c: the request path, the
    scheduling, the registry and the observability code never include them (only another front
    door may, as the legacy API's two transports share legacy.h)."""
    wrong = [f"{src} includes {inc}" for src, inc in _includes()
             if inc.startswith("server/api/") and not src.startswith("server/api/")]
    assert not wrong, "\n".join(wrong)


def test_csrc_includes_resolve() -> None:
    """Every include of a csrc path names a file that exists (a move that missed a line fails
    here, also for a file the build does not compile, such as a header no .c includes)."""
    missing = [f"{src} includes {inc}" for src, inc in _includes() if not (CSRC / inc).is_file()]
    for rel in ("tests/fuzz", "benchmarks/c"):
        for path in sorted((ROOT / rel).glob("*.[ch]")):
            for inc in INCLUDE.findall(path.read_text()):
                if inc.split("/", 1)[0] in LAYERS and not (CSRC / inc).is_file():
                    missing.append(f"{path.relative_to(ROOT)} includes {inc}")
    assert not missing, "\n".join(missing)
