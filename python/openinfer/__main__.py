"""``python -m openinfer``: the same command line as the ``openinfer`` console script."""

from __future__ import annotations

import os
import sys

# `python -m` put the working directory first on sys.path; the server imports nothing from it
# (numpy.py there would run as the server's user). An openinfer/ there has run already: start
# the server as the `openinfer` script or with `python -P -m openinfer` (docs/security.md).
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402

raise SystemExit(main())
