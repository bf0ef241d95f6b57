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
# transport/ may use a codec (grpc_recv.c inflates bodies with codec/compress.h).
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
    # For the same reason, a Triton Python model's execute called by the core: the bindings'
    # TritonExecute (triton_execute.c, which the worker processes run too) and the pb_utils
    # response type it answers with (pb_objects.c).
    ("backends/python_backend.c", "python/triton_execute.h"),
    ("backends/python_backend.c", "python/pb_objects.h"),
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


# python/openinfer: the import graph, read with ast.

EXTENSIONS = {"openinfer._core"}  # compiled: imports nothing of the package


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: never executed (annotations are strings under
    `from __future__ import annotations`), so they are no edge of the graph."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports. Imports at module level and inside functions
    both count: a function-level import is only a deferred edge, and a circle through one
    still ties the modules together (it is how model -> processes -> repository -> model hid).
    `from .x import name` counts as an edge to x.name when that is a module, else to x; the
    implicit import of a parent package (importing a.b runs a/__init__) is not counted, so a
    package's __init__ may import lazily what imports names from it."""
    paths = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                found = [f"{module}.{a.name}" if f"{module}.{a.name}" in paths | dict.fromkeys(EXTENSIONS)
                         else module for a in node.names]
            else:
                continue
            for target in found:
                if target.split(".")[0] != "openinfer" or target in EXTENSIONS:
                    continue
                while target not in paths:
                    target = target.rpartition(".")[0]
                if target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_import_graph_sees_the_package() -> None:
    graph = import_graph()
    assert len(graph) > 30 and "openinfer._backends.processes" in graph["openinfer.model"], graph["openinfer.model"]
    # A function-level import is an edge (cli imports the server only when it serves).
    assert "openinfer.server" in graph["openinfer.cli"]


def test_python_package_has_no_import_cycle() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles in python/openinfer:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_public_api_is_where_it_was() -> None:
    """The moves change no public name: every name of openinfer.__all__, the modules users and
    the docs import by name, and the `python -m` entry points the Makefile, the Dockerfile and
    the worker spawner run."""
    import importlib

    import openinfer

    for name in openinfer.__all__:
        assert getattr(openinfer, name) is not None, name
    for module in ("openinfer.model", "openinfer.config", "openinfer.client", "openinfer.server", "openinfer.shm",
                   "openinfer.errors", "openinfer.testing", "openinfer.cli", "openinfer._worker",
                   "openinfer._torch_build", "openinfer.__main__"):
        assert (PKG / (module.split(".", 1)[1].replace(".", "/") + ".py")).is_file(), module
    assert importlib.import_module("openinfer.cli").main
    assert importlib.import_module("openinfer.testing").server_fixture
    assert openinfer.__version__ == importlib.import_module("openinfer._version").__version__


def test_python_subpackages_import_one_way() -> None:
    """The internal rooms go _control -> _repository -> _backends -> _config, as design.md's
    layout says: a room never imports one above it."""
    order = ["openinfer._config", "openinfer._backends", "openinfer._repository", "openinfer._control"]

    def room(module: str) -> int | None:
        return next((i for i, r in enumerate(order) if module == r or module.startswith(r + ".")), None)

    upward = [f"{src} imports {dst}" for src, targets in import_graph().items() for dst in targets
              if room(src) is not None and room(dst) is not None and room(dst) > room(src)]
    assert not upward, "\n".join(upward)


def test_benchmarks_have_no_import_cycle() -> None:
    """benchmarks/: venvs <- common <- peers <- wrk_vs_nginx <- the scenarios (each file imports
    its siblings by name, with benchmarks/ on sys.path)."""
    bench = ROOT / "benchmarks"
    siblings = {p.stem for p in bench.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in siblings:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((bench / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps.add(node.module.split(".")[0])
        graph[name] = (deps & siblings) - {name}
    assert "common" in graph["peers"], graph["peers"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles in benchmarks/:\n" + "\n".join(" <-> ".join(c) for c in cycles)
