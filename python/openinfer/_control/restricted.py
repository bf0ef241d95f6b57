"""tritonserver's restricted APIs: ``--http-restricted-api=<api>[,<api>...]:<key>=<value>`` and
``--grpc-restricted-protocol=<protocol>[,...]:<key>=<value>``. The named groups of endpoints
(health, metadata, inference, shared-memory, model-config, model-repository, statistics,
trace, logging) answer only requests that carry header `key` with `value`; others get HTTP 403
"This API is restricted, expecting header '<key>'" or gRPC UNAVAILABLE "This protocol is
restricted, expecting header 'triton-grpc-protocol-<key>'". Each group may be named once.
Parsed here with tritonserver's errors; the core checks every request where it routes it.
Entries may also come from a file or the environment (openinfer._control.key_sources), so that
the keys stay out of the command line."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from .. import _core

# tritonserver's group names, in its order (the core's table).
GROUPS: tuple[str, ...] = tuple(_core.RESTRICTED_APIS)

# gRPC metadata is lower-case on the wire; tritonserver puts this before a protocol's key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def _shown(arg: str) -> str:
    """The flag's value for an error, its key's value left out: errors and logs never show it."""
    name, colon, rest = arg.partition(":")
    key, equals, value = rest.partition("=")
    if not equals and any(c.isspace() for c in arg):  # a value given after a space: nothing past the groups shows
        return name + colon + "<hidden>" if colon else "<hidden>"
    return name + colon + key + equals + ("<hidden>" if value else "")


def parse_restricted(
    entries: str | Iterable[str] | None, *, option: str, feature: str, prefix: str = ""
) -> list[tuple[str, str, str]]:
    """Each ``<groups>:<key>=<value>`` entry of tritonserver's flag `option` (a string or
    several) as (group, header, value) per group, refused with tritonserver's words (`feature`
    is "api" or "protocol"); `prefix` goes before each key (gRPC's)."""
    if entries is None:
        return []
    if isinstance(entries, str):
        entries = [entries]
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for arg in entries:
        colon = arg.find(":")
        equals = arg.find("=", colon + 1) if colon >= 0 else -1
        names, key, value = arg[:colon], arg[colon + 1 : equals], arg[equals + 1 :]
        if colon < 0 or equals < 0 or not names or not key or not value:
            raise ValueError(
                f"--{option} option format is '<config name>:<setting>=<value>'. Got {_shown(arg)}"
            )
        for name in names.split(","):
            if name not in GROUPS:
                raise ValueError(f"unknown restricted {feature} '{name}'")
            if name in seen:
                raise ValueError(
                    f"restricted {feature} '{name}' can not be specified in multiple config groups"
                )
            seen.add(name)
            out.append((name, prefix + key, value))
    return out


def http_restricted(entries: str | Iterable[str] | None) -> list[tuple[str, str, str]]:
    """``--http-restricted-api`` entries for the core."""
    return parse_restricted(entries, option="http-restricted-api", feature="api")


def grpc_restricted(entries: str | Iterable[str] | None) -> list[tuple[str, str, str]]:
    """``--grpc-restricted-protocol`` entries for the core (keys with gRPC's prefix). The group
    "openai" is OpenAI's API under /v1, which gRPC does not serve: unknown there."""
    for group, _, _ in parse_restricted(entries, option="grpc-restricted-protocol", feature="protocol"):
        if group == "openai":
            raise ValueError("unknown restricted protocol 'openai'")
    return parse_restricted(
        entries, option="grpc-restricted-protocol", feature="protocol", prefix=GRPC_HEADER_PREFIX
    )


def reached_by_strangers(listeners: Sequence[tuple[str, set[str]]], group: str) -> bool:
    """Whether a client beyond this host may call `group`'s APIs unchecked on one of the TCP
    `listeners` (each its host and the groups it restricts)."""
    return any(not _loopback(host) and group not in restricted for host, restricted in listeners)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def open_to_anyone(
    host: str, restricted: Sequence[set[str]], *, model_control: bool, shared_memory: bool
) -> list[str]:
    """What a server on `host` lets any client beyond this host change, its TCP protocols
    restricting the groups in `restricted` (one set per protocol): model control (with
    ``--model-control-mode=explicit``), shared memory (when allowed) and the log and trace
    settings. Empty on a loopback address."""
    if _loopback(host) or not restricted:
        return []
    def unrestricted(*groups: str) -> bool:
        return any(g not in r for r in restricted for g in groups)
    what = []
    if model_control and unrestricted("model-repository"):
        what.append("model control (load, unload)")
    if shared_memory and unrestricted("shared-memory"):
        what.append("shared memory")
    if unrestricted("logging", "trace"):
        what.append("settings (logging, trace)")
    return what
