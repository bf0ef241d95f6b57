"""Triton's logging extension: ``GET/POST /v2/logging`` and gRPC ``LogSettings`` read and
change the server's log settings, which drive the ``openinfer`` logger (the C core writes no
log of its own: it reports through statuses, statistics and the access log).

- ``log_info`` / ``log_warning`` / ``log_error``: whether records of that level pass;
- ``log_verbose_level``: above 0, DEBUG records pass too;
- ``log_format``: ``default`` (Triton's ``I1123 16:49:01.123456 1234 file.py:12] text``) or
  ``ISO8601`` (``2026-11-23T16:49:01Z I 1234 file.py:12] text``), for ``log_file``'s lines
  (without a log file the application's logging configuration formats them);
- ``log_file``: set at start only (``--log-file``); as in Triton, a client cannot move it.

The ``openinfer`` logger is the process's: with several servers, the settings of the one
started last govern it (each server still reports its own).

The settings are validated together and applied only when all are valid.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from .control import _body_object
from ..errors import InferenceServerError

FORMATS = ("default", "ISO8601")
_BOOLS = ("log_info", "log_warning", "log_error")
_INT32_MAX = 2**31 - 1


class TritonFormatter(logging.Formatter):
    """Triton's log line layouts."""

    def __init__(self, layout: str = "default") -> None:
        super().__init__()
        self.layout = layout

    def format(self, record: logging.LogRecord) -> str:
        letter = "V" if record.levelno < logging.INFO else record.levelname[0]
        where = f"{record.process} {record.filename}:{record.lineno}] {record.getMessage()}"
        if self.layout == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            line = f"{stamp} {letter} {where}"
        else:
            local = time.localtime(record.created)
            micros = int((record.created % 1) * 1_000_000)
            line = f"{letter}{time.strftime('%m%d %H:%M:%S', local)}.{micros:06d} {where}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class LogSettings:
    """One server's settings. While they govern the ``openinfer`` logger (see `install`), it
    lets through only the levels they enable. `handler` (for `log_file`) writes in
    `log_format`; without one, the application's own logging configuration writes the
    records."""

    def __init__(
        self,
        *,
        log_file: str | None = None,
        log_info: bool = True,
        log_warning: bool = True,
        log_error: bool = True,
        log_verbose_level: int = 0,
        log_format: str = "default",
    ) -> None:
        if log_format not in FORMATS:
            raise ValueError(f"invalid argument for --log-format, got: {log_format}")
        if not 0 <= log_verbose_level <= _INT32_MAX:
            raise ValueError(f"invalid argument for --log-verbose, got: {log_verbose_level}")
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {
            "log_file": log_file or "",
            "log_info": log_info,
            "log_warning": log_warning,
            "log_error": log_error,
            "log_verbose_level": log_verbose_level,
            "log_format": log_format,
        }
        self._formatter = TritonFormatter(log_format)
        self.handler: logging.Handler | None = None
        if log_file:
            self.handler = logging.FileHandler(log_file, encoding="utf-8")
            self.handler.setFormatter(self._formatter)
        self._logger = logging.getLogger("openinfer")
        self._saved_propagate = self._logger.propagate

    def install(self) -> None:
        """Puts the handler on the ``openinfer`` logger, and makes these settings the ones that
        govern it (the logger is the process's: with several servers, the most recently
        started one's settings apply, each server still reporting its own)."""
        if self.handler is not None:
            self._logger.addHandler(self.handler)
            self._saved_propagate = self._logger.propagate
            self._logger.propagate = False  # the log file alone, as tritonserver's --log-file
        with _GATE.lock:
            if not _GATE.active:
                _GATE.saved_level = self._logger.level
                self._logger.addFilter(_GATE)
            _GATE.active.append(self)
            self._apply()

    def uninstall(self) -> None:
        with _GATE.lock:
            if self in _GATE.active:
                _GATE.active.remove(self)
                if _GATE.active:
                    _GATE.active[-1]._apply()
                else:
                    self._logger.removeFilter(_GATE)
                    self._logger.setLevel(_GATE.saved_level)
        if self.handler is not None and self.handler in self._logger.handlers:
            self._logger.removeHandler(self.handler)
            self._logger.propagate = self._saved_propagate
            self.handler.close()

    def passes(self, record: logging.LogRecord) -> bool:
        v = self._values
        if record.levelno >= logging.ERROR:
            return bool(v["log_error"])
        if record.levelno >= logging.WARNING:
            return bool(v["log_warning"])
        if record.levelno >= logging.INFO:
            return bool(v["log_info"])
        return v["log_verbose_level"] > 0

    def settings(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Validates `changes` (setting -> value; None leaves a setting as it is) with Triton's
        checks and wording, applies them all or none, and returns the settings. Raises
        InferenceServerError."""
        new: dict[str, Any] = {}
        for name, value in changes.items():
            if value is None:
                continue
            if name == "log_file":
                raise InferenceServerError(
                    501, "log file location can not be updated through network protocol"
                )
            if name in _BOOLS:
                if not isinstance(value, bool):
                    raise InferenceServerError(400, f"expect boolean for '{name}'")
            elif name == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise InferenceServerError(400, f"expect int32 for '{name}'")
                if not 0 <= value <= _INT32_MAX:
                    raise InferenceServerError(
                        400, f"invalid argument for log_verbose_level, got: {value}"
                    )
            elif name == "log_format":
                if not isinstance(value, str):
                    raise InferenceServerError(400, f"expect string for '{name}'")
                if value not in FORMATS:
                    raise InferenceServerError(
                        400, f"invalid argument for log_format, got: {value}"
                    )
            else:
                # Triton ignores names it does not know; a typo would then pass unnoticed.
                raise InferenceServerError(
                    400,
                    f"unknown log setting '{name}'; expected one of log_file, log_info, "
                    "log_warning, log_error, log_verbose_level, log_format",
                )
            new[name] = value
        with self._lock:
            self._values.update(new)
            values = dict(self._values)
        with _GATE.lock:
            self._apply()
        return values

    def _apply(self) -> None:
        """Under _GATE.lock: the layout, and the logger's level when these settings govern it."""
        v = self._values
        self._formatter.layout = v["log_format"]
        if _GATE.active and _GATE.active[-1] is self:
            self._logger.setLevel(logging.DEBUG if v["log_verbose_level"] > 0 else logging.INFO)

    def handle(self, body: bytes | None, params: dict[str, Any] | None) -> list[tuple[str, Any]]:
        """The core's logging handler: an HTTP body (JSON object) or gRPC's typed settings;
        neither only reads. Returns every setting as (name, value)."""
        if body is not None:
            settings = self.update(_body_object(body, "dynamic logging"))
        elif params:
            settings = self.update(params)
        else:
            settings = self.settings()
        return list(settings.items())


class _Gate(logging.Filter):
    """The one filter on the ``openinfer`` logger: the governing settings decide."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.active: list[LogSettings] = []
        self.saved_level = logging.NOTSET

    def filter(self, record: logging.LogRecord) -> bool:
        active = self.active
        return active[-1].passes(record) if active else True


_GATE = _Gate()
