"""Python model instances in worker processes: which models get them, and how a worker is
started (the C side is csrc/backends/process_backend.c; the worker's loop csrc/python/worker.c).

A Python model with more than one instance runs each in a process of its own when a worker can
import its function: a CPU-bound model then uses as many cores as it has instances, as Triton's
Python backend (a stub process per instance) does. Tensors cross in shared memory the server
owns; nothing is pickled per request. What decides:

- a model in a repository (model.py): ``instance_group`` with a total count > 1, unless its
  kind is ``KIND_MODEL``, which keeps today's threads in the server process;
- an `openinfer.Model`: ``processes=None`` (the default) runs its instances in processes when
  ``instances > 1`` and its function is importable by a worker (a module-level function of a
  module with a file); a function defined in a notebook cell or ``__main__``, a lambda or a
  closure stays in-process, as do models with one instance. ``processes=True`` insists (and
  says why it cannot), ``processes=False`` refuses.
- sequence models stay in-process: their sequences would have to stay on one worker for
  state kept in Python, which the Oldest strategy does not promise. A Triton Python model
  under the Direct strategy is the exception: Direct runs instance i's batches on executor i,
  whose own worker the instance pool gives it, so a sequence stays on one worker as it stays
  on one stub process in Triton (its implicit state lives in the core either way).

Inside a worker a model sees what it would in-process, with one difference: its input arrays
view the shared job area and are valid only during the call (copy what you keep).

With a free-threaded interpreter (3.13t) instances could be threads of the server instead:
the executors already call the model without any lock of ours; what it would take is a build of
the extension for the free-threaded ABI (its GIL-release points are no-ops there), making the
deferred release of output arrays (bridge.c's flush list, today guarded by the GIL) thread-safe,
and models that do not rely on the GIL for their own state.
"""

from __future__ import annotations

import importlib.machinery
import os
import pickle
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _spawn
from .model_file import import_model_file

if TYPE_CHECKING:
    from ..model import Model

# Each worker's result ring: outputs up to about this size travel without a memfd of their own.
RING_BYTES = 16 << 20


@dataclass(frozen=True)
class ModelFile:
    """A repository model's function, which a worker imports from its model.py: the source the
    server read (its own import of it lives under a name no other process knows), named by
    its path."""

    path: str
    source: bytes
    attribute: str
    model_name: str
    version: int

    def load(self, worker: int = 0) -> Callable[..., Any]:
        """The function, imported in worker number `worker` of the model."""
        module = import_model_file(self.model_name, self.version, Path(self.path), self.source)
        return getattr(module, self.attribute)


def why_not_importable(fn: object) -> str | None:
    """Why a worker process could not import `fn` by reference, or None when it can."""
    if isinstance(fn, ModelFile):
        return None
    target = fn if callable(fn) and hasattr(fn, "__qualname__") else type(fn)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if module in (None, "__main__"):
        return f"{qualname or fn!r} is defined in __main__ (a notebook or a script), which a worker cannot import"
    if "<" in qualname:
        return f"{qualname} is a lambda or is defined inside a function"
    found: Any = sys.modules.get(module)
    top = module.partition(".")[0]
    if (
        found is None
        or getattr(found, "__file__", None) is None
        or (top not in sys.builtin_module_names and importlib.machinery.PathFinder.find_spec(top) is None)
    ):
        return f"its module {module!r} is not one a worker could import from sys.path"
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not target:
        return f"{module}.{qualname} does not name it"
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same
        return f"it cannot be sent to a worker ({type(e).__name__}: {e})"
    return None


def bind_file(model: Model, source: ModelFile) -> None:
    """Makes a model loaded from a repository run its instances in processes, whose workers
    import its function from `source`."""
    object.__setattr__(model, "processes", True)
    object.__setattr__(model, "_source", source)


def worker_spec(model: Model) -> tuple[list[str], list[str], bytes, int]:
    """add_model's ``workers``: the command that starts a worker, its environment, the recipe it
    reads from its job area (the model, pickled with a reference to its function, and this
    process's sys.path), and the size of its result ring."""
    shipped = object.__new__(type(model))
    shipped.__dict__.update(model.__dict__)
    shipped.__dict__["fn"] = model._source  # a reference by name or by file, never code
    # The worker's sys.path: this process's, less entries that name the working directory.
    pickled = pickle.dumps({"path": _spawn.absolute_entries(sys.path), "model": pickle.dumps(shipped)})
    recipe = struct.pack("<Q", len(pickled)) + pickled
    env = _spawn.environment(str(Path(__file__).resolve().parents[2]))  # the package's root first
    env["PYTHONUNBUFFERED"] = "1"  # a worker's prints reach the server's log as they happen
    argv = _spawn.python_module("openinfer._worker", str(os.getpid()))
    return argv, [f"{k}={v}" for k, v in env.items()], recipe, RING_BYTES
