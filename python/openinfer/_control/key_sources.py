"""Restricted-API entries (``<groups>:<key>=<value>``, see openinfer._control.restricted) from
somewhere other than the command line, which every local user reads in /proc/PID/cmdline: a
file (``--http-restricted-api-file``, ``--grpc-restricted-protocol-file``) or this process's
environment, which only its own user (and root) can read. Imports nothing of the core: the CLI
builds its help with it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

ENV_VARS = {"http-restricted-api": "OPENINFER_HTTP_RESTRICTED_API",
            "grpc-restricted-protocol": "OPENINFER_GRPC_RESTRICTED_PROTOCOL"}


def entries_kept_secret(
    option: str, files: Iterable[str], environ: Mapping[str, str] = os.environ
) -> list[str]:
    """The `--<option>` entries of each file named by `--<option>-file`, then of the environment
    variable ENV_VARS[option]: one ``<groups>:<key>=<value>`` per line, blank lines and lines
    that start with '#' left out. Raises ValueError naming a file that cannot be read."""
    texts: list[str] = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"--{option}-file {path}: cannot read it: {why}") from None
    texts.append(environ.get(ENV_VARS[option], ""))
    lines = (line.strip() for text in texts for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
