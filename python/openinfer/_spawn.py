"""The command lines of the Python processes the server starts (model workers, the workers of
``--workers``, the PT2 compile): none of them has the working directory on its import path.

``python -m M`` and ``python -c CODE`` put the working directory (or '') first on sys.path, so
whoever can write there (root starting the server from a shared folder) would have their
``openinfer/__init__.py`` or ``numpy.py`` run in place of ours. Python 3.11 has ``-P`` for
this; on 3.10 the command removes that first entry itself, before it imports anything (the
interpreter's start-up imports only the standard library and site-packages, never from it).
``-I`` would do it too but also drops PYTHONPATH and the user's site-packages, which a
deployment may rely on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

_SAFE_PATH_FLAG = sys.version_info >= (3, 11)
# Runs module argv[1] as __main__ with the rest as its arguments, as -m would.
_RUN_MODULE = "import runpy; del sys.argv[0]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"


def python_code(code: str, *args: str) -> list[str]:
    """``python -c CODE ARGS`` without the working directory on sys.path; `code` may use `sys`."""
    if _SAFE_PATH_FLAG:
        return [sys.executable, "-P", "-c", "import sys\n" + code, *args]
    return [sys.executable, "-c", "import sys\ndel sys.path[0]\n" + code, *args]


def python_module(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` without the working directory on sys.path."""
    if _SAFE_PATH_FLAG:
        return [sys.executable, "-P", "-m", module, *args]
    return python_code(_RUN_MODULE, module, *args)


def absolute_entries(entries: list[str]) -> list[str]:
    """Import path entries that do not depend on the working directory: '' and relative
    entries name it (an empty PYTHONPATH component too), so they are left out."""
    return [e for e in entries if os.path.isabs(e)]


# Options of the interpreter that take the next argument as their value.
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def _run_module() -> str | None:
    """The module this interpreter was started to run with ``-m`` (sys.orig_argv), if any."""
    argv = list(getattr(sys, "orig_argv", []))[1:]
    while argv:
        arg = argv.pop(0)
        if arg == "-m":
            return argv[0] if argv else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg in _OPTIONS_WITH_VALUE:
            argv[:1] = []
        elif arg == "-c" or arg == "-" or not arg.startswith("-"):
            return None  # code or a script, not a module
    return None


def leave_the_working_directory() -> None:
    """Run as ``python -m openinfer...`` (not -P), Python put the working directory first on
    sys.path: it is taken off before openinfer imports anything (numpy.py there would run as
    the server's user). Only then: a program that imports openinfer keeps its own sys.path.
    An ``openinfer/`` in that directory has been imported already; docs/security.md says how
    to start the server."""
    module = _run_module()
    if (
        module is not None
        and module.split(".")[0] == "openinfer"
        and not getattr(sys.flags, "safe_path", False)
        and sys.path
        and sys.path[0] in ("", os.getcwd())
    ):
        del sys.path[0]


def environment(extra_path: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Python child: the caller's (or `env`), with `extra_path` first on
    PYTHONPATH and PYTHONPATH's relative or empty entries left out."""
    out = dict(os.environ if env is None else env)
    entries = absolute_entries([*([extra_path] if extra_path else []), *out.get("PYTHONPATH", "").split(os.pathsep)])
    if entries:
        out["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        out.pop("PYTHONPATH", None)
    return out
