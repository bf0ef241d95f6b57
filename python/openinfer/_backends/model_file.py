"""A repository model's model.py, executed as a module of its own, and the error that says why
one model version cannot be served. Apart from the repository so that a worker process
(processes.ModelFile, _worker) can import a model file without the repository, which imports
every backend: the import graph stays one-way (model -> processes -> model_file, with the repository above them all)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from .model_imports import UNIQUE_PREFIX, ModelImports

_module_ids = itertools.count()
_M = TypeVar("_M")


class _LoadError(Exception):
    """A reason why one model version cannot be served; becomes `LoadedModel.error`."""


def import_model_file(
    name: str, version: int, path: Path, source: bytes, provided: Mapping[str, ModuleType] | None = None,
    backend: bool = False,
) -> ModuleType:
    """Executes model.py (`source`, the bytes read from the descriptor the repository opened
    `path` as: never the file by path again, which may have been swapped since) as a module of
    its own, under a name unique to this load, so that every model's model.py coexists in
    sys.modules (registered there for pickle and dataclasses); its __file__ is `path`. As
    python_backend's stub imports it (``1.model``), it is a module of a package whose folder is
    the version folder, so ``from . import helper`` works; the modules beside it are its own
    (`ModelImports`). `provided` are modules that model.py may import by those names (Triton's
    ``triton_python_backend_utils``), put in sys.modules first. A Python-based `backend`'s
    model.py imports from its own folder only (see ModelImports)."""
    for module_name, provided_module in (provided or {}).items():
        sys.modules[module_name] = provided_module
    package_name = f"{UNIQUE_PREFIX}{_identifier(name)}_v{version}_{next(_module_ids)}"
    package = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec(package_name, None, is_package=True)
    )
    package.__path__ = [str(path.parent)]
    module_name = f"{package_name}.{_identifier(path.stem)}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    imports = ModelImports(path.parent, backend)
    module.__builtins__ = imports.builtins  # type: ignore[attr-defined]
    sys.modules[package_name] = package
    sys.modules[module_name] = module
    try:
        with imports.active():
            exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - model.py is the model
    except (Exception, SystemExit) as e:
        forget(package_name)
        raise _LoadError(_describe(path, e)) from None
    return module


def owned_by(model: _M, module: ModuleType) -> _M:
    """`model`, marked as what `module` (import_model_file's) was loaded for: forget_model
    forgets it once the model is unloaded."""
    object.__setattr__(model, "_model_module", module.__name__)  # Model is frozen
    return model


def forget_model(model: object) -> None:
    """Forgets the model.py load of an unloaded `model` (see owned_by), if it has one."""
    name = getattr(model, "_model_module", None)
    if name is not None:
        forget(name)


def forget(module_name: str) -> None:
    """Takes the modules of one load of a model.py (`module_name`: its module or its package,
    as import_model_file named them) out of sys.modules: an unloaded model's code and what its
    globals hold are not kept for the life of the process."""
    package = module_name.rsplit(".", 1)[0] if "." in module_name else module_name
    if not package.startswith(UNIQUE_PREFIX):
        return
    # list() copies at once: other threads import (and this may run twice) meanwhile.
    for unique in [n for n in list(sys.modules) if n == package or n.startswith(package + ".")]:
        sys.modules.pop(unique, None)


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _describe(path: Path, error: BaseException) -> str:
    """One line that says where in model.py loading failed and why."""
    if isinstance(error, SyntaxError) and error.filename == str(path):
        return f"{path}:{error.lineno}: SyntaxError: {error.msg}"
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
    where = f"{path}:{lines[-1]}" if lines else str(path)
    return (
        f"{where}: {type(error).__name__}: {error}"
        if str(error)
        else f"{where}: {type(error).__name__}"
    )
