"""pb_utils.MetricFamily and pb_utils.Metric: a Triton Python model's custom metrics, with Triton's
API and checks. Their values live in the process that made them; they are not yet rendered on
/metrics (the C core renders that page), which docs/triton_python.md says."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise ValueError(f"MetricFamily '{name}': unknown kind {kind!r} (COUNTER, GAUGE or HISTOGRAM)")
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: Mapping[str, str] | None = None, buckets: Iterable[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        return Metric(self, dict(labels or {}), list(buckets) if buckets is not None else None)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        if family.kind == MetricFamily.HISTOGRAM and buckets is None:
            raise ValueError("Missing required buckets for histogram metrics.")
        if family.kind != MetricFamily.HISTOGRAM and buckets is not None:
            raise ValueError("Unexpected buckets found for non-histogram metrics.")
        self._family, self._labels, self._buckets = family, labels, buckets
        self._value = 0.0
        self._lock = threading.Lock()

    def increment(self, value: float) -> None:
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricIncrement only supports COUNTER and GAUGE kinds.")
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise ValueError("TRITONSERVER_MetricIncrement value for COUNTER must be non-negative.")
        with self._lock:
            self._value += value

    def set(self, value: float) -> None:
        if self._family.kind != MetricFamily.GAUGE:
            raise ValueError("TRITONSERVER_MetricSet only supports GAUGE kind.")
        with self._lock:
            self._value = float(value)

    def observe(self, value: float) -> None:
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricObserve only supports HISTOGRAM kind.")
        with self._lock:
            self._value += value

    def value(self) -> float:
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricValue only supports COUNTER and GAUGE kinds.")
        with self._lock:
            return self._value
