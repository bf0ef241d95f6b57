"""Triton's trace extension settings: ``GET/POST /v2/trace/setting``,
``/v2/models/{model}/trace/setting`` and gRPC ``TraceSetting`` read and change them.

- ``trace_level``: ``["OFF"]``, or any of ``TIMESTAMPS`` and ``TENSORS``;
- ``trace_rate``: one request in every ``trace_rate`` is traced;
- ``trace_count``: how many more requests to trace (``-1``: no limit);
- ``log_frequency``: the trace file is flushed every that many traces (``0``: at stop or when the
  settings change);
- ``trace_file``: set at start only; as in Triton, a client cannot move it.

A model's settings are the global ones except those set for it; a model setting set to
``null`` (HTTP) or to no value (gRPC) is cleared, and the global one applies again. Values
travel as strings, as in Triton. A change is validated whole and applied only when every
setting in it is valid.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .control import _body_object
from ..errors import InferenceServerError

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
# Triton's lowest trace_count: -1, no limit.
MIN_TRACE_COUNT = -1

_CLEAR = object()  # a model setting to drop


def parse_level(value: Any) -> list[str]:
    """A trace_level value (a list of level names) checked: OFF alone, or TIMESTAMPS and/or
    TENSORS. Returns the levels in Triton's order (["OFF"] when off). Raises
    InferenceServerError (400)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InferenceServerError(400, "expect an array of strings for 'trace_level'")
    for v in value:
        if v not in LEVELS:
            raise InferenceServerError(
                400, f"unknown value '{v}' for 'trace_level'; expected OFF, TIMESTAMPS or TENSORS"
            )
    if "OFF" in value:
        if len(value) != 1:
            raise InferenceServerError(400, "Expect only one trace level 'OFF' is specified")
        return ["OFF"]
    levels = [lv for lv in LEVELS[1:] if lv in value]
    return levels or ["OFF"]


def level_mask(levels: list[str]) -> int:
    """The core's level: a mask of 1 (TIMESTAMPS) and 2 (TENSORS); 0 when OFF."""
    return (1 if "TIMESTAMPS" in levels else 0) | (2 if "TENSORS" in levels else 0)


def _parse_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InferenceServerError(400, f"expect a string for '{name}'")
    text = str(value).strip()
    try:
        number = int(text, 10)
    except ValueError:
        raise InferenceServerError(400, f"Unable to parse '{name}', got: {value}") from None
    if not low <= number <= high:
        raise InferenceServerError(
            400,
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {value}",
        )
    return number


def _parse_count(value: Any) -> int:
    count = _parse_int("trace_count", value, -(2**31), _INT32_MAX)
    if count < MIN_TRACE_COUNT:
        raise InferenceServerError(
            400,
            f"Unable to parse 'trace_count'. Expecting value >= {MIN_TRACE_COUNT}, got: {value}",
        )
    return count


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "trace_level": parse_level,
    "trace_rate": lambda v: _parse_int("trace_rate", v, 0, _UINT32_MAX),
    "trace_count": _parse_count,
    "log_frequency": lambda v: _parse_int("log_frequency", v, 0, _UINT32_MAX),
}


class TraceSettings:
    """The global trace settings and each model's own. `on_change(model, effective)` is called,
    under the settings' lock, with a model's (None: the global) effective settings after each
    change ({} when a model's own are all cleared), so the core samples with them;
    `count_of(model)` reads back how many traces the core may still take (trace_count goes
    down as requests are traced)."""

    def __init__(
        self,
        *,
        trace_file: str | None = None,
        trace_level: list[str] | None = None,
        trace_rate: int = 1000,
        trace_count: int = -1,
        log_frequency: int = 0,
        on_change: Callable[[str | None, dict[str, Any]], None] | None = None,
        count_of: Callable[[str | None], int] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._defaults: dict[str, Any] = {
            "trace_level": parse_level(list(trace_level or ["OFF"])),
            "trace_rate": _PARSERS["trace_rate"](trace_rate),
            "trace_count": _parse_count(trace_count),
            "log_frequency": _PARSERS["log_frequency"](log_frequency),
            "trace_file": trace_file or "",
        }
        if self._defaults["trace_level"] != ["OFF"] and not trace_file:
            raise ValueError(
                "tracing at level TIMESTAMPS or TENSORS needs a trace file "
                "(--trace-config triton,file=PATH or --trace-file)"
            )
        self._global = dict(self._defaults)
        self._models: dict[str, dict[str, Any]] = {}
        self._on_change = on_change
        self._count_of = count_of

    def push(self) -> None:
        """Hands the global settings to the core (at start)."""
        if self._on_change is not None:
            with self._lock:
                self._on_change(None, self._effective(None))

    def _sync_counts(self) -> None:
        """Under the lock: the counts as the core has spent them."""
        if self._count_of is None:
            return
        self._global["trace_count"] = self._count_of(None)
        for name, own in self._models.items():
            if "trace_count" in own:
                own["trace_count"] = self._count_of(name)

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The effective settings of `model` (None: the global ones)."""
        with self._lock:
            self._sync_counts()
            return self._effective(model)

    def _effective(self, model: str | None) -> dict[str, Any]:
        values = dict(self._global)
        if model is not None:
            values.update(self._models.get(model, {}))
        return values

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Validates `changes` (setting -> value, or _CLEAR) with Triton's checks and wording,
        applies them all or none and returns the effective settings. Raises
        InferenceServerError."""
        new: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "trace_file":
                raise InferenceServerError(
                    501, "trace file location can not be updated through network protocol"
                )
            if name not in _PARSERS:
                # Triton ignores names it does not know; a typo would then pass unnoticed.
                raise InferenceServerError(
                    400,
                    f"unknown trace setting '{name}'; expected one of trace_level, trace_rate, "
                    "trace_count, log_frequency, trace_file",
                )
            new[name] = value if value is _CLEAR else _PARSERS[name](value)
        with self._lock:
            self._sync_counts()
            if self._defaults["trace_file"] == "" and any(
                n == "trace_level" and v is not _CLEAR and v != ["OFF"] for n, v in new.items()
            ):
                raise InferenceServerError(
                    400,
                    "trace_level TIMESTAMPS or TENSORS needs a trace file; start the server with one",
                )
            if model is None:
                for name, value in new.items():
                    self._global[name] = self._defaults[name] if value is _CLEAR else value
            else:
                own = self._models.setdefault(model, {})
                for name, value in new.items():
                    if value is _CLEAR:
                        own.pop(name, None)
                    else:
                        own[name] = value
                if not own:
                    del self._models[model]
            if new and self._on_change is not None:
                if model is None:
                    self._on_change(None, self._effective(None))
                    for name in self._models:
                        self._on_change(name, self._effective(name))
                else:
                    self._on_change(model, self._effective(model) if model in self._models else {})
            return self._effective(model)

    def handle(
        self, model: str | None, body: bytes | None, params: dict[str, Any] | None
    ) -> list[tuple[str, Any]]:
        """The core's trace handler: an HTTP body (JSON object; null clears a setting) or
        gRPC's settings (each a list of strings; none clears); neither only reads. Returns
        every setting as (name, value), each value a string or, for trace_level, a list."""
        if body is not None:
            changes = {
                name: _CLEAR if value is None else value
                for name, value in _body_object(body, "trace").items()
                if not (name == "trace_level" and value == [])  # Triton: no level, no change
            }
            values = self.update(model, changes)
        elif params:
            changes = {}
            for name, value in params.items():
                if not value:
                    changes[name] = _CLEAR
                elif name == "trace_level":
                    changes[name] = list(value)
                elif len(value) != 1:
                    raise InferenceServerError(400, f"expect only 1 value for '{name}'")
                else:
                    changes[name] = value[0]
            values = self.update(model, changes)
        else:
            values = self.settings(model)
        if self._count_of is not None:  # what the core has left, also where a model inherits it
            values["trace_count"] = self._count_of(model)
        return [
            ("trace_level", list(values["trace_level"])),
            ("trace_rate", str(values["trace_rate"])),
            ("trace_count", str(values["trace_count"])),
            ("log_frequency", str(values["log_frequency"])),
            ("trace_file", values["trace_file"]),
            ("trace_mode", "triton"),
        ]


# ---- tritonserver's start-up flags -----------------------------------------------------------

# --trace-config settings: global ones (``<setting>=<value>``) and the triton mode's
# (``triton,<setting>=<value>``), as tritonserver's command line parser reads them.
_GLOBAL_SETTINGS = ("level", "rate", "count", "mode")
_TRITON_SETTINGS = ("file", "log-frequency")


def _cli_level(text: str) -> str:
    """A trace level as tritonserver's ParseTraceLevelOption reads it (case-insensitive;
    false/off, true/on/min/max/timestamps, tensors)."""
    value = text.lower()
    if value in ("false", "off"):
        return "OFF"
    if value in ("true", "on", "min", "max", "timestamps"):
        return "TIMESTAMPS"
    if value == "tensors":
        return "TENSORS"
    raise ValueError(f"invalid value for trace level option: {value}")


def _cli_int(text: object, low: int, high: int) -> int:
    """An integer option with tritonserver's wording (ParseOption<int>)."""
    try:
        number = int(str(text).strip(), 10)
    except ValueError:
        raise ValueError(f"Invalid option value. Got {text}") from None
    if not low <= number <= high:
        raise ValueError(f"Provided option value is out of bound. Got {text}")
    return number


def _config_items(config: Mapping[str, object] | Iterable[str]) -> list[tuple[str, str, str]]:
    """--trace-config entries as (mode, setting, value); mode "" for a global setting. A
    mapping's keys are "<setting>" or "<mode>,<setting>"; a list value (levels) gives one
    entry per item."""
    if isinstance(config, Mapping):
        entries: list[str] = []
        for key, value in config.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            entries += [f"{key}={v}" for v in values]
    elif isinstance(config, str):
        entries = [config]
    else:
        entries = [str(e) for e in config]
    items = []
    for arg in entries:
        mode, comma, rest = arg.partition(",")
        if not comma:
            mode, rest = "", arg
        elif mode == "":
            raise ValueError(
                "No trace mode specified. --trace-config option format is "
                f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {arg}"
            )
        setting, eq, value = rest.partition("=")
        if not eq or not setting or not value:
            raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}")
        mode = mode.lower()
        if mode and mode not in ("triton", "opentelemetry"):
            raise ValueError(
                f'invalid value for trace mode option: {mode}. Available options are "triton" and '
                '"opentelemetry"'
            )
        items.append((mode, setting, value))
    return items


def trace_options(
    config: Mapping[str, object] | Iterable[str] | None = None,
    *,
    trace_file: str | None = None,
    trace_level: str | Iterable[str] | None = None,
    trace_rate: int | str | None = None,
    trace_count: int | str | None = None,
    trace_log_frequency: int | str | None = None,
) -> dict[str, Any]:
    """The start-up trace settings from tritonserver's flags: ``--trace-config`` entries
    (`config`) over the older ``--trace-file``, ``--trace-level`` (repeatable),
    ``--trace-rate``, ``--trace-count`` and ``--trace-log-frequency``, as tritonserver merges
    them: levels add up, and an explicit OFF anywhere turns tracing off. Returns TraceSettings'
    keywords (trace_file, trace_level, trace_rate, trace_count, log_frequency). Raises
    ValueError with tritonserver's wording; a setting tritonserver would silently ignore (an
    unknown one, or a triton-mode setting given as a global one) is refused too, and so is the
    opentelemetry mode, which openinfer does not implement."""
    levels: list[str] = []
    if trace_level is not None:
        for lv in [trace_level] if isinstance(trace_level, str) else trace_level:
            try:
                levels.append(_cli_level(str(lv)))
            except ValueError as e:
                raise ValueError(f'Bad option: "--trace-level".\n{e}') from None
    out: dict[str, Any] = {"trace_file": trace_file}
    for key, value, low, high in (
        ("trace_rate", trace_rate, 0, _UINT32_MAX),
        ("trace_count", trace_count, MIN_TRACE_COUNT, _INT32_MAX),
        ("log_frequency", trace_log_frequency, 0, _UINT32_MAX),
    ):
        if value is not None:
            try:
                out[key] = _cli_int(value, low, high)
            except ValueError as e:
                flag = "--trace-log-frequency" if key == "log_frequency" else "--" + key.replace("_", "-")
                raise ValueError(f'Bad option: "{flag}".\n{e}') from None
    for mode, setting, value in _config_items(config or []):
        flag = f"--trace-config {mode + ',' if mode else ''}{setting}"
        try:
            if mode == "opentelemetry" or (setting == "mode" and value.lower() == "opentelemetry"):
                raise ValueError("trace mode 'opentelemetry' is not supported; openinfer writes Triton's trace files only")
            if mode == "" and setting not in _GLOBAL_SETTINGS:
                hint = (
                    f"; it is a triton mode setting: --trace-config triton,{setting}=<value>"
                    if setting in _TRITON_SETTINGS or setting == "log_frequency"
                    else ""
                )
                raise ValueError(
                    f"unknown trace setting '{setting}'; expected one of {', '.join(_GLOBAL_SETTINGS)}{hint}"
                )
            if mode == "triton" and setting not in _TRITON_SETTINGS:
                raise ValueError(
                    f"unknown triton trace setting '{setting}'; expected one of {', '.join(_TRITON_SETTINGS)}"
                )
            if setting == "level":
                levels.append(_cli_level(value))
            elif setting == "mode":
                if value.lower() != "triton":
                    raise ValueError(
                        f'invalid value for trace mode option: {value.lower()}. Available options are '
                        '"triton" and "opentelemetry"'
                    )
            elif setting == "rate":
                out["trace_rate"] = _cli_int(value, 0, _UINT32_MAX)
            elif setting == "count":
                out["trace_count"] = _cli_int(value, MIN_TRACE_COUNT, _INT32_MAX)
            elif setting == "file":
                out["trace_file"] = value
            else:  # log-frequency
                out["log_frequency"] = _cli_int(value, 0, _UINT32_MAX)
        except ValueError as e:
            raise ValueError(f'Bad option: "{flag}".\n{e}') from None
    if levels:
        out["trace_level"] = ["OFF"] if "OFF" in levels else [lv for lv in LEVELS[1:] if lv in levels]
    return out
