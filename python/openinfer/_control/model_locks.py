"""One lock per model name, so that model control never waits on another model: a load or
unload holds its model's lock only, and one model whose unload waits on a hung execute leaves
the loads and unloads of every other model free to run. A name's lock exists while someone
holds or waits for it, so the table stays as small as the operations under way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ModelLocks:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._changed = threading.Condition(self._mu)
        self._locks: dict[str, tuple[threading.Lock, list[int]]] = {}  # name -> (lock, [users])

    @contextmanager
    def hold(self, name: str, timeout: float | None = None) -> Iterator[bool]:
        """Holds `name`'s lock for the block; yields False (and holds nothing) when it was not
        free within `timeout` seconds (None: waits as long as it takes)."""
        with self._mu:
            lock, users = self._locks.setdefault(name, (threading.Lock(), [0]))
            users[0] += 1
        got = lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        try:
            yield got
        finally:
            if got:
                lock.release()
            with self._mu:
                users[0] -= 1
                if not users[0]:
                    del self._locks[name]
                self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds until no operation holds or waits for a lock; returns
        whether none does."""
        with self._mu:
            return self._changed.wait_for(lambda: not self._locks, max(timeout, 0.0))
