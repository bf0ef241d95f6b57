"""--max-instances: the model instances that clients' loads may take the server to, over every
model control that shares the budget (one per repository under --model-namespacing, see
openinfer._control.namespaces). A load reserves its instances before it starts any; the check
against the instances loaded and those every other load under way reserved, and the
reservation, are one step, so that loads at once, in any namespace, cannot pass the bound
together."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

# A model in a namespace (None: the server has no namespaces, or a model given in Python).
ModelKey = tuple[str | None, str]


class InstanceBudget:
    """The bound (`limit`) and the reservations of the loads under way, by model."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._reserved: dict[ModelKey, int] = {}  # the loads under way
        self._holders: list[Callable[[], Mapping[ModelKey, int]]] = []

    def count(self, loaded: Callable[[], Mapping[ModelKey, int]]) -> None:
        """Counts the instances that `loaded` answers, by model (a model control's loaded ones)."""
        self._holders.append(loaded)

    def reserve(self, key: ModelKey, asked: int) -> int | None:
        """Reserves `asked` instances for the load of model `key`, whose current instances it
        replaces, when they fit beside every other model's, loaded or reserved; None then. When
        they do not, reserves nothing and returns the instances the others hold."""
        with self._lock:
            others = sum(n for k, n in self._reserved.items() if k != key)
            others += sum(n for loaded in self._holders for k, n in loaded().items() if k != key)
            if asked + others > self.limit:
                return others
            self._reserved[key] = asked
            return None

    def release(self, key: ModelKey) -> None:
        """Ends the reservation of `key`'s load (its versions are counted as loaded by now, or
        it failed)."""
        with self._lock:
            self._reserved.pop(key, None)
