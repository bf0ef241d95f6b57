"""The cache of compiled code (the torch shim in ``torch_shim/``, PT2 packages in ``pt2/``), checked
as code is: openinfer maps what it holds into the server, so whoever can write there runs code
as the server's user.

A folder of it, or a file loaded or obeyed from it (a library, a package, a lock, a ``.failed``
marker), is used only when owned by the server's user (or root) and not writable by group or
others, checked on every component from the cache root down, as OpenSSH's StrictModes checks a
user's files. The checks are made on open descriptors (each folder opened from the one above
with O_NOFOLLOW, and a file's descriptor is what is loaded: ``/proc/self/fd/N``), so nothing
can be swapped in between the check and the use. Folders openinfer creates are created 0700.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UntrustedCache(RuntimeError):
    """A cache folder or file that is not used; the message names the path and why."""


def root() -> Path:
    """$OPENINFER_CACHE_DIR, else $XDG_CACHE_HOME/openinfer, else ~/.cache/openinfer."""
    explicit = os.environ.get("OPENINFER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "openinfer"


def check(fd: int, path: Path, kind: int = stat.S_IFDIR) -> None:
    """Raises UntrustedCache unless the open `fd` (`path`, for the message) is a `kind` (a
    folder or a regular file) owned by this process's user or root and not writable by group
    or others."""
    why = untrusted(os.fstat(fd), kind)
    if why:
        raise UntrustedCache(
            f"the cache {path} {why}; it holds code the server loads, so it is not used "
            "(make it the server user's own with mode 0700, or set OPENINFER_CACHE_DIR)"
        )


def untrusted(st: os.stat_result, kind: int = stat.S_IFDIR) -> str | None:
    """Why a file or folder (its stat, taken without following links) holding code is not
    trusted, as the end of a sentence naming it; None when it is a `kind` owned by this process's
    user or root and writable by neither group nor others."""
    if stat.S_IFMT(st.st_mode) != kind:
        return "is not a folder" if kind == stat.S_IFDIR else "is not a regular file"
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}"
    if st.st_mode & stat.S_IWOTH:
        return "is writable by others"
    if st.st_mode & stat.S_IWGRP:
        return "is writable by its group"
    return None


def directory(sub: str, top: Path | None = None) -> tuple[int, Path]:
    """The folder `sub` of the cache (whose root is `top`, default `root()`), created (0700,
    with the cache root) where missing, as a descriptor (the caller closes it) and its path,
    once it and every folder above it up to the cache root pass `check`. Raises
    UntrustedCache, or OSError when it cannot be made."""
    top = top or root()
    fd = _open_root(top)
    path = top
    try:
        for part in sub.split("/"):
            path = path / part
            inner = _open_child(fd, part, path)
            os.close(fd)
            fd = inner
        return fd, path
    except BaseException:
        os.close(fd)
        raise


def open_file(dir_fd: int, name: str, dir_path: Path, flags: int = os.O_RDONLY, create: bool = False) -> int | None:
    """File `name` of the checked folder `dir_fd` as a checked descriptor (the caller closes
    it), never through a symbolic link; None when it does not exist (and `create` is false: then
    it is made 0600)."""
    how = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = os.open(name, how, 0o600, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedCache(f"the cache {dir_path / name} is a symbolic link; it is not followed") from None
        raise
    try:
        check(fd, dir_path / name, stat.S_IFREG)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(dir_fd: int, name: str, dir_path: Path) -> str | None:
    """The text of file `name` of a checked folder (see `open_file`), or None when missing."""
    fd = open_file(dir_fd, name, dir_path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace")


def _open_root(top: Path) -> int:
    """The cache root, made (with the folders above it that are missing) 0700 where missing."""
    missing = []
    for folder in (top, *top.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made by another process meanwhile: checked below all the same
            pass
    fd = os.open(top, _DIR)
    try:
        check(fd, top)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(dir_fd: int, name: str, path: Path) -> int:
    """Folder `name` of `dir_fd`, made 0700 where missing, checked; a symbolic link is refused."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UntrustedCache(f"the cache {path} is not a folder (a symbolic link is not followed)") from None
        raise
    try:
        check(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd
