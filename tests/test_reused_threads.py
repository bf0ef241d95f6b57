"""The threads decoupled Triton Python executes run on (_backends/reused_threads.py): a call
never waits for another, finished threads are reused, and idle ones end."""

from __future__ import annotations

import threading
import time

from openinfer._backends import reused_threads
from openinfer._backends.reused_threads import ReusedThreads


def _threads_named(name: str) -> int:
    return sum(t.name == name for t in threading.enumerate())


def test_blocked_calls_do_not_hold_up_new_ones() -> None:
    pool, release, started = ReusedThreads("test-reused-block"), threading.Event(), threading.Semaphore(0)

    def blocks() -> None:
        started.release()
        release.wait(10)

    for _ in range(8):
        pool.run(blocks)
    try:
        assert all(started.acquire(timeout=10) for _ in range(8)), "a call waited for another to end"
        assert _threads_named("test-reused-block") == 8
    finally:
        release.set()


def test_finished_threads_are_reused() -> None:
    pool, seen = ReusedThreads("test-reused-reuse"), []
    for _ in range(20):
        done = threading.Event()
        pool.run(lambda: (seen.append(threading.get_ident()), done.set()))
        assert done.wait(10)
        deadline = time.monotonic() + 10  # the thread counts itself idle just after fn returns
        while pool._idle == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert len(set(seen)) == 1 and _threads_named("test-reused-reuse") == 1


def test_idle_threads_end(monkeypatch) -> None:
    monkeypatch.setattr(reused_threads, "IDLE_S", 0.05)
    pool, done = ReusedThreads("test-reused-idle"), threading.Event()
    pool.run(done.set)
    assert done.wait(10)
    deadline = time.monotonic() + 10
    while _threads_named("test-reused-idle") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads_named("test-reused-idle") == 0 and pool._idle == 0
    again = threading.Event()
    pool.run(again.set)  # a new thread starts for the next call
    assert again.wait(10)
