"""serve()'s ``ssl`` option: TLS settings for the HTTP and gRPC listeners, as tritonserver's
``--{http,grpc}-use-ssl``, ``-server-cert``, ``-server-key``, ``-root-cert`` and
``-use-ssl-mutual`` flags name them."""

from __future__ import annotations

import os
from collections.abc import Mapping

KEYS = ("server_cert", "server_key", "root_cert", "mutual")
PROTOCOLS = ("http", "grpc")

TlsSpec = tuple[str, str, "str | None", bool]


def _one(protocol: str, options: Mapping[str, object]) -> TlsSpec:
    unknown = sorted(set(options) - set(KEYS))
    if unknown:
        raise ValueError(f"ssl[{protocol!r}]: unknown option(s) {', '.join(unknown)}; expected {', '.join(KEYS)}")
    missing = [k for k in ("server_cert", "server_key") if not options.get(k)]
    if missing:
        raise ValueError(f"ssl[{protocol!r}]: {' and '.join(missing)} required (PEM file paths)")
    root = options.get("root_cert")
    mutual = bool(options.get("mutual", False))
    if mutual and not root:
        raise ValueError(f"ssl[{protocol!r}]: mutual TLS needs root_cert, the CA that signs client certificates")
    return (
        os.fspath(options["server_cert"]),  # type: ignore[arg-type]
        os.fspath(options["server_key"]),  # type: ignore[arg-type]
        None if not root else os.fspath(root),  # type: ignore[arg-type]
        mutual,
    )


def tls_specs(ssl: Mapping[str, object] | None) -> dict[str, TlsSpec]:
    """``{"http": spec, "grpc": spec}`` for the protocols `ssl` turns TLS on for: a mapping of
    the options (server_cert, server_key, root_cert, mutual) for both protocols, or one with
    "http" and/or "grpc" keys, each mapping to such options."""
    if not ssl:
        return {}
    if not isinstance(ssl, Mapping):
        raise ValueError(f"ssl must be a mapping of {', '.join(KEYS)}, or of 'http'/'grpc' to one; got {ssl!r}")
    if set(ssl) <= set(PROTOCOLS):
        out = {}
        for protocol, options in ssl.items():
            if options:
                if not isinstance(options, Mapping):
                    raise ValueError(f"ssl[{protocol!r}] must be a mapping of {', '.join(KEYS)}; got {options!r}")
                out[protocol] = _one(protocol, options)
        return out
    spec = _one("http and grpc", ssl)
    return {"http": spec, "grpc": spec}
