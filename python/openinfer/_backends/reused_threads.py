"""Threads for work that may block for as long as it likes (a decoupled model's execute, which
runs until its last response is sent), reused rather than started per call: starting a Python
thread costs ~140 µs of CPU, as much as a streamed request's tokens. A call never waits for
another: it takes an idle thread, or a new one is started when none is idle. A thread idle for
IDLE_S ends, so a burst of calls leaves no threads behind."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_S = 30.0


class ReusedThreads:
    def __init__(self, name: str) -> None:
        self._name = name
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work that no call has claimed yet

    def run(self, fn: Callable[[], None]) -> None:
        """Runs `fn()` (which handles its own exceptions) on an idle thread or a new one."""
        with self._lock:
            claimed = self._idle > 0
            self._idle -= claimed
        self._work.put(fn)
        if not claimed:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                fn = self._work.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # unclaimed: this thread ends, counted out
                        self._idle -= 1
                        return
                continue  # a call claimed this thread as it timed out: its work is queued
            fn()
            del fn  # the finished call's closure (its request) is not kept while idle
            with self._lock:
                self._idle += 1
