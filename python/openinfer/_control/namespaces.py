"""Model namespacing (tritonserver's ``--model-namespacing``): each model repository is a
namespace of its own, so several may hold a model of the same name.

One ModelControl per repository registers its models in the core under the repository's path
as their namespace. As in Triton's model repository manager:

- a request by a name that several namespaces hold is refused (the core: 400 / INVALID_ARGUMENT,
  "There are 2 identifiers of model 'm' in global map, model namespace must be provided to
  resolve ambiguity."); a name that one holds is served from it;
- an ensemble's step is its own namespace's model of that name, else the only one there is;
- the repository index lists every namespace's models, a shared name once per namespace;
- a load or unload by name loads or unloads that name in every namespace that has it;
- --max-instances bounds the instances of every namespace's models together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._backends import ensemble
from ..errors import InferenceServerError
from ..model import Model
from .._config import limits
from .control import IndexEntry, ModelControl, RepositoryApi, not_there
from .instance_budget import InstanceBudget
from .._repository.repository import LoadedModel


class NamespacedControl(RepositoryApi):
    """ModelControl's interface over one ModelControl per repository (and one for the given
    models, outside every repository)."""

    def __init__(
        self, core: Any, repos: Sequence[Path], given: Sequence[Model], *, load_models: Iterable[str] = (),
        **options: Any,
    ) -> None:
        load = [load_models] if isinstance(load_models, str) else list(load_models)
        # One --max-instances over every namespace: loads in several at once reserve from it.
        options["instance_budget"] = InstanceBudget(options.get("max_instances") or limits.default_max_instances())
        self._spaces = [
            ModelControl(core, repo, [], load_models=load, namespace=str(repo), start_up=False, **options)
            for repo in repos
        ]
        if given:
            self._spaces.append(ModelControl(core, None, given, load_models=load, start_up=False, **options))
        for space in self._spaces:
            space.peers = lambda space=space: [s for s in self._spaces if s is not space]
        self._max_json_depth = self._spaces[0]._max_json_depth
        # Ensembles after the models they run, over every namespace: a step may be another's.
        names = {id(space): space.start_up_names(load) for space in self._spaces}  # read once: configs
        for space in self._spaces:
            space.brought_along(names[id(space)], load)
        wanted = {name: [s for s in self._spaces if name in names[id(s)] and s.has(name)]
                  for space in self._spaces for name in names[id(space)]}
        self._repos = list(repos)
        for name in ensemble.load_order(list(wanted), lambda n: self._steps(wanted[n], n)):
            if not wanted[name]:  # --load-model of a model in no repository
                raise ValueError(not_there(name, self._repos).message)
            for space in wanted[name]:
                space.load_at_start(name)

    @property
    def mode(self) -> str:
        return self._spaces[0].mode

    def loaded(self) -> list[LoadedModel]:
        return sorted((e for s in self._spaces for e in s.loaded()), key=lambda e: e.name)

    def index(self, ready: bool = False) -> list[IndexEntry]:
        """Every namespace's index, by namespace then name as Triton lists them."""
        by_namespace = sorted(self._spaces, key=lambda s: s.namespace or "")
        return [entry for space in by_namespace for entry in space.index(ready)]

    def ready(self, name: str | None, version: int) -> bool:
        if name is None:
            return all(s.ready(None, version) for s in self._spaces)
        holders = self._holders(name)
        return len(holders) == 1 and holders[0].ready(name, version)

    def model_dir(self, name: str) -> Path | None:
        dirs = [d for d in (s.model_dir(name) for s in self._spaces) if d is not None]
        return dirs[0] if len(dirs) == 1 else None

    def load(
        self, name: str, config: str | None = None, files: Mapping[str, bytes] | None = None, *, stop: Any = None
    ) -> None:
        """Loads model `name` in every namespace that has it; raises the first failure once each
        has been tried."""
        spaces = [s for s in self._spaces if s.has(name)]
        # none: the first's (a load with files, or a refusal)
        failures = _each(spaces or self._spaces[:1], lambda space: space.load(name, config, files, stop=stop))
        if failures:
            raise not_there(name, self._repos) if failures[0].status == 404 and not spaces else failures[0]

    def load_later(self, name: str) -> bool:
        """ModelControl.load_later in every namespace that has `name`; raises the first failure
        once each has been tried."""
        loaded: list[bool] = []
        failures = _each([s for s in self._spaces if s.has(name)], lambda space: loaded.append(space.load_later(name)))
        if failures:
            raise failures[0]
        return any(loaded)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        for space in self._spaces:
            space.unload(name, unload_dependents)

    def start(self) -> None:
        for space in self._spaces:
            space.start()

    def close(self, timeout: float) -> None:
        for space in self._spaces:
            space.close(timeout)

    @staticmethod
    def _steps(spaces: list[ModelControl], name: str) -> list[str] | None:
        """The step models of the ensembles named `name` in `spaces`, together (None: none is one)."""
        steps = [step for space in spaces for step in space._ensemble_steps(name) or []]
        return steps or None

    def _holders(self, name: str) -> list[ModelControl]:
        return [s for s in self._spaces if s.holds(name)]


def _each(spaces: list[ModelControl], act: Callable[[ModelControl], object]) -> list[InferenceServerError]:
    """Does `act` in each of `spaces`, each tried whatever the others did; returns the failures."""
    failures = []
    for space in spaces:
        try:
            act(space)
        except InferenceServerError as e:
            failures.append(e)
    return failures
