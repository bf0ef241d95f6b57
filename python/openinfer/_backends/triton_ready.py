"""A Triton Python model's own readiness: ``TritonPythonModel.is_ready()``, as python_backend asks
it (README "is_ready", src/python_be.cc RunUserModelReadinessCheck).

The core answers a ready check of such a model (``GET /v2/models/<m>[/versions/<v>]/ready``,
gRPC ModelReady, and strict server readiness) on a control thread instead of its event loop, and
this module gives the answer:
every instance must say True. Each instance has at most one is_ready() call in flight, on a
thread of its own; checks that come meanwhile share that call's result. A call that has not
returned within five seconds, that raises, or that returns anything but a bool makes the model
not ready for that check; the failure is logged once, until is_ready() answers again.
Instances in worker processes answer over a socket of their own (`WorkerReadiness`), from a
thread of the worker.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import struct
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from . import triton_utils as pb
from .worker_peer import connected_worker

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


class WorkerReadiness:
    """The is_ready() of a model's instances in worker processes, asked over a socket of their
    own (an abstract Unix stream socket this process listens on; each worker connects as it
    loads, saying its number), beside the job wire. A check asks every worker once; a worker
    still busy with an earlier question is not asked again, its answer to that one is awaited.
    Checks that come while one runs share its result. A worker missing (it died and its
    successor has not loaded yet), silent for five seconds, or answering False makes the
    model not ready."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._pending: Future[bool] | None = None
        self._workers: dict[int, tuple[socket.socket, list[bool]]] = {}  # number: (conn, [asked])
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.address = f"\0openinfer-ready-{os.getpid()}-{id(self)}"
        self._sock.bind(self.address)
        self._sock.listen(count)
        threading.Thread(target=self._accept, name="oi-is-ready-workers", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed: the model is unloaded
                return
            if not connected_worker(conn):  # another user's process found the name
                conn.close()
                continue
            conn.settimeout(TIMEOUT_S)  # a worker says its number at once
            try:
                said = conn.recv(4)
            except OSError:
                said = b""
            if len(said) != 4:
                conn.close()
                continue
            (number,) = struct.unpack("<I", said)
            with self._lock:
                old = self._workers.pop(number, None)
                self._workers[number] = (conn, [False])
            if old is not None:
                old[0].close()

    def __call__(self) -> bool:
        with self._lock:
            ask = self._pending is None or self._pending.done()
            if ask:
                self._pending = Future()
            pending = self._pending
        if ask:
            try:
                pending.set_result(self._ask())
            except Exception:  # noqa: BLE001 - a socket failing on our side: not ready
                pending.set_result(False)
        return pending.result()

    def _ask(self) -> bool:
        with self._lock:
            workers = dict(self._workers)
        ready = len(workers) == self._count
        deadline = time.monotonic() + TIMEOUT_S
        for conn, asked in workers.values():
            if not asked[0]:
                conn.sendall(b"?")
                asked[0] = True
        for number, (conn, asked) in workers.items():
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                answer = conn.recv(1)
            except TimeoutError:
                ready = False
                continue
            except OSError:
                answer = b""
            if not answer:  # the worker has gone
                with self._lock:
                    if self._workers.get(number, (None,))[0] is conn:
                        del self._workers[number]
                conn.close()
                ready = False
                continue
            asked[0] = False
            ready = ready and answer == b"\1"
        return ready

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return type(None), ()  # a model shipped to its workers leaves this behind

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            workers, self._workers = self._workers, {}
        for conn, _ in workers.values():
            conn.close()


def answer_in_worker(address: str, number: int, obj: Any, name: str) -> None:
    """In worker number `number`: answers the server's readiness questions (`WorkerReadiness`)
    from a thread of its own, with `obj`'s is_ready()."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    conn.sendall(struct.pack("<I", number))
    readiness = Readiness([(obj, name)])

    def serve() -> None:
        try:
            while conn.recv(1):
                conn.sendall(b"\1" if readiness() else b"\0")
        except OSError:  # the server has gone
            pass

    threading.Thread(target=serve, name="oi-is-ready", daemon=True).start()
