"""Files that a model's configuration names, and where they may be.

A configuration can come from a client (a load request's ``config`` override, or files sent
with a load), so every path it names is resolved here, in `resolve`, inside the directory it
belongs to, and nothing else opens one:

- a file name where Triton takes one (``default_model_filename`` and the values of
  ``cc_model_filenames`` in the version directory, ``label_filename`` in the model directory,
  ``input_data_file`` in ``warmup/``, ``data_file`` in ``initial_state/``) is one path component;
- a relative path where the format allows folders (an ONNX model's external data, an execution
  accelerator's cache directory) has no ``.``, ``..`` or empty components;
- neither is absolute or holds NUL, and once symbolic links are resolved it still lies inside
  that directory (a link in the repository that points elsewhere is refused).

Messages name paths relative to the model directory, never where the server keeps it (files sent
with a load live in a temporary directory of the server's).
"""

from __future__ import annotations

import os
import re
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


def resolve(directory: Path, name: object, what: str, model_dir: Path, nested: bool = False) -> Path:
    """THE way to a file a configuration names: `name` (the value of field `what`) inside
    `directory` (the model directory `model_dir` or a folder of it), with symbolic links
    resolved. The file need not exist (the caller says so in its words). Raises PathError when
    the name is not one `check_name` accepts or leads outside `directory`."""
    where = place(directory, model_dir)
    check_name(name, what, where, nested)
    assert isinstance(name, str)
    root = os.path.realpath(directory)
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root or target == root:
        raise PathError(f"{what} '{printable(name)}' leads outside {where} (through a symbolic link)")
    return Path(target)


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
    are opened, through `resolve`."""
    for what, name, folder, nested in configured(config):
        where = {"": "the model directory", "<version>": "the version directory"}.get(
            folder, f"the model's {folder}/ directory"
        )
        check_name(name, what, where, nested)
