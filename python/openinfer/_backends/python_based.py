"""Python-based backends, as Triton defines them (the backend repository's
docs/python_based_backends.md): a model whose config.pbtxt says ``backend: "NAME"``, where NAME
is none of openinfer's own backends, runs ``NAME/model.py`` of a backend directory, a
``TritonPythonModel`` shared by every model that names the backend, with the modules beside it
(``NAME/utils/``) importable by it. Triton's vLLM backend is one (``backend: "vllm"``).

Backend directories are searched in order: those given with ``--backend-directory``, then the
one openinfer ships (`BUNDLED`, which holds Triton's vLLM backend). A backend's folder is code
the server runs, so it is checked as the cache is (`_code_cache.untrusted`): the backend
directory itself and everything in the backend's folder must be owned by the server's user (or
root) and writable by neither group nor others; symbolic links are not followed. The checks are
made on descriptors, and model.py is read from the descriptor that was checked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import _code_cache
from .._config.paths import printable
from .model_file import _LoadError

# The backend directory openinfer owns: Triton's vLLM backend (vllm/, see its README.md).
BUNDLED = Path(__file__).resolve().parents[1] / "backends"
MODEL_FILE = "model.py"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True)
class Backend:
    """A Python-based backend found for a model: its model.py (path and the bytes read from the
    checked descriptor) and the folder that holds it, whose modules model.py imports."""

    name: str
    folder: Path
    source: bytes

    @property
    def model_file(self) -> Path:
        return self.folder / MODEL_FILE


def search_path(given: Sequence[str | os.PathLike[str]] = ()) -> tuple[Path, ...]:
    """The backend directories searched, in order: `given` (--backend-directory), then BUNDLED."""
    return (*(Path(d) for d in given), BUNDLED)


def find(name: str, directories: Sequence[Path]) -> Backend:
    """The Python-based backend `name`: the first of `directories` with a ``name/model.py``.
    Raises _LoadError for a name that is not one folder's name, a backend folder that fails
    the ownership checks, or no such backend (Triton's words)."""
    if not name or name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise _LoadError(
            f"backend '{printable(name)}' is not a backend name: it names a folder of the backend "
            "directory, so it cannot hold '/', start with '.' or be '..'"
        )
    for top in directories:
        try:
            top_fd = os.open(top, _DIR)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise _LoadError(f"backend directory {top}: cannot be opened: {e.strerror or e}") from None
        try:
            found = _open_backend(top_fd, top, name)
        finally:
            os.close(top_fd)
        if found is not None:
            return found
    searched = ", ".join(f"'{d / name / MODEL_FILE}'" for d in directories)
    raise _LoadError(
        f"unable to find backend library for backend '{name}', try specifying runtime on the model "
        f"configuration. (openinfer serves python, pytorch, onnxruntime and identity models, and "
        f"Python-based backends; searched: {searched})"
    )


def _open_backend(top_fd: int, top: Path, name: str) -> Backend | None:
    """`name`'s folder in the open backend directory `top_fd`, checked with all it holds, and
    its model.py read; None when it has no such folder or model.py."""
    try:
        folder_fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=top_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise _LoadError(f"backend '{name}' in {top}: cannot be opened: {e.strerror or e}") from None
    folder = top / name
    try:
        try:
            file_fd = os.open(MODEL_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _LoadError(f"{folder / MODEL_FILE}: cannot be opened: {e.strerror or e}") from None
        with os.fdopen(file_fd, "rb") as f:
            _trust(os.fstat(top_fd), top, name)
            _trust_tree(folder_fd, folder, name)
            _trust(os.fstat(f.fileno()), folder / MODEL_FILE, name, stat.S_IFREG)
            return Backend(name, folder, f.read())
    finally:
        os.close(folder_fd)


def _trust_tree(folder_fd: int, folder: Path, name: str) -> None:
    """Checks the backend's folder and every folder and file beneath it, links not followed."""
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=folder_fd, follow_symlinks=False):
        here = folder / dirpath
        _trust(os.fstat(dir_fd), here.resolve() if dirpath == "." else here, name)
        for entry in [*dirnames, *filenames]:
            st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise _LoadError(_untrusted(here / entry, "is a symbolic link (not followed)", name))
            _trust(st, here / entry, name, stat.S_IFDIR if stat.S_ISDIR(st.st_mode) else stat.S_IFREG)


def _trust(st: os.stat_result, path: Path, name: str, kind: int = stat.S_IFDIR) -> None:
    why = _code_cache.untrusted(st, kind)
    if why:
        raise _LoadError(_untrusted(path, why, name))


def _untrusted(path: Path, why: str, name: str) -> str:
    return (
        f"the backend directory's {os.path.normpath(path)} {why}; it holds code the server runs, so "
        f"backend '{name}' is not loaded (make it the server user's own, writable by neither group nor others)"
    )
