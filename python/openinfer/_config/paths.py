"""Files that a model's configuration names, and where they may be.

A configuration can come from a client (a load request's ``config`` override, or files sent
with a load), so every path it names is opened here, by `open_beneath`, inside the directory it
belongs to, and nothing else opens one:

- a file name where Triton takes one (``default_model_filename`` and the values of
  ``cc_model_filenames`` in the version directory, ``label_filename`` in the model directory,
  ``input_data_file`` in ``warmup/``, ``data_file`` in ``initial_state/``) is one path component;
- a relative path where the format allows folders (an ONNX model's external data, an execution
  accelerator's cache directory) has no ``.``, ``..`` or empty components;
- neither is absolute or holds NUL, and once symbolic links are resolved it still lies inside
  that directory (a link in the repository that points elsewhere is refused).

The file is opened once and read from that descriptor: checking a path and opening it later lets
whoever can write in the model directory swap a file for a link to ``/etc/shadow`` in between.
`open_beneath` resolves with ``openat2(RESOLVE_BENEATH)`` from a descriptor of the directory,
where the kernel has it (Linux 5.6), and otherwise walks the path one component at a time with
``O_NOFOLLOW``, following each link by hand and never above the directory.

Messages name paths relative to the model directory, never where the server keeps it (files sent
with a load live in a temporary directory of the server's).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")

# Execution accelerator parameters of ONNX Runtime that name a file or directory (TensorRT's
# caches and context model, OpenVINO's cache and load_config): paths inside the model directory.
ACCELERATOR_PATHS = frozenset(
    {"trt_engine_cache_path", "trt_timing_cache_path", "trt_ep_context_file_path", "cache_dir", "load_config"}
)


class PathError(ValueError):
    """A configured path that is refused; the message names the field and the value."""


def printable(text: str) -> str:
    """`text` with control characters (NUL first of all: it would end the message in C) and
    lone surrogates (which UTF-8 cannot carry) written as escapes."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def place(directory: Path, model_dir: Path) -> str:
    """How messages name `directory`: relative to the model directory."""
    try:
        rel = directory.relative_to(model_dir).as_posix()
    except ValueError:
        rel = directory.name
    if rel in ("", "."):
        return "the model directory"
    if rel.isdigit():
        return f"the version directory {rel}/"
    return f"the model's {rel}/ directory"


def check_name(name: object, what: str, where: str, nested: bool = False) -> str:
    """The shape of a configured path, before any file system access: a non-empty str, not
    absolute, no NUL or backslash, and one component (`nested`: several, none '.', '..' or empty).
    Returns it; raises PathError naming `what` and `where` (e.g. "the model directory")."""
    if not isinstance(name, str):
        raise PathError(f"{what} must be a string, got {type(name).__name__}")
    parts = name.split("/")
    bad = (
        not name
        or "\0" in name
        or "\\" in name
        or name.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or (len(parts) > 1 and not nested)
    )
    if bad:
        kind = "a relative path" if nested else "a file name"
        raise PathError(f"{what} '{printable(name)}' must be {kind} inside {where}")
    return name


def open_beneath(directory: Path, name: object, what: str, model_dir: Path, nested: bool = False) -> int:
    """THE way to open a file a configuration names: `name` (the value of field `what`) inside
    `directory` (`model_dir` or a folder of it, itself reached from `model_dir` without leaving
    it), as a read-only descriptor (close-on-exec) of a regular file. Symbolic links are
    followed only while they stay inside `directory`. Raises PathError when the name is not one
    `check_name` accepts, leads outside `directory` or is not a regular file, and OSError
    (FileNotFoundError, PermissionError, ...) when it cannot be opened."""
    where = place(directory, model_dir)
    check_name(name, what, where, nested)
    assert isinstance(name, str)
    root = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sub = Path(directory).relative_to(model_dir).as_posix()
        if sub != ".":
            inner = _open_beneath(root, sub, os.O_RDONLY | os.O_DIRECTORY, what, name, where)
            os.close(root)
            root = inner
        fd = _open_beneath(root, name, os.O_RDONLY | os.O_NONBLOCK, what, name, where)
    finally:
        os.close(root)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathError(f"{what} '{printable(name)}' in {where} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent_beneath(directory: Path, name: object, what: str, model_dir: Path) -> tuple[HeldFile, str]:
    """For a relative path that a library opens or creates itself (an execution accelerator's
    cache): the folder that holds its last component, opened beneath `directory` as
    `open_beneath` opens a file and held, and that last component. The library is given
    ``held.source + "/" + last``: every folder on the way is the one checked, and only the
    last component, which the library opens itself, is resolved by name (inside that folder).
    Raises PathError, or OSError when the folder cannot be opened."""
    where = place(directory, model_dir)
    check_name(name, what, where, nested=True)
    assert isinstance(name, str)
    parent, _, last = name.rpartition("/")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if parent:
        try:
            inner = _open_beneath(fd, parent, os.O_RDONLY | os.O_DIRECTORY, what, name, where)
        finally:
            os.close(fd)
        fd = inner
    return HeldFile(fd, Path(directory, parent)), last


def read_beneath(directory: Path, name: object, what: str, model_dir: Path, nested: bool = False) -> bytes:
    """The bytes of the file `open_beneath` opens."""
    with os.fdopen(open_beneath(directory, name, what, model_dir, nested), "rb") as f:
        return f.read()


def fd_path(fd: int) -> str:
    """A path that names the open file `fd` itself, for a library that takes only a path (the
    kernel opens what the descriptor holds, whatever the directory holds by then)."""
    return f"/proc/self/fd/{fd}"


class HeldFile:
    """An open file that a library reads by path later (ONNX Runtime, libtorch: when a model's
    instances are made), held open as long as this object lives: `source` names the descriptor
    (`fd_path`), `path` is how messages name the file."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.source = fd_path(fd)
        weakref.finalize(self, os.close, fd)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437  # the same number on every architecture Linux has added it to since 5.6
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_MAX_LINKS = 40  # as the kernel's own path walk (ELOOP past it)


def _syscall():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall
    except (OSError, AttributeError):
        return None


_libc_syscall = _syscall()
# None once openat2 is known to be missing (old kernel, or a seccomp filter that answers ENOSYS
# or EPERM, as container runtimes' default profiles did before they knew it).
_openat2_usable = _libc_syscall is not None


def _openat2(dir_fd: int, rel: str, flags: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC | os.O_NOCTTY, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc_syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), os.fsencode(rel),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return fd


def _open_beneath(dir_fd: int, rel: str, flags: int, what: str, name: str, where: str) -> int:
    """`rel` opened with `flags` from `dir_fd`, never resolving above it; the refusal of a path
    that would leave it is a PathError naming the configured `name`."""
    global _openat2_usable
    try:
        if _openat2_usable:
            try:
                return _openat2(dir_fd, rel, flags)
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EPERM):
                    raise
                _openat2_usable = False
        return _walk(dir_fd, rel, flags)
    except OSError as e:
        if e.errno == errno.EXDEV:
            raise PathError(f"{what} '{printable(name)}' leads outside {where} (through a symbolic link)") from None
        if e.errno == errno.ELOOP:
            raise PathError(f"{what} '{printable(name)}' in {where}: too many levels of symbolic links") from None
        raise


def _walk(dir_fd: int, rel: str, flags: int) -> int:
    """What openat2(RESOLVE_BENEATH) does, one component at a time: each directory is opened
    with O_NOFOLLOW from the one before, a link's target is read and walked in its place
    (an absolute one, or '..' above `dir_fd`, is EXDEV), and the last component is opened with
    O_NOFOLLOW, so nothing a writer swaps in meanwhile is followed."""
    stack = [os.dup(dir_fd)]
    todo = [p for p in rel.split("/") if p not in ("", ".")][::-1]
    links = 0
    try:
        while todo:
            part = todo.pop()
            if part == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), rel)
                os.close(stack.pop())
                continue
            last = not todo
            try:
                fd = os.open(part, (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW
                             | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=stack[-1])
            except OSError as e:
                # O_NOFOLLOW on a link: ELOOP (O_DIRECTORY on a link: ENOTDIR).
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(part, dir_fd=stack[-1])
                except OSError as not_link:
                    if not_link.errno != errno.EINVAL or e.errno == errno.ENOTDIR:
                        raise e from None
                    target = None  # a link a moment ago, a file now: try the component again
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
                if target is None:
                    todo.append(part)
                    continue
                if target.startswith("/"):
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), rel) from None
                todo.extend(p for p in target.split("/")[::-1] if p not in ("", "."))
                continue
            if last:
                return fd
            stack.append(fd)
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), rel)  # rel named the directory itself
    finally:
        for fd in stack:
            os.close(fd)


def configured(config: dict[str, Any]) -> Iterator[tuple[str, object, str, bool]]:
    """Every path a normalized configuration (triton_config.normalize) names: (the field, its
    value, the directory it is inside, relative to the model directory ('' for the model
    directory itself, '<version>' for the version directory), whether it may have folders)."""
    if config.get("default_model_filename"):  # "" is protobuf's unset
        yield "default_model_filename", config["default_model_filename"], "<version>", False
    for cc, name in (config.get("cc_model_filenames") or {}).items():
        yield f"cc_model_filenames['{printable(str(cc))}']", name, "<version>", False
    for i, output in enumerate(config.get("output") or []):
        if output.get("label_filename"):
            yield f"output[{i}].label_filename", output["label_filename"], "", False
    for i, sample in enumerate(config.get("model_warmup") or []):
        for key, spec in (sample.get("inputs") or {}).items():
            if isinstance(spec, dict) and spec.get("input_data_file"):
                field = f"model_warmup[{i}].inputs['{printable(str(key))}'].input_data_file"
                yield field, spec["input_data_file"], "warmup", False
    for i, state in enumerate((config.get("sequence_batching") or {}).get("state") or []):
        for j, init in enumerate(state.get("initial_state") or []):
            if init.get("data_file"):
                field = f"sequence_batching.state[{i}].initial_state[{j}].data_file"
                yield field, init["data_file"], "initial_state", False
    accelerators = (config.get("optimization") or {}).get("execution_accelerators") or {}
    for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator"):
        for i, accel in enumerate(accelerators.get(kind) or []):
            for key, value in (accel.get("parameters") or {}).items():
                if key in ACCELERATOR_PATHS:
                    yield f"optimization.execution_accelerators.{kind}[{i}].parameters['{key}']", value, "", True


def check_config(config: dict[str, Any]) -> None:
    """Checks the shape of every path a normalized configuration names (`configured`); raises
    PathError for the first that `check_name` refuses. Where the files are is checked when they
    are opened, through `open_beneath`."""
    for what, name, folder, nested in configured(config):
        where = {"": "the model directory", "<version>": "the version directory"}.get(
            folder, f"the model's {folder}/ directory"
        )
        check_name(name, what, where, nested)
