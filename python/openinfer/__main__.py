"""``python -m openinfer``: the same command line as the ``openinfer`` console script."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
