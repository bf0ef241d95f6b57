"""The modules a model keeps beside its model.py, importable by it and by no other model.

python_backend's stub appends a model's version folder and model folder to ``sys.path`` before it
imports model.py, so ``from tokenize_utils import clean`` finds ``1/tokenize_utils.py``. Triton runs
each model in a stub process of its own; here models share one interpreter, whose ``sys.modules``
would hand the second model with a ``utils.py`` the first one's. So a model's imports run inside
`ModelImports.active`: its two folders are at the end of ``sys.path`` (appended, as the stub does:
an installed module of the same name still wins) and the modules it imported before are back in
``sys.modules``; afterwards the modules that came from its folders leave ``sys.modules`` again and
stay with the model. model.py's ``__builtins__`` has an ``__import__`` of the model's own, so an
``import utils`` that runs later (in ``initialize`` or ``execute``) is answered the same way.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

# Modules named uniquely to one load (model_file.import_model_file: a model.py and what it imports
# relatively) stay in sys.modules, for pickle and dataclasses.
UNIQUE_PREFIX = "_openinfer_model_"
# sys.path and sys.modules belong to the whole process: one model's import runs at a time.
_lock = threading.RLock()
_SUFFIXES = tuple(importlib.machinery.all_suffixes())
_import = builtins.__import__


def _module_names(folders: Sequence[Path]) -> frozenset[str]:
    """The top-level module names `folders` provide: Python files, extensions and packages."""
    names = set()
    for folder in folders:
        for entry in folder.iterdir():
            stem = entry.name.partition(".")[0]
            if stem.isidentifier() and (entry.is_dir() or entry.name.endswith(_SUFFIXES)):
                names.add(stem)
    return frozenset(names)


class ModelImports:
    """One model version's own modules (those whose files lie in its model folder and whose
    names are not unique), kept out of ``sys.modules`` between its imports."""

    def __init__(self, version_folder: Path, backend: bool = False) -> None:
        # A Python-based backend's model.py (python_based) imports from its own folder alone,
        # as python_backend's stub appends only that folder for one.
        folders = [version_folder] if backend else [version_folder, version_folder.parent]
        self._folders = [os.path.abspath(f) for f in folders]
        self._root = self._folders[-1] + os.sep
        self._names = _module_names(folders)
        self._modules: dict[str, ModuleType] = {}
        # model.py's builtins: the interpreter's, but for __import__ (a copy made at load).
        self.builtins = {**builtins.__dict__, "__import__": self.import_}

    def import_(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Sequence[str] = (), level: int = 0
    ) -> ModuleType:
        """``__import__`` for model.py: names its folders provide are looked up among its own
        modules first (a lazy ``import utils`` in execute costs a dict lookup once imported)."""
        top = name.partition(".")[0]
        if level or top not in self._names:
            return _import(name, globals, locals, fromlist, level)
        found = self._modules.get(name if fromlist else top)
        if found is not None and name in self._modules and all(hasattr(found, f) for f in fromlist or ()):
            return found
        with self.active():
            return _import(name, globals, locals, fromlist, level)

    def _own(self, name: str, module: object) -> bool:
        """Whether `module` came from this model's folders (and is not named uniquely already)."""
        if name.startswith(UNIQUE_PREFIX):
            return False
        # Read from the module's dict: a lazy module (transformers') imports on a missing
        # attribute, which would run code of some other library here.
        attrs = getattr(module, "__dict__", None) or {}
        file = attrs.get("__file__")
        places = [file] if file else list(attrs.get("__path__") or [])
        return any(isinstance(p, str) and p.startswith(self._root) for p in places)

    @contextmanager
    def active(self) -> Iterator[None]:
        """While the model imports: its folders on sys.path, its modules in sys.modules."""
        with _lock:
            added = [f for f in self._folders if f not in sys.path]
            sys.path.extend(added)
            displaced = {n: sys.modules[n] for n in self._modules if n in sys.modules}
            sys.modules.update(self._modules)
            try:
                yield
            finally:
                for name, module in list(sys.modules.items()):
                    if self._own(name, module):
                        self._modules[name] = sys.modules.pop(name)
                sys.modules.update(displaced)
                for folder in added:
                    if folder in sys.path:
                        sys.path.remove(folder)
