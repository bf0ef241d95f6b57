"""A Triton Python model's own readiness: ``TritonPythonModel.is_ready()``, as python_backend asks
it (README "is_ready", src/python_be.cc RunUserModelReadinessCheck).

The core answers a ready check of such a model (``GET /v2/models/<m>[/versions/<v>]/ready``,
gRPC ModelReady) on a control thread instead of its event loop, and this module gives the answer:
every instance must say True. Each instance has at most one is_ready() call in flight, on a
thread of its own; checks that come meanwhile share that call's result. A call that has not
returned within five seconds, that raises, or that returns anything but a bool makes the model
not ready for that check; the failure is logged once, until is_ready() answers again.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from . import triton_utils as pb

# python_backend's kUserModelReadinessTimeoutMs.
TIMEOUT_S = 5.0


def defines_is_ready(cls: type) -> bool:
    return callable(getattr(cls, "is_ready", None))


class _Instance:
    """One TritonPythonModel object's is_ready(): one call in flight, shared by the checks that
    come while it runs."""

    def __init__(self, obj: Any, name: str) -> None:
        self._obj = obj
        self._name = name
        self._lock = threading.Lock()
        self._pending: Future[bool] | None = None
        self._failing = False  # a failure was logged; the next one is not, until a good answer

    def ask(self) -> Future[bool]:
        with self._lock:
            if self._pending is None or self._pending.done():
                self._pending = Future()
                threading.Thread(
                    target=self._run, args=(self._pending,), name=f"oi-is-ready-{self._name}", daemon=True
                ).start()
            return self._pending

    def _run(self, answer: Future[bool]) -> None:
        try:
            result = self._obj.is_ready()
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            if not isinstance(result, bool):
                raise TypeError(f"is_ready() must return a boolean value, got {type(result).__name__}")
        except Exception as e:  # noqa: BLE001 - whatever it raised, the instance is not ready
            self.failed(f"raised {type(e).__name__}: {e}")
            answer.set_result(False)
            return
        self._failing = False
        answer.set_result(result)

    def failed(self, how: str) -> None:
        if not self._failing:
            self._failing = True
            pb.Logger.log_error(f"is_ready() of model instance '{self._name}' {how}: the model is not ready")


class Readiness:
    """The is_ready() of a model's instances in this process."""

    def __init__(self, instances: list[tuple[Any, str]]) -> None:
        self._instances = [_Instance(obj, name) for obj, name in instances]

    def __call__(self) -> bool:
        """Whether every instance says it is ready, within TIMEOUT_S in all."""
        asked = [(i, i.ask()) for i in self._instances]
        deadline = time.monotonic() + TIMEOUT_S
        ready = True
        for instance, answer in asked:
            try:
                ready = answer.result(timeout=max(0.0, deadline - time.monotonic())) and ready
            except FutureTimeout:
                instance.failed(f"did not return within {TIMEOUT_S:g} s")
                ready = False
        return ready
