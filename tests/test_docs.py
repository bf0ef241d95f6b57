"""The documentation site builds with `mkdocs build --strict` (broken links, missing pages and
docstrings that do not resolve are errors), and docs/config.md's support table cannot drift
from the refuse/warn policy in openinfer._config.triton_config."""

from __future__ import annotations

import ast
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import openinfer
from openinfer._config import triton_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG_MD = ROOT / "docs" / "config.md"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "getting-started/index.html", "api/index.html", "config/index.html", "design/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text()
    # The reference is generated from the docstrings, not written by hand.
    for name in ("server.serve", "server.Server", "client.Client", "model.Model", "testing.openinfer_server"):
        assert f'id="openinfer.{name}"' in api, name
    # serve()'s docstring, rendered: the page is generated, not written by hand.
    assert "Serves the models of repository" in api


def _policy() -> list[tuple[str, str, str]]:
    """(field, "Refused" or "Advisory", reason) for every refuse()/warn() call in
    triton_config.unsupported, read from its source: f-string parts bound by a `for` over a
    literal tuple are expanded, and list indices (`[{i}]`) become `[]`."""
    tree = ast.parse(Path(triton_config.__file__).read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "unsupported")
    out: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, loops: dict[str, list[str]]) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            loops = {**loops, node.target.id: [ast.literal_eval(e) for e in node.iter.elts]}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("refuse", "warn"):
            field, why = node.args
            status = "Refused" if node.func.id == "refuse" else "Advisory"
            parts: list[list[str]] = []
            for piece in field.values if isinstance(field, ast.JoinedStr) else [field]:
                if isinstance(piece, ast.Constant):
                    parts.append([piece.value])
                else:
                    name = piece if isinstance(piece, ast.Name) else piece.value  # type: ignore[attr-defined]
                    parts.append(loops.get(name.id, ["{index}"]))
            for combo in itertools.product(*parts):
                out.append(("".join(combo).replace("[{index}]", "[]"), status, ast.literal_eval(why)))
        for child in ast.iter_child_nodes(node):
            visit(child, loops)

    visit(func, {})
    return out


def _rows() -> list[tuple[list[str], str, str]]:
    rows = []
    for line in CONFIG_MD.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1], cells[2]))
    return rows


def test_config_table_covers_every_refused_and_advisory_field() -> None:
    policy = _policy()
    assert len(policy) > 20  # the extraction itself works
    rows = _rows()
    for field, status, why in policy:
        if " {" in field:  # "response_cache { enable: true }": a value of the field, in the notes
            top = field.split(" ")[0]
            notes = [n for names, _, n in rows if top in names]
            assert notes and f"`{field}`: {status} — {why}" in notes[0], (field, notes)
            continue
        match = [(s, n) for names, s, n in rows if field in names]
        assert match, f"docs/config.md has no row for {field}"
        assert match[0] == (status, why), (field, match[0], (status, why))


def test_config_table_has_every_top_level_field() -> None:
    named = {n.split(".")[0].split("[")[0] for names, _, _ in _rows() for n in names}
    missing = [f.name for f in triton_config.MESSAGES["ModelConfig"] if f.name not in named]
    assert not missing, f"docs/config.md has no row for {missing}"


def test_getting_started_notebook_runs(tmp_path: Path) -> None:
    """examples/notebooks/getting_started.ipynb, executed headless in a fresh kernel (this
    interpreter, with this environment): every cell runs without error and shows what the
    prose says it shows."""
    import nbclient
    import nbformat

    nb = nbformat.read(ROOT / "examples" / "notebooks" / "getting_started.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    # The kernel imports the openinfer under test (the sanitizer run's PYTHONPATH is relative,
    # and the kernel runs in tmp_path).
    package_root = str(Path(openinfer.__file__).resolve().parent.parent)
    client.execute(env={**os.environ, "PYTHONPATH": package_root})

    def text(cell: Any) -> str:
        return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "<openinfer.Server http://127.0.0.1:" in text(code[0]) and "simple" in text(code[0])
    assert "array([[ 1,  2,  3," in text(code[1]) and "16]]" in text(code[1])
    assert "array([[-1,  0,  1," in text(code[2])
    assert "[404] Request for unknown model: 'no_such_model'" in text(code[3])
    assert "[0. 2. 4. 6.]" in text(code[-1])


def test_features_document_the_response_cache_and_its_metrics() -> None:
    """docs/features.md describes the response cache the server has (it once said there was
    none) and names each per-model cache family that csrc/server/observe/metrics.c exports."""
    features = (ROOT / "docs" / "features.md").read_text()
    families = set(re.findall(r'"(nv_cache_[a-z_]+)"', (ROOT / "csrc" / "server" / "observe" / "metrics.c").read_text()))
    assert len(families) == 6, families  # four counters, two summaries
    assert "no response cache" not in features
    assert "Response cache (Triton's)" in features and "--cache-config local,size=BYTES" in features
    for family in sorted(families):
        assert f"`{family}`" in features, family
