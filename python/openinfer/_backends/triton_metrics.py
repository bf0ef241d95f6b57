"""pb_utils.MetricFamily and pb_utils.Metric: a Triton Python model's custom metrics, with Triton's
API and checks, shown on /metrics after the server's own families.

The values live here, in the process of the model that made them; every change renders the
families of this process as Prometheus text and hands it to each running server's C core
(`add_sink`), which appends it to every scrape. So a scrape never takes the GIL, and nothing is
formatted on the inference path but by the model that changed a metric. A model whose instances
run in worker processes sends each change of its process's metrics as one datagram to the
server process (`listen`, `send_to`), which merges them with its own as Triton's one registry
would hold them: the instances' metrics of one name and labels are one metric (counters and
histograms add up, a gauge shows the value set last). A family or metric that is no longer
referenced leaves /metrics, as Triton removes it.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .worker_peer import receive_from_workers

_lock = threading.RLock()
_families: weakref.WeakValueDictionary[str, MetricFamily] = weakref.WeakValueDictionary()
_sinks: dict[int, Callable[[bytes], None]] = {}
# Worker processes' latest snapshots, by pid (server process), and where this process sends its
# own (a worker).
_remote: dict[int, list[Any]] = {}
_address: str | None = None
_sender: socket.socket | None = None
_clock = itertools.count()


def listen() -> str:
    """The server process's address for its workers' metrics (an abstract Unix datagram socket),
    with a thread that takes their snapshots in; made once per process."""
    global _address
    with _lock:
        if _address is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # who sent each datagram
            name = f"\0openinfer-metrics-{os.getpid()}-{id(sock)}"
            sock.bind(name)
            threading.Thread(target=_receive, args=(sock,), name="openinfer-triton-metrics", daemon=True).start()
            _address = name
        return _address


def send_to(address: str) -> None:
    """In a worker: from now on every change of this process's metrics goes to `address`."""
    global _sender
    with _lock:
        _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sender.connect(address)


def _receive(sock: socket.socket) -> None:
    while True:
        data = receive_from_workers(sock, 1 << 20)
        if data is None:  # not one of our workers: another user's process found the name
            continue
        try:
            message = json.loads(data)
            pid, families = int(message["pid"]), list(message["families"])
        except (ValueError, KeyError, TypeError):
            continue
        with _lock:
            _remote[pid] = families
            _publish()


def add_sink(key: int, sink: Callable[[bytes], None]) -> None:
    """Hands this process's metrics to `sink` now and after every change, until `remove_sink`."""
    with _lock:
        _sinks[key] = sink
        sink(_render())


def remove_sink(key: int) -> None:
    with _lock:
        _sinks.pop(key, None)


def _changed() -> None:
    with _lock:
        if _sender is not None:
            try:
                _sender.send(json.dumps({"pid": os.getpid(), "families": _snapshot()}).encode())
            except OSError:  # the server has gone: the worker ends soon
                pass
        _publish()


def _publish() -> None:
    with _lock:
        if not _sinks:
            return
        text = _render()
        for sink in list(_sinks.values()):
            try:
                sink(text)
            except RuntimeError:  # a server stopping meanwhile
                pass


def _number(value: float) -> str:
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _labels(labels: Mapping[str, str], extra: tuple[str, str] | None = None) -> str:
    items = sorted(labels.items()) + ([extra] if extra else [])
    if not items:
        return ""
    escaped = (v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for _, v in items)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(items, escaped)) + "}"


def _snapshot() -> list[Any]:
    """This process's live families: [name, description, kind, [[labels, value, counts, buckets, stamp]]]."""
    out = []
    for name in sorted(_families.keys()):
        family = _families.get(name)
        metrics = [m() for m in (family._metrics.values() if family is not None else [])]
        live = [[sorted(m._labels.items()), m._value, m._counts, m._buckets, m._stamp] for m in metrics if m is not None]
        if family is not None and live:
            out.append([name, family.description, family.kind, live])
    return out


def _merged() -> list[tuple[str, str, int, list[Any]]]:
    """Every process's families, the metrics of one name and labels merged into one."""
    families: dict[str, tuple[str, int, dict[str, list[Any]]]] = {}
    for snapshot in [_snapshot(), *_remote.values()]:
        for name, description, kind, metrics in snapshot:
            _, _, merged = families.setdefault(name, (description, kind, {}))
            for labels, value, counts, buckets, stamp in metrics:
                key = json.dumps(labels)
                have = merged.get(key)
                if have is None:
                    merged[key] = [labels, value, list(counts), buckets, stamp]
                elif kind == MetricFamily.GAUGE:
                    if stamp > have[4]:
                        have[1], have[4] = value, stamp
                else:
                    have[1] += value
                    have[2] = [a + b for a, b in zip(have[2], counts)]
    return [(name, d, k, list(m.values())) for name, (d, k, m) in sorted(families.items())]


def _render() -> bytes:
    lines: list[str] = []
    for name, description, kind, metrics in _merged():
        help_text = description.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {('counter', 'gauge', 'histogram')[kind]}"]
        for labels, value, counts, buckets, _ in metrics:
            labels = dict(labels)
            if kind != MetricFamily.HISTOGRAM:
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
                continue
            cumulative = 0
            for bound, count in zip([*buckets, math.inf], counts):
                cumulative += count
                lines.append(f"{name}_bucket{_labels(labels, ('le', _number(bound)))} {cumulative}")
            lines.append(f"{name}_sum{_labels(labels)} {_number(value)}")
            lines.append(f"{name}_count{_labels(labels)} {cumulative}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM). Two families of one
    name and kind are the same family, as in Triton; another kind under a taken name is refused."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise ValueError(f"MetricFamily '{name}': unknown kind {kind!r} (COUNTER, GAUGE or HISTOGRAM)")
        self.name, self.description, self.kind = name, description, kind
        with _lock:
            existing = _families.get(name)
            if existing is not None and existing.kind != kind:
                raise ValueError(
                    f"Failed to register metric family '{name}': a family of that name exists with another kind"
                )
            # Families of one name share their metrics (keyed by labels).
            self._metrics: dict[tuple[tuple[str, str], ...], weakref.ref[Metric]] = (
                existing._metrics if existing is not None else {}
            )
            _families[name] = self

    def Metric(self, labels: Mapping[str, str] | None = None, buckets: Iterable[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        return Metric(self, dict(labels or {}), list(buckets) if buckets is not None else None)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        if family.kind == MetricFamily.HISTOGRAM and buckets is None:
            raise ValueError("Missing required buckets for histogram metrics.")
        if family.kind != MetricFamily.HISTOGRAM and buckets is not None:
            raise ValueError("Unexpected buckets found for non-histogram metrics.")
        self._family, self._labels = family, {str(k): str(v) for k, v in labels.items()}
        self._buckets = sorted(buckets or [])
        self._counts = [0] * (len(self._buckets) + 1)
        self._value = 0.0
        self._stamp = 0.0  # when a gauge was set last: the latest of its instances' values wins
        with _lock:
            family._metrics[tuple(sorted(self._labels.items()))] = weakref.ref(self, lambda _: _changed())
        _changed()

    def increment(self, value: float) -> None:
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricIncrement only supports COUNTER and GAUGE kinds.")
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise ValueError("TRITONSERVER_MetricIncrement value for COUNTER must be non-negative.")
        with _lock:
            self._value += value
            _changed()

    def set(self, value: float) -> None:
        if self._family.kind != MetricFamily.GAUGE:
            raise ValueError("TRITONSERVER_MetricSet only supports GAUGE kind.")
        with _lock:
            self._value = float(value)
            self._stamp = time.time() + next(_clock) * 1e-9
            _changed()

    def observe(self, value: float) -> None:
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricObserve only supports HISTOGRAM kind.")
        with _lock:
            self._value += value
            self._counts[bisect.bisect_left(self._buckets, value)] += 1
            _changed()

    def value(self) -> float:
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("TRITONSERVER_MetricValue only supports COUNTER and GAUGE kinds.")
        with _lock:
            return self._value
