"""The entry point of a Python model's worker process (``python -m openinfer._worker PARENT``),
started by the server with its socket and shared memory on fds 3-5 (see _backends/processes.py)."""

from __future__ import annotations

import mmap
import pickle
import signal
import struct
import sys
import traceback

from . import _core
from ._backends.model_file import _LoadError
from ._backends.processes import ModelFile

_JOBS_FD = 4
_HEADER = 64  # the job area's shared header; the recipe follows it
_INDEX = 4  # where that header says which of its model's workers this is (oi_pw_shared_t.index)


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group: the server decides when workers end (it closes
    # their sockets), so a terminal's interrupt must not kill one mid-request.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = int(argv[1])
    try:
        with mmap.mmap(_JOBS_FD, 0, prot=mmap.PROT_READ) as area:
            (index,) = struct.unpack_from("<I", area, _INDEX)
            (length,) = struct.unpack_from("<Q", area, _HEADER)
            recipe = pickle.loads(area[_HEADER + 8 : _HEADER + 8 + length])
        sys.path[:] = recipe["path"]
        model = pickle.loads(recipe["model"])
        if isinstance(model.fn, ModelFile):
            object.__setattr__(model, "fn", model.fn.load(index))
    except BaseException as e:  # noqa: BLE001 - whatever it was, the server must hear why
        _core.worker_fail(f"a worker process could not import the model: {_describe(e)}")
        return 1
    try:
        # A Triton Python model's execute is called from C, as in the server (TritonExecute).
        direct = getattr(model, "direct", None)
        direct = direct if isinstance(direct, _core.TritonExecute) else None
        _core.worker_serve(model.handler, model.name, [(t.name, t.datatype) for t in model.outputs], parent,
                           direct=direct)  # fmt: skip
    finally:
        close = getattr(model, "close", None)  # a Triton model's finalize(), as its instance ends
        if close is not None:
            close()
    return 0


def _describe(e: BaseException) -> str:
    if isinstance(e, _LoadError):  # already names model.py and the line that failed
        return str(e)
    last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(e).__name__}: {e}{where}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
