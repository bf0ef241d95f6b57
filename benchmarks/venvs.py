"""The benchmarks' virtual environments under benchmarks/.venvs/<name> (git-ignored; pip from
PyPI): one per peer (peers.py) and the tools venv (matplotlib, orjson, numpy) that common.py
draws plots with when this Python lacks matplotlib. A leaf: it imports nothing of the
benchmarks, so that common.py and peers.py can both use it without importing each other."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VENVS = BENCH_DIR / ".venvs"
TOOLS = ["matplotlib", "orjson", "numpy"]  # the tools venv (peers.REQUIREMENTS["tools"])


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(BENCH_DIR.parent))
    except ValueError:
        return str(p)


class PeerUnavailable(RuntimeError):
    """A peer that could not be installed or started; str() is the exact reason."""


def _base_python() -> str:
    """The interpreter to build peer venvs from: the one under the project's .venv."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if os.path.exists(base) else shutil.which("python3") or sys.executable


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venv(name: str, packages: list[str], log: Path | None = None,
                timeout: float = 1800, no_deps: list[str] | None = None) -> Path:
    """Create benchmarks/.venvs/<name> and pip-install `packages` (from PyPI), then `no_deps`
    without their declared dependencies (a wheel whose own pins cannot be met here, its
    needs listed in `packages` instead), unless a stamp says they already are. Returns the
    venv's python; raises PeerUnavailable with pip's own last lines on failure."""
    d = VENVS / name
    stamp = d / ".installed"
    steps = [packages] + ([["--no-deps", *no_deps]] if no_deps else [])
    want = hashlib.sha256("\n".join(sum(steps, [])).encode()).hexdigest()
    have = stamp.read_text().split() if stamp.exists() else []
    if want in have:
        return venv_python(name)
    log = log or (VENVS / f"{name}.pip.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[peers] installing {' '.join(packages)} into {_rel(d)} (log {_rel(log)})",
          flush=True)
    if not venv_python(name).exists():
        r = subprocess.run([_base_python(), "-m", "venv", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise PeerUnavailable(f"python -m venv {d} failed: {r.stderr.strip()[-500:]}")
    for step in steps:
        with open(log, "a") as f:
            try:
                r = subprocess.run([str(venv_python(name)), "-m", "pip", "install",
                                    "--disable-pip-version-check", *step],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
                rc = r.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        if rc != 0:
            tail = [ln for ln in log.read_text(errors="replace").splitlines()
                    if ln.strip() and not ln.startswith("WARNING: Location")][-6:]
            raise PeerUnavailable(f"pip install {' '.join(step)} failed (rc={rc}): "
                                  + " | ".join(tail))
    stamp.write_text(" ".join(have + [want]))
    return venv_python(name)


def tools_python() -> Path:
    """The benchmark tools venv (matplotlib, orjson, numpy) — never the product's .venv."""
    return ensure_venv("tools", TOOLS)
