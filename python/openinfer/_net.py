"""Addresses as this machine reaches them (the server's URLs, and `serve --workers`'s log)."""

from __future__ import annotations

# A listener bound to a wildcard address is reached through loopback.
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def reachable(host: str, port: int) -> str:
    """``host:port`` (``[host]:port`` for IPv6) reaching, from this machine, a listener bound
    to `host` and `port`."""
    host = _WILDCARDS.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
