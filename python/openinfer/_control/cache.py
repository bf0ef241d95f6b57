"""tritonserver's response cache options: ``--cache-config <cache>,<setting>=<value>`` (only
the ``local`` cache, whose one setting is ``size`` in bytes) and the deprecated
``--response-cache-byte-size``, read into the capacity the core's cache gets. Models opt in
with ``response_cache { enable: true }`` (or ``Model(..., response_cache=True)``); without a
server cache they run uncached, as in Triton."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

_FORMAT = "--cache-config option format is '<cache name>,<setting>=<value>'. Got "


def _setting(entry: str) -> tuple[str, str, str]:
    """One --cache-config entry as (cache, setting, value), refused with tritonserver's words."""
    name, comma, rest = entry.partition(",")
    if not comma or not name:
        raise ValueError(f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
                         f"Got {entry}")
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError(_FORMAT + entry)
    return name, setting, value


def _size(text: str, what: str) -> int:
    try:
        size = int(text, 10)
    except ValueError:
        raise ValueError(f"{what}: expected a size in bytes (an integer), got {text!r}") from None
    if size < 0:
        raise ValueError(f"{what}: expected a size in bytes of 0 or more, got {size}")
    return size


def cache_bytes(cache_config: Mapping[str, object] | Iterable[str] | None,
                response_cache_byte_size: int | None = None) -> int:
    """The response cache's capacity in bytes from serve()'s `cache_config` (tritonserver's
    ``--cache-config`` entries, e.g. ``["local,size=1048576"]``, or ``{"local,size": 1048576}``)
    and `response_cache_byte_size`; 0 when neither asks for a cache."""
    entries: list[str] = []
    if isinstance(cache_config, Mapping):
        entries = [f"{k}={v}" for k, v in cache_config.items()]
    elif isinstance(cache_config, str):
        entries = [cache_config]
    elif cache_config is not None:
        entries = list(cache_config)
    if entries and response_cache_byte_size is not None:
        raise ValueError("Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                         "Please provide one or the other.")
    if response_cache_byte_size is not None:
        return _size(str(response_cache_byte_size), "--response-cache-byte-size")
    size = 0
    for entry in entries:
        name, setting, value = _setting(entry)
        if name != "local":
            raise ValueError(f"--cache-config {entry}: openinfer has the 'local' cache only, got {name!r}")
        if setting != "size":
            raise ValueError(f"--cache-config {entry}: the local cache's one setting is 'size', got {setting!r}")
        size = _size(value, f"--cache-config {entry}")
    return size
