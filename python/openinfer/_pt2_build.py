"""The PT2 examples of the bundled repository (``examples/models/*_pt2``), compiled on first use.

A PT2 package holds code compiled for one torch version and takes tens of seconds to compile,
so none is shipped: such an example's version directory holds a recipe, ``export.py`` (run as
``python export.py OUT.pt2``), and what it reads. The package is compiled into the cache
(``<cache>/pt2/``, the torch shim's cache directory) under a name keyed by the torch version
and a digest of the version directory's files, at most once per cache: the compiling process
holds ``<package>.lock`` until it is done, and the package appears whole (``os.replace``).

The compile runs in the background (`build`), in a child process of its own that finishes
even when the server that started it stops first, so the next server finds the package. Until
it is built the example is left out (`Pending`), as when torch is missing; a server then loads
it (see `Server.start`). Where it cannot be built (no torch, no C++ compiler, or the recipe
failed: its reason is kept in ``<package>.failed``) it is left out with one log line (`Skipped`).

This module needs only the standard library to import: the child runs it by path, without
importing openinfer (whose extension, in a sanitizer run, needs a runtime the compiler must not
inherit).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module imports nothing of openinfer's at its top (see above)
    from ._config.paths import HeldFile

RECIPE = "export.py"
_FOLDER = "pt2"  # of the cache (_code_cache)
COMPILE_TIMEOUT_S = 900  # a compile still running then is killed; the next server tries again
logger = logging.getLogger("openinfer")
# The compiles this process started: kept until they end (a stopped server's wait leaves them
# running), reaped as later ones start.
_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


class Skipped(Exception):
    """The example's package cannot be built here; the message says why."""


class Pending(Exception):
    """The example's package is not built yet; `build` builds it."""


def has_recipe(version_dir: Path) -> bool:
    return (version_dir / RECIPE).is_file()


def package_path(version_dir: Path) -> Path:
    """Where the package of `version_dir`'s recipe is cached: keyed by the torch version (a
    package is tied to it) and a digest of the version directory's files. Imports torch;
    raises Skipped without it."""
    try:
        import torch
    except ImportError as e:
        raise Skipped(f"torch cannot be imported ({e})") from None
    from ._code_cache import root

    digest = hashlib.sha256()
    for path in sorted(p for p in version_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(version_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    torch_version = "".join(c if c.isalnum() or c in ".-" else "-" for c in torch.__version__)
    name = f"{version_dir.parent.name}-torch{torch_version}-{digest.hexdigest()[:12]}.pt2"
    return root() / _FOLDER / name


def _sibling(target: Path, suffix: str) -> Path:
    return target.with_name(target.name + suffix)


def _look(target: Path) -> tuple[HeldFile | None, str | None]:
    """The package at `target`, opened, if it is built, and why compiling it failed, if it did
    (its ``.failed`` marker): read from the cache folder only once it and they pass the checks
    of code (_code_cache). Raises Skipped, naming the path and why, where they do not."""
    from ._code_cache import UntrustedCache, directory, open_file, read_file
    from ._config.paths import HeldFile  # noqa: F811 - at run time

    try:
        dir_fd, folder = directory(target.parent.name, target.parent.parent)
        try:
            fd = open_file(dir_fd, target.name, folder)
            failed = read_file(dir_fd, _sibling(target, ".failed").name, folder) if fd is None else None
        finally:
            os.close(dir_fd)
    except UntrustedCache as e:
        raise Skipped(str(e)) from None
    except OSError as e:
        raise Skipped(f"the cache {target.parent} cannot be used: {e.strerror or e}") from None
    return (HeldFile(fd, target) if fd is not None else None), (failed.strip() if failed is not None else None)


def _state(version_dir: Path) -> tuple[Path, HeldFile | None]:
    """The package's path and, once it is built, the package opened. Raises Skipped where it
    cannot be built."""
    target = package_path(version_dir)
    built, failed = _look(target)
    if built is not None:
        return target, built
    if failed is not None:
        raise Skipped(
            f"compiling its package failed: {failed} "
            f"(the log: {_sibling(target, '.log')}; remove {_sibling(target, '.failed')} to try again)"
        )
    from ._torch_build import ShimBuildError, _compiler

    try:
        _compiler("c++")
    except ShimBuildError as e:
        raise Skipped(str(e).replace("serving TorchScript models", "serving a PT2 example")) from None
    return target, None


def package(version_dir: Path) -> HeldFile:
    """The cached package of the example in `version_dir`, opened. Raises Pending when it is
    not built yet, Skipped (after logging why) when it cannot be built here."""
    try:
        target, built = _state(version_dir)
    except Skipped as e:
        logger.warning("example %s is not served: %s", version_dir.parent.name, e)
        raise
    if built is None:
        raise Pending(f"its package for this torch is not built yet ({target})")
    return built


def pending(version_dir: Path) -> bool:
    """Whether the example's package can be built here and is not yet (`build` builds it)."""
    try:
        return _state(version_dir)[1] is None
    except Skipped:
        return False


def build(version_dir: Path, target: Path, env: dict[str, str], stop: threading.Event) -> Path | None:
    """Builds the package of the example in `version_dir` into `target` (`package_path`)
    unless it is built or being built (by this process or another), the compiler in the
    environment `env`, and waits for it: returns `target`, or None when it cannot be built
    (logged) or `stop` was set first. Starts one compile at most per cache."""
    name = version_dir.parent.name
    child: subprocess.Popen[bytes] | None = None
    complained = False
    while True:
        ended = child is not None and child.poll() is not None  # before the look at the files
        try:
            built, failed = _look(target)
        except Skipped as e:
            logger.warning("example %s is not served: %s", name, e)
            return None
        if built is not None:
            return target
        if failed is not None:
            logger.warning(
                "example %s is not served: compiling its package failed: %s (the log: %s)",
                name, failed, _sibling(target, ".log"),
            )  # fmt: skip
            return None
        if ended:  # ours ended with neither a package nor a reason: killed
            assert child is not None
            logger.warning(
                "example %s is not served: compiling its package ended without one (status %s; "
                "the log: %s)", name, child.returncode, _sibling(target, ".log"),
            )  # fmt: skip
            return None
        if child is None:
            try:
                child = _start(version_dir, target, env)  # None: another process holds the lock
            except Skipped as e:
                logger.warning("example %s is not served: %s", name, e)
                return None
            except OSError as e:  # the process short of descriptors for a moment: look again
                if not complained:
                    logger.warning("example %s: cannot start compiling its package yet: %s", name, e)
                complained = True
        if stop.wait(0.5):
            return None


def serve_when_built(examples: list[tuple[str, Path]], stop: threading.Event, load: Callable[[str], None]) -> None:
    """Builds the packages of `examples` (model name, version directory) one after the other
    on a thread of its own, calling `load(name)` for each that is built before `stop` is set.
    Where they go and the compiler's environment are read now, in the caller's environment."""
    from ._torch_build import child_environment

    env = child_environment()
    targets = [(name, version_dir, package_path(version_dir)) for name, version_dir in examples]

    def run() -> None:
        for name, version_dir, target in targets:
            if build(version_dir, target, env, stop) is not None and not stop.is_set():
                load(name)

    threading.Thread(target=run, name="openinfer-pt2-examples", daemon=True).start()


def _start(version_dir: Path, target: Path, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Starts the compile when no one holds the lock, handing the lock to the child (it holds
    it until it exits); returns None, starting nothing, when it is held."""
    from ._code_cache import UntrustedCache, directory, open_file

    dir_fd, folder = directory(target.parent.name, target.parent.parent)  # checked by the caller's look
    fd = log_fd = -1
    try:
        fd = open_file(dir_fd, _sibling(target, ".lock").name, folder, os.O_RDWR, create=True) or -1
        log_fd = open_file(dir_fd, _sibling(target, ".log").name, folder, os.O_WRONLY | os.O_TRUNC, create=True) or -1
    except UntrustedCache as e:
        if fd >= 0:
            os.close(fd)
        raise Skipped(str(e)) from None
    finally:
        os.close(dir_fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if os.path.isfile(target):  # built between the caller's look and the lock
            return None
        import torch

        logger.warning(
            "compiling the PT2 package of example %s for torch %s into %s in the background "
            "(once per torch version, about a minute); it is served when built",
            version_dir.parent.name, torch.__version__, target,
        )  # fmt: skip
        from ._spawn import environment, python_code

        code = (
            "import importlib.util as u; s = u.spec_from_file_location('_oi_pt2_build', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); m.child_main(sys.argv[2], sys.argv[3])"
        )
        with os.fdopen(log_fd, "wb") as log:
            log_fd = -1
            child = subprocess.Popen(
                python_code(code, __file__, str(version_dir / RECIPE), str(target)),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=target.parent,
                env=environment(env=env), pass_fds=(fd,), start_new_session=True,
            )  # fmt: skip
        with _children_lock:
            _children[:] = [c for c in _children if c.poll() is None] + [child]
        return child
    finally:
        os.close(fd)  # the child's copy keeps the lock
        if log_fd >= 0:
            os.close(log_fd)


def child_main(recipe: str, target: str) -> None:
    """In the child: runs the recipe into a temporary name, then moves the package into place;
    a recipe that fails leaves its reason (the exception's first line) in ``<target>.failed``."""
    signal.alarm(COMPILE_TIMEOUT_S)
    out = Path(target)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp{out.suffix}")  # AOTInductor wants .pt2
    try:
        sys.argv = [recipe, str(tmp)]
        runpy.run_path(recipe, run_name="__main__")
        if not tmp.is_file():
            raise RuntimeError(f"{recipe} wrote no package")
        os.replace(tmp, out)
    except Exception as e:  # the recipe's failure, kept; an interrupted compile is tried again
        import traceback

        traceback.print_exc()
        reason = (str(e).strip().splitlines() or [""])[0]
        _sibling(out, ".failed").write_text(f"{type(e).__name__}: {reason}"[:2000] + "\n")
        raise SystemExit(1) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
