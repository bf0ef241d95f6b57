"""A repository model's model.py, executed as a module of its own, and the error that says why
one model version cannot be served. Apart from the repository so that a worker process
(processes.ModelFile, _worker) can import a model file without the repository, which imports
every backend: the import graph stays one-way (model -> processes -> model_file, with the repository above them all)."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

_module_ids = itertools.count()


class _LoadError(Exception):
    """A reason why one model version cannot be served; becomes `LoadedModel.error`."""


def import_model_file(
    name: str, version: int, path: Path, source: bytes, provided: Mapping[str, ModuleType] | None = None
) -> ModuleType:
    """Executes model.py (`source`, the bytes read from the descriptor the repository opened
    `path` as: never the file by path again, which may have been swapped since) as a module of
    its own, under a name unique to this load, so that every model's model.py coexists in
    sys.modules (registered there for pickle and dataclasses); its __file__ is `path`.
    `provided` are modules that model.py may import by those names (Triton's
    ``triton_python_backend_utils``), put in sys.modules first."""
    for module_name, provided_module in (provided or {}).items():
        sys.modules[module_name] = provided_module
    identifier = re.sub(r"\W", "_", name)
    module_name = f"_openinfer_model_{identifier}_v{version}_{next(_module_ids)}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[module_name] = module
    try:
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - model.py is the model
    except (Exception, SystemExit) as e:
        del sys.modules[module_name]
        raise _LoadError(_describe(path, e)) from None
    return module


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
