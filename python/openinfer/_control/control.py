"""Model control: which models are served, loading and unloading them while the server runs,
and the repository index. This is Triton's model_repository extension and its
``--model-control-mode``:

- ``none`` (the default): every model of the repository is loaded at start-up; loading and
  unloading through the API are refused.
- ``poll``: the same, and the repository is scanned every ``repository_poll_secs`` seconds:
  new models load, changed ones (config.pbtxt or any file of the model, by mtime and size)
  reload, removed ones unload. The API is refused, as in Triton.
- ``explicit``: only the models named by ``load_models`` (``"*"``: all) load at start-up; the
  API loads, reloads and unloads.

A load builds every version before serving any, then swaps them into the core's registry in one
step: requests already admitted to an old version finish on it (the swap waits for them),
new ones reach the new version. A version that fails to load never replaces a ready one.

Files sent with a load (``file:<version>/<name>`` parameters) are written into a private
temporary directory (mode 0700) that this server alone writes; it goes when the versions that
use it are unloaded, or at stop.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._backends import ensemble, processes
from .._config import limits, paths, triton_config
from .._repository import warmup
from ..config import (
    DEFAULT_MAX_JSON_DEPTH,
    ConfigError,
    DynamicBatching,
    ModelConfig,
    check_json_depth,
    parse_json_config,
)
from ..errors import InferenceServerError
from ..model import Model, Tensor
from .._backends.identity_model import IdentityModel
from .._backends.onnx_model import OnnxModel
from .._backends.model_file import forget_model
from .._backends.triton_model import TritonModel
from .._repository.repository import _NOT_INSTALLED, LoadedModel, scan_model
from .._config.sequence import SequenceBatching
from .._backends.torch_model import TorchModel
from .instance_budget import InstanceBudget, ModelKey
from .model_locks import ModelLocks

logger = logging.getLogger("openinfer")

MODES = ("none", "poll", "explicit")
DEFAULT_POLL_SECS = 15.0

# The version a model is registered under when it failed before any version directory could
# be chosen: the core needs one to answer "not ready" with the reason.
FAILED_MODEL_VERSION = 1

# Files one load may carry: their number and their decoded size together.
MAX_LOAD_FILES = 1024
MAX_LOAD_FILE_BYTES = 2 << 30
_NAME_MAX = 255  # bytes in one file name (Linux's NAME_MAX)

_NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
_STOPPED = "the load was stopped (unloaded, or its client left) before this version started"

IndexEntry = tuple[str, str | None, str | None, str | None]


@dataclass
class _Version:
    """One version registered in the core."""

    ready: bool
    temp: Path | None  # the load's temporary directory, when it came with files


class RepositoryApi:
    """The repository extension over `ready`, `index`, `load` and `unload` (ModelControl's, or
    the namespaced models' of openinfer._control.namespaces)."""

    _max_json_depth = DEFAULT_MAX_JSON_DEPTH

    def ready(self, name: str | None, version: int) -> bool:
        raise NotImplementedError

    def index(self, ready: bool = False) -> list[IndexEntry]:
        raise NotImplementedError

    def load(self, name: str, config: str | None = None, files: Mapping[str, bytes] | None = None, *,
             stop: Any = None) -> None:
        raise NotImplementedError

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        raise NotImplementedError

    def handle(
        self,
        op: str,
        model: str | None,
        body: bytes | None,
        params: dict[str, Any] | None,
        ready: bool,
        stop: Any = None,
    ) -> list[IndexEntry] | None:
        """The core's repository handler: one index, load or unload request, its body as the
        HTTP client sent it, or its parameters as gRPC decoded them; `stop`, a byte that the
        core sets when the client goes (a load then gives up starting worker processes).
        Raises InferenceServerError with the status to answer."""
        if op == "ready":
            assert params is not None
            return self.ready(model, params["version"])
        if op == "index":
            if body is not None:
                ready = _body_flag(_body_object(body, "registry index", self._max_json_depth), "ready")
            return self.index(ready)
        assert model is not None
        if op == "load":
            config, files = _load_params(body, params, self._max_json_depth)
            self.load(model, config, files, stop=stop)
        else:
            self.unload(model, _unload_params(body, params, self._max_json_depth))
        return None


class ModelControl(RepositoryApi):
    """Owns what the core serves: registers model versions, answers the repository extension
    (the core calls `handle` on its control threads) and runs the poll thread."""

    def __init__(
        self,
        core: Any,
        repo: Path | Sequence[Path] | None,
        given: Sequence[Model],
        *,
        mode: str = "none",
        load_models: Iterable[str] = (),
        poll_secs: float = DEFAULT_POLL_SECS,
        optional_torch: bool = False,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        max_instances: int | None = None,
        unload_timeout: float | None = None,
        load_code: bool = False,
        namespace: str | None = None,
        start_up: bool = True,
        deferred: Iterable[str] = (),
        backend_directories: Sequence[Path] = (),
        instance_budget: InstanceBudget | None = None,
    ) -> None:
        """`load_code`: Python files sent with a load are taken (no one beyond this host can
        reach the repository API unchecked); otherwise they are refused. `namespace`: the
        core's namespace of these models (--model-namespacing: one ModelControl per repository,
        see openinfer._control.namespaces, which loads their start-up models itself when
        `start_up` is False). `deferred`: models of the repository left out of the start-up
        load, for the caller to load later. `instance_budget`: the --max-instances budget shared with
        other controls (the namespaces'); by default one of its own, of `max_instances`."""
        if mode not in MODES:
            raise ValueError(f"model_control_mode must be one of {', '.join(MODES)}, got {mode!r}")
        load = [load_models] if isinstance(load_models, str) else list(load_models)
        if load and mode != "explicit":
            raise ValueError(
                "load_models (--load-model) needs model_control_mode 'explicit' "
                "(--model-control-mode explicit)"
            )
        if poll_secs <= 0:
            raise ValueError(f"repository_poll_secs must be > 0, got {poll_secs}")
        if unload_timeout is not None and not unload_timeout >= 0:
            raise ValueError(
                f"model_unload_timeout (--model-unload-timeout-secs) must be >= 0, got {unload_timeout!r}")
        if max_instances is not None and (isinstance(max_instances, bool) or not isinstance(max_instances, int)
                                          or max_instances < 1):
            raise ValueError(f"max_instances (--max-instances) must be an integer >= 1, got {max_instances!r}")
        self._core = core
        # tritonserver's --model-repository may be given more than once: a model is the
        # directory of its name in whichever repository has it, and one that two have is not
        # served (_model_dir).
        self._repos: list[Path] = [] if repo is None else [repo] if isinstance(repo, Path) else list(repo)
        self._mode = mode
        self._poll_secs = poll_secs
        self._optional_torch = optional_torch
        self._max_json_depth = max_json_depth or DEFAULT_MAX_JSON_DEPTH  # 0: the core's default
        self._budget = instance_budget or InstanceBudget(max_instances or limits.default_max_instances())
        self._budget.count(self._instances_loaded)
        self._max_instances = self._budget.limit
        self._load_code = load_code
        self._namespace = namespace
        self._deferred = set(deferred)
        # The ModelControls of the other namespaces (set by openinfer._control.namespaces): an
        # ensemble's step that this one lacks is theirs.
        self.peers: Callable[[], Sequence[ModelControl]] = lambda: ()
        self._backend_directories = tuple(backend_directories)  # Python-based backends (python_based)
        self._given: dict[str, list[Model]] = {}
        for model in given:
            self._given.setdefault(model.name, []).append(model)
        self._lock = threading.Lock()  # guards the tables below (held briefly)
        self._ops = ModelLocks()  # one load or unload of a model at a time; other models' run at once
        self._unload_timeout = unload_timeout
        self._states: dict[str, dict[int | None, tuple[str, str]]] = {}
        self._registered: dict[str, dict[int, _Version]] = {}
        self._loaded: dict[str, list[LoadedModel]] = {}
        self._fingerprints: dict[str, object] = {}
        self._temp_root: Path | None = None
        self._stops: dict[str, list[Any]] = {}  # loads under way: the byte that stops each
        # Models loaded only as the steps of an ensemble a client loaded (Triton's composing
        # models not explicitly loaded): an unload with unload_dependents takes them too.
        self._implicit: set[str] = set()
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        if start_up:
            names = self.start_up_names(load)
            self.brought_along(names, load)
            # Ensembles after the models they run: their steps are checked against those.
            for name in ensemble.load_order(list(names), self._ensemble_steps):
                self.load_at_start(name)

    def start_up_names(self, load: Sequence[str]) -> set[str]:
        """The models loaded at start: the given ones, and the repository's or those of
        `load` (--load-model, explicit mode)."""
        names = set(self._given)
        if self._repos and (self._mode != "explicit" or "*" in load):
            names |= set(self._repository_names())
        elif self._repos:  # with the step models of the ensembles among them, as a load takes them
            names |= set(load) | {step for name in load for step in self._composing_to_load(name, None)}
        return names - self._deferred

    def brought_along(self, names: set[str], load: Sequence[str]) -> None:
        """Marks the start-up `names` that --load-model did not name (the step models of its
        ensembles) as loaded along with them, for unload_dependents."""
        if self._mode == "explicit" and "*" not in load:
            self._implicit = names - set(load) - set(self._given)

    def load_at_start(self, name: str) -> None:
        """Loads model `name` at start-up; ValueError when no repository has it."""
        try:
            self._load(name, None, None, startup=True)
        except InferenceServerError as e:  # --load-model of a model that is not there
            raise ValueError(e.message) from None

    def load_later(self, name: str) -> bool:
        """Loads model `name` after start-up on the server's own account (an example left out
        of it), as a poll loads a model that changed, in any model control mode; False when the
        server is stopping. Raises InferenceServerError when it fails."""
        with self._ops.hold(name):
            if self._closed.is_set():
                return False
            self._load(name, None, None, startup=False)
            return True

    def has(self, name: str) -> bool:
        """Whether model `name` is given or in a repository of this control."""
        return name in self._given or (not name.startswith(".") and bool(self._model_dirs(name)))

    # ---- what is served -------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def namespace(self) -> str | None:
        return self._namespace

    def loaded(self) -> list[LoadedModel]:
        """Every version that was loaded or failed, by name then version."""
        with self._lock:
            return [e for name in sorted(self._loaded) for e in self._loaded[name]]

    def index(self, ready: bool = False) -> list[IndexEntry]:
        """The repository index as Triton lists it: every model of the repository (and every
        model loaded otherwise), each version with its state and the reason; a model never
        loaded by name only. `ready` keeps only READY versions."""
        names = set(self._repository_names())
        with self._lock:
            names |= set(self._states)
            out: list[IndexEntry] = []
            for name in sorted(names):
                states = self._states.get(name)
                if not states:
                    if not ready:
                        out.append((name, None, None, None))
                    continue
                for version in sorted(states, key=lambda v: -1 if v is None else v):
                    state, reason = states[version]
                    if ready and state != "READY":
                        continue
                    out.append(
                        (name, None if version is None else str(version), state, reason or None)
                    )
            return out

    # ---- what a Triton Python model reaches its server through (pb_utils) --------------------

    def bls(self, *args: Any, **kwargs: Any) -> Any:
        """A model's inference on this server (BLS): `_core.Server.bls` (which checks a decoupled
        target against the call once it is queued)."""
        kwargs.pop("decoupled", None)
        return self._core.bls(*args, **kwargs)

    def load_model(self, name: str, config: str, files: Mapping[str, bytes]) -> None:
        """pb_utils.load_model: as the repository extension's load (explicit mode only)."""
        self.load(name, config or None, files or None)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.unload(name, unload_dependents)

    def is_model_ready(self, name: str, version: str) -> bool:
        with self._lock:
            states = dict(self._states.get(name) or {})
        wanted = int(version) if version.isdigit() else None
        return any(state == "READY" and (wanted is None or v == wanted) for v, (state, _) in states.items())

    # ---- the repository extension ----------------------------------------------------------

    def ready(self, name: str | None, version: int) -> bool:
        """A ready check of a version that answers its own readiness (a Triton Python model's
        is_ready()), on a control thread: False once it is no longer loaded. `name` None: the
        server's strict readiness, whether every loaded version that answers its own is ready."""
        with self._lock:
            entries = [e for n, es in self._loaded.items() if name in (None, n) for e in es]
        if name is None:
            asks = [e.model.ready for e in entries if getattr(e.model, "ready_probe", False)]
            return all(ask() for ask in asks)
        model = next((e.model for e in entries if e.model is not None and e.model.version == version), None)
        ask = getattr(model, "ready", None)
        return bool(ask()) if callable(ask) else False

    def load(
        self,
        name: str,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
        *,
        stop: Any = None,
    ) -> None:
        """Loads or reloads model `name`: from the repository, or from `files` (relative path
        -> contents, with `config` required) in a temporary directory of its own. `config`
        (JSON) replaces config.pbtxt. `stop` (a writable buffer of one byte; default: a new
        one) gives up starting the model's worker processes once its byte is set, as an unload
        of `name` sets it. Raises InferenceServerError."""
        _check_name(name)
        if self._mode != "explicit":
            raise InferenceServerError(503, _NOT_ALLOWED)
        override = None
        if config is not None:
            try:
                override = parse_json_config(config, max_depth=self._max_json_depth)
            except ConfigError as e:
                raise InferenceServerError(400, f"failed to load '{name}': Invalid {e}") from None
            _check_override(name, override, self._max_instances)
        if files and override is None:
            raise InferenceServerError(
                400, "Load parameter 'config' must be specified for model file override"
            )
        stop = bytearray(1) if stop is None else stop
        unpolled = [why for step in self._composing_to_load(name, override)
                    if (why := self._load_requested(step, None, None, stop, composing=True)) is not None]
        self._load_requested(name, override, dict(files) if files else None, stop, composing=False)
        if unpolled:  # Triton's answer once the load is done (a step's config could not be read), and why
            raise InferenceServerError(
                500, f"failed to load '{name}', failed to poll from model repository: {' '.join(unpolled)}")

    def _load_requested(
        self, name: str, override: ModelConfig | None, files: dict[str, bytes] | None, stop: Any, *, composing: bool
    ) -> str | None:
        """A client's load of `name`; `composing`: as a step of the ensemble it asked for, left
        as it is when its files are as they were at its last load, and its failure left for the
        ensemble's load to name (a step that still has a ready version serves on with it, as
        in Triton). Returns why, when a step's config could not be read (Triton's poll failure:
        the step is left as it was)."""
        with self._lock:
            self._stops.setdefault(name, []).append(stop)
        try:
            with self._ops.hold(name):
                if self._closed.is_set():
                    raise InferenceServerError(503, "the server is shutting down")
                if composing and not self._changed(name):
                    return None
                with self._lock:
                    was_loaded = bool(self._loaded.get(name))
                try:
                    self._load(name, override, files, startup=False, stop=stop, requested=True)
                except InferenceServerError as e:
                    if not composing:
                        raise
                    logger.warning("step model %s of an ensemble being loaded: %s", name, e.message)
                    return e.message if isinstance(e, _LoadFailed) and e.unpolled else None
                with self._lock:  # a step keeps the way it was loaded first (Triton's explicitly_load_)
                    if not composing:
                        self._implicit.discard(name)
                    elif not was_loaded:
                        self._implicit.add(name)
                return None
        finally:
            with self._lock:
                stops = self._stops[name]
                stops.remove(stop)
                if not stops:
                    del self._stops[name]

    def _composing_to_load(self, name: str, override: ModelConfig | None) -> list[str]:
        """The models a load of ensemble `name` polls first, as Triton's model manager polls an
        ensemble's composing models with it: the step models (theirs too, for an ensemble of
        ensembles) that the repository has, steps before ensembles. `_load_requested` loads
        those not loaded and reloads those whose files changed (`_changed`)."""
        found: set[str] = set()
        todo = (ensemble.steps_of(override) if override is not None else self._ensemble_steps(name)) or []
        while todo:
            step = todo.pop()
            if step not in found and step != name and self.has(step):
                found.add(step)
                todo += self._ensemble_steps(step) or []
        return ensemble.load_order(list(found), self._ensemble_steps)

    def _changed(self, name: str) -> bool:
        """Whether step model `name` is (re)loaded with an ensemble: not loaded, or its
        repository files (config.pbtxt, version folders, any file: mtime and size) differ from
        those of its last successful load. A failed load keeps the files of the one before, so
        that the next load tries again (Triton reverts its timestamps likewise)."""
        with self._lock:
            if not self._loaded.get(name):
                return True
        dirs = self._model_dirs(name)
        return bool(dirs) and self._fingerprints.get(name) != tuple(_fingerprint(d) for d in dirs)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unloads every version of `name` once the requests admitted to it are answered, or
        once the unload timeout has passed (see `_retire`). A model that is not loaded is left
        as it is (as Triton does). With `unload_dependents`, the step models that were loaded
        only with this ensemble, and that no other loaded ensemble runs, are unloaded after it
        (Triton's cascading removal)."""
        if self._mode != "explicit":
            raise InferenceServerError(503, _NOT_ALLOWED)
        with self._lock:  # a load of it under way stops starting workers, then this waits for it
            for stop in self._stops.get(name, []):
                stop[0] = 1
        steps = self._loaded_steps(name) if unload_dependents else set()
        with self._ops.hold(name):
            if self._closed.is_set():
                raise InferenceServerError(503, "the server is shutting down")
            self._unload(name)
            with self._lock:
                self._implicit.discard(name)
        for step in sorted(steps):
            with self._lock:
                orphan = step in self._implicit and not any(step in self._loaded_steps_locked(n) for n in self._loaded)
            if orphan:
                self.unload(step, unload_dependents=True)

    def _loaded_steps(self, name: str) -> set[str]:
        with self._lock:
            return self._loaded_steps_locked(name)

    def _loaded_steps_locked(self, name: str) -> set[str]:
        """The step models of the loaded versions of ensemble `name` (none for other models)."""
        return {
            s.model_name
            for e in self._loaded.get(name, [])
            if isinstance(e.model, ensemble.EnsembleModel)
            for s in e.model.steps
        }

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Starts polling in poll mode."""
        if self._mode == "poll" and self._repos and self._poller is None:
            self._poller = threading.Thread(
                target=self._poll_loop, name="openinfer-repository-poll", daemon=True
            )
            self._poller.start()

    def close(self, timeout: float) -> None:
        """Stops polling, waits up to `timeout` seconds for a load or unload under way (one
        still going then fails once the core has stopped), and removes every temporary
        directory. The core is stopped after this, with what is registered."""
        self._closed.set()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout)
        self._ops.wait_idle(timeout)
        with self._lock:
            if self._temp_root is not None:
                shutil.rmtree(self._temp_root, ignore_errors=True)
                self._temp_root = None

    # ---- loading ---------------------------------------------------------------------------

    def _repository_names(self) -> list[str]:
        names: set[str] = set()
        for repo in self._repos:
            try:
                names.update(
                    p.name
                    for p in repo.iterdir()
                    if p.is_dir() and not p.name.startswith(".") and p.name != "__pycache__"
                )
            except OSError:
                pass
        return sorted(names)

    def holds(self, name: str) -> bool:
        """Whether versions of model `name` are loaded here (ready or failed)."""
        with self._lock:
            return bool(self._loaded.get(name))

    def model_dir(self, name: str) -> Path | None:
        """The folder of loaded model `name` in the repositories (its chat template's), None when
        it is not loaded or came from none."""
        with self._lock:
            loaded = name in self._loaded
        dirs = self._model_dirs(name) if loaded and not name.startswith(".") else []
        return dirs[0] if dirs else None

    def _model_dirs(self, name: str) -> list[Path]:
        """The directories of model `name`, one per repository that has it."""
        return [repo / name for repo in self._repos if (repo / name).is_dir()]

    def _model_dir(self, name: str) -> Path | None:
        """Where model `name` is: its directory in the one repository that has it (in the first
        repository when none has it: not there); None for a hidden name or no repository."""
        if not self._repos or name.startswith("."):
            return None
        dirs = self._model_dirs(name)
        return dirs[0] if dirs else self._repos[0] / name

    def _load(
        self,
        name: str,
        override: ModelConfig | None,
        files: dict[str, bytes] | None,
        *,
        startup: bool,
        stop: Any = None,
        requested: bool = False,
    ) -> None:
        """Finds, builds and publishes model `name`. At start-up failures stay in the tables
        (the server starts with the model not ready); later they also raise. A `requested` load
        (a client's, through the load API) must stay within max_instances."""
        started = time.monotonic()
        with self._lock:
            before = dict(self._states.get(name, {}))
        temp = self._write_files(name, files) if files is not None else None

        def loading(versions: list[int], each: int) -> None:
            if requested:  # reserved before any instance starts (an in-process Python model's, in the scan)
                self._check_instance_limit(name, [each] * len(versions), before)
            self._set_states(name, {v: ("LOADING", "") for v in versions}, keep=True)

        try:
            entries, fingerprint = self._scan(name, override, temp, loading, requested)
            if requested:  # what the versions start, which auto-completion may have changed
                self._check_instance_limit(name, [_instances(e) for e in entries], before)
            entries = self._publish(name, entries, temp, before, startup, started, temp or self._model_dir(name), stop)
        except BaseException:
            if temp is not None:
                shutil.rmtree(temp.parent, ignore_errors=True)
            raise
        finally:
            self._budget.release((self._namespace, name))
        if self._mode != "explicit" or not any(e.error is not None for e in entries):
            # A failed load keeps the files of the last one (see _changed); polling tries a
            # model again once it changes. Files sent with a load are no repository's: the next
            # load from the repository reloads.
            self._fingerprints[name] = fingerprint
        failures = [e for e in entries if e.error is not None]
        if failures and not startup:
            raise _LoadFailed(name, failures)

    def _scan(
        self, name: str, override: ModelConfig | None, temp: Path | None, loading: Callable[[list[int], int], None],
        requested: bool,
    ) -> tuple[list[LoadedModel], object]:
        """The versions of model `name`, built but not served: from its folder in the repository,
        from the files sent with the load (written to `temp`), or given in Python; and what
        polling compares of its folders (None for sent files: no repository's)."""
        model_dir = temp or self._model_dir(name)
        fingerprint = None
        if temp is None and model_dir is not None and len(self._model_dirs(name)) > 1:
            # tritonserver's words; in no repository is it served
            fingerprint = tuple(_fingerprint(d) for d in self._model_dirs(name))
            entries = [LoadedModel(name, None, None, f"failed to poll model '{name}': not unique across all "
                                   "model repositories", polled=False)]
        elif temp is None and model_dir is not None and model_dir.is_dir():
            fingerprint = (_fingerprint(model_dir),)  # as poll() takes it: one per repository
            entries = scan_model(model_dir, name=name, config=override, loading=loading,
                                 backend_directories=self._backend_directories)
            if self._optional_torch and not requested:  # a client's load says why it cannot
                entries = [e for e in entries if e.error is None or not e.error.startswith(_NOT_INSTALLED)]
                entries = [e for e in entries if not self._steps_left_out(e)]
        elif temp is not None:
            entries = scan_model(
                temp, name=name, config=override, allow_code=False, allow_python=self._load_code,
                loading=loading, backend_directories=self._backend_directories,
            )
            # the server's temporary directory stays its own
            return [replace(e, error=_hide(e.error, temp)) for e in entries], fingerprint
        elif name in self._given:
            entries = [_given_entry(name, m) for m in self._given[name]]
        else:  # hidden directories are no models, as in the index
            raise not_there(name, self._repos)
        if name in self._given:  # models= given beside the repository's
            versions = {e.version for e in entries}
            entries += [_given_entry(name, m) for m in self._given[name] if m.version not in versions]
        return entries, fingerprint

    def _publish(
        self,
        name: str,
        entries: list[LoadedModel],
        temp: Path | None,
        before: dict[int | None, tuple[str, str]],
        startup: bool,
        started: float,
        model_dir: Path | None = None,
        stop: Any = None,
    ) -> list[LoadedModel]:
        """Builds every version of `entries` in the core, then swaps them in for the versions
        now registered under `name` in one step. When a version fails while the model has
        ready versions, nothing changes (as in Triton, a failed reload leaves the model as it
        was, and its index states as `before`). Returns the entries, with the core's load
        failures (TorchScript) filled in."""
        numbers = sorted({_version(e) for e in entries})
        metadata_versions = [str(v) for v in numbers]
        built: list[tuple[LoadedModel, Any]] = []
        for entry in entries:
            if stop is not None and stop[0] and entry.error is None:
                entry = LoadedModel(entry.name, entry.version, None, _STOPPED, entry.config)
            try:
                handle = self._build(entry, metadata_versions, stop)
            except (TypeError, ValueError) as e:  # a declaration the core refuses
                if startup:
                    raise
                entry = LoadedModel(entry.name, entry.version, None, str(e), entry.config)
                handle = self._build(entry, metadata_versions)
            if handle.error is not None and entry.error is None:
                entry = LoadedModel(entry.name, entry.version, None, _hide(handle.error, temp), entry.config)
                if entry.error != handle.error:  # the core's message named the temporary directory
                    handle = self._build(entry, metadata_versions)
            if handle.error is None and entry.model is not None and entry.config.get("model_warmup"):
                failure = _warm_up(entry, handle, model_dir)
                if failure is not None:  # the version is served as UNAVAILABLE, with the reason
                    entry = LoadedModel(entry.name, entry.version, None, failure, entry.config)
                    handle = self._build(entry, metadata_versions)
            if handle.error is None:  # nv_model_load_duration_secs: from the load's start
                handle.load_seconds = time.monotonic() - started
            built.append((entry, handle))
        with self._lock:
            previous = dict(self._registered.get(name, {}))
        if any(e.error is not None for e, _ in built) and any(v.ready for v in previous.values()):
            with self._lock:
                self._states[name] = before
            if temp is not None:
                shutil.rmtree(temp.parent, ignore_errors=True)
            return [e for e, _ in built]  # the handles go with `built`: never served
        add = [handle for _, handle in built]
        registered = {
            _version(e): _Version(e.error is None, temp if e.error is None else None) for e, _ in built
        }
        remove = [(name, v) for v in previous if v not in registered]
        states: dict[int | None, tuple[str, str]] = {}
        for v in remove:
            states[v[1]] = ("UNLOADING", "")
        self._set_states(name, states, keep=True)
        with self._lock:
            leaving = list(self._loaded.get(name, []))
        self._retire(add, remove, leaving)
        states = {v: ("UNAVAILABLE", "unloaded") for _, v in remove}
        for entry, _ in built:
            if entry.error is None:
                states[_version(entry)] = ("READY", "")
            else:
                states[entry.version] = ("UNAVAILABLE", entry.error)
        with self._lock:
            self._registered[name] = registered
            self._states[name] = states
            self._loaded[name] = [e for e, _ in built]
        self._drop_unused_temps([*previous.values(), _Version(False, temp)])
        return [e for e, _ in built]

    def _steps_left_out(self, entry: LoadedModel) -> bool:
        """Whether `entry` is an ensemble with a step model that the repository has and that
        was left out (a TorchScript example without torch): left out with it."""
        if not isinstance(entry.model, ensemble.EnsembleModel) or not self._repos:
            return False
        with self._lock:
            loaded = {n for n, entries in self._loaded.items() if entries}
        return any(s.model_name not in loaded and self._model_dirs(s.model_name) for s in entry.model.steps)

    def _ensemble_steps(self, name: str) -> list[str] | None:
        model_dir = self._model_dir(name)
        return ensemble.steps_in(model_dir) if model_dir is not None else None

    def _served(self, name: str, version: int) -> tuple[Any, str | None]:
        """For an ensemble's step: the loaded model of `name` at `version` (-1: its highest
        ready version), or None and why not, worded as Triton's model manager words it."""
        with self._lock:
            entries = list(self._loaded.get(name, []))
            registered = dict(self._registered.get(name, {}))
        if not entries:  # another namespace's model of that name, when one alone has it
            holders = [peer for peer in self.peers() if peer.holds(name)]
            if len(holders) > 1:
                return None, f"which is in {len(holders)} model namespaces: ambiguous."
            if holders:
                return holders[0]._served(name, version)
        ready = [
            e for e in entries
            if e.error is None and e.model is not None and registered.get(_version(e), _Version(False, None)).ready
        ]
        if version >= 0:
            ready = [e for e in ready if e.version == version]
            if not ready and any(e.error is None for e in entries):
                return None, f"whose required version {version} is not loaded."
        if not ready:
            failed = next((e.error for e in entries if e.error is not None), None)
            why = "which has no loaded version."
            return None, why if failed is None else f"{why} Model '{name}' loading failed with error: {failed}"
        entry = max(ready, key=_version)
        if entry.sequence is not None:
            return None, "which is a sequence model: openinfer does not run sequence models as ensemble steps."
        return entry.model, None

    def _instances_loaded(self) -> dict[ModelKey, int]:
        """The model instances of the loaded versions, by model (for the instance budget)."""
        with self._lock:
            return {(self._namespace, n): sum(_instances(e) for e in es) for n, es in self._loaded.items()}

    def _check_instance_limit(self, name: str, counts: list[int], before: dict[int | None, tuple[str, str]]) -> None:
        """Reserves the instances of a requested load, `counts` by version, or refuses it (400)
        when they would take the model instances of the server (every loaded version's and
        every other load's under way, this model's current ones replaced by these) past
        max_instances, before any instance starts. The models the server loads on its own (at
        start-up, by polling) count, but are not refused: the repository is the operator's."""
        asked = sum(counts)
        others = self._budget.reserve((self._namespace, name), asked)
        if others is None:
            return
        what = f"instance_group count {asked}" + (f" (over {len(counts)} versions)" if len(counts) > 1 else "")
        if asked <= self._max_instances:
            what += f" and the {others} instances of the models loaded or loading"
        with self._lock:
            self._states[name] = before
        raise InferenceServerError(
            400,
            f"failed to load '{name}': {what} exceed{'s' if asked > self._max_instances else ''} the server's "
            f"limit of {self._max_instances} instances (--max-instances)",
        )

    def _build(self, entry: LoadedModel, versions: list[str], stop: Any = None) -> Any:
        """One version as an unpublished core model (ModelVersion); its `error` says why it
        cannot serve. `stop` gives up starting its worker processes."""
        model = entry.model
        if isinstance(model, ensemble.EnsembleModel):
            reason = ensemble.check_steps(entry.name, model.steps, model.inputs, model.outputs, self._served)
            if reason is None:
                model = replace(model, decoupled=ensemble.is_decoupled(model.steps, self._served))
                entry = replace(entry, model=model)
                return self._core.add_model(
                    entry.name,
                    model.version,
                    inputs=_specs(model.inputs),
                    outputs=_specs(model.outputs),
                    max_batch_size=model.max_batch_size,
                    metadata_json=_model_metadata(entry.name, versions, model.platform, model.inputs, model.outputs),
                    handler=None,
                    ensemble=model.core(),
                    decoupled=model.decoupled,
                    **_model_config(entry),
                    openai_names=entry.openai_names,
                    publish=False,
                    namespace=self._namespace,
                )
            entry = LoadedModel(entry.name, entry.version, None, reason, entry.config)
            model = None
        if model is not None:
            if isinstance(model, TritonModel) and not getattr(model, "processes", False):
                model.attach(self)  # its pb_utils BLS and model control come here
            # A TorchScript module runs through the shim (torch=spec); a Python model is a handler.
            runs: dict[str, Any] = {"handler": getattr(model, "handler", None),
                                    "direct": getattr(model, "direct", None),
                                    "decoupled": getattr(model, "decoupled", False),
                                    "ready_probe": getattr(model, "ready_probe", False)}
            if getattr(model, "processes", False):
                runs["workers"] = (*processes.worker_spec(model), stop)
            if isinstance(model, TorchModel):
                runs = {"torch": model.spec}
            elif isinstance(model, OnnxModel):
                runs = {"onnx": model.spec}
            elif isinstance(model, IdentityModel):
                runs = {"identity": model.core_spec()}
            return self._core.add_model(
                entry.name,
                model.version,
                inputs=_specs(model.inputs),
                outputs=_specs(model.outputs, getattr(model, "outputs_as_produced", False)),
                max_batch_size=model.max_batch_size,
                metadata_json=_model_metadata(
                    entry.name, versions, model.platform, model.inputs, model.outputs
                ),
                instances=model.instances * getattr(model, "in_flight", 1),  # an async execute's executors
                dynamic_batching=_batching(model.max_batch_size, model.dynamic_batching, entry.sequence,
                                           getattr(model, "each_parameters", False)),
                sequence_batching=entry.sequence.core(model.instances) if entry.sequence else None,
                response_cache=_response_cache(entry),
                **runs,
                **_model_config(entry),
                labels=entry.labels,
                openai_names=entry.openai_names,
                publish=False,
                namespace=self._namespace,
            )
        platform = entry.config.get("platform") or entry.config.get("backend")
        return self._core.add_model(
            entry.name,
            _version(entry),
            inputs=(),
            outputs=(),
            max_batch_size=0,
            metadata_json=_model_metadata(
                entry.name, versions, platform if isinstance(platform, str) else "", (), ()
            ),
            handler=None,
            error=entry.error,
            publish=False,
            namespace=self._namespace,
        )

    def _retire(self, add: list[Any], remove: list[tuple[str, int]], leaving: list[LoadedModel]) -> None:
        """The core's swap, its wait for the requests of the versions that leave bounded by the
        unload timeout: past it their worker processes are killed and a version whose execute
        still runs in this process is abandoned to it (its executors cannot be stopped). The
        Triton Python models of `leaving` (removed or replaced) whose versions left in time are finalized at once
        (an engine such as vLLM's stops with its finalize), not when the garbage collector
        reaches them."""
        gone = [(name, version, self._namespace) for name, version in remove]
        abandoned = set()
        for name, version in self._core.swap_models(add, gone, self._unload_timeout):
            abandoned.add((name, version))
            logger.warning(
                "model %s version %s: a request still ran %gs after its unload began "
                "(--model-unload-timeout-secs): the version is unloaded, its worker processes were "
                "killed and its in-process instances abandoned", name, version, self._unload_timeout)
        for entry in leaving:  # each left: removed, or replaced by its version's reload
            if (entry.name, entry.version) not in abandoned and isinstance(entry.model, TritonModel):
                entry.model.close()
            forget_model(entry.model)  # an abandoned execute runs on with the module it holds

    def _unload(self, name: str) -> None:
        with self._lock:
            previous = dict(self._registered.get(name, {}))
        if not previous:
            return
        self._set_states(name, {v: ("UNLOADING", "") for v in previous}, keep=False)
        with self._lock:
            leaving = list(self._loaded.get(name, []))
        self._retire([], [(name, v) for v in previous], leaving)
        with self._lock:
            self._registered[name] = {}
            self._states[name] = {v: ("UNAVAILABLE", "unloaded") for v in previous}
            self._loaded.pop(name, None)
        self._fingerprints.pop(name, None)
        self._drop_unused_temps(previous.values())

    def _set_states(
        self, name: str, states: Mapping[int | None, tuple[str, str]], *, keep: bool
    ) -> None:
        with self._lock:
            current = dict(self._states.get(name, {})) if keep else {}
            current.update(states)
            self._states[name] = current

    # ---- files sent with a load ------------------------------------------------------------

    def _write_files(self, name: str, files: dict[str, bytes]) -> Path:
        """Writes a load's files into a new private directory; returns the model directory in
        it. Paths are relative to the model directory and must stay inside it."""
        if len(files) > MAX_LOAD_FILES:
            raise InferenceServerError(
                400, f"a load carries at most {MAX_LOAD_FILES} files, got {len(files)}"
            )
        total = sum(len(data) for data in files.values())
        if total > MAX_LOAD_FILE_BYTES:
            raise InferenceServerError(
                400,
                f"the files of a load may hold at most {MAX_LOAD_FILE_BYTES} bytes together, "
                f"got {total}",
            )
        parts = {path: _file_parts(name, path, self._load_code) for path in files}
        with self._lock:
            if self._temp_root is None:
                self._temp_root = Path(tempfile.mkdtemp(prefix="openinfer-repository-"))
        load_dir = Path(tempfile.mkdtemp(prefix="load-", dir=self._temp_root))  # mode 0700
        model_dir = load_dir / "model"
        try:
            model_dir.mkdir(mode=0o700)
            for path, data in files.items():
                try:
                    _write_private(model_dir, parts[path], data, path)
                except OSError as e:  # the disk is full, say: the message keeps the directory to itself
                    raise InferenceServerError(
                        500, f"cannot write file parameter 'file:{paths.printable(path)}': {e.strerror or e}"
                    ) from None
        except BaseException:
            shutil.rmtree(load_dir, ignore_errors=True)
            raise
        return model_dir

    def _drop_unused_temps(self, versions: Iterable[_Version]) -> None:
        with self._lock:
            in_use = {v.temp for vs in self._registered.values() for v in vs.values()}
        for temp in {v.temp for v in versions} - in_use:
            if temp is not None:
                shutil.rmtree(temp.parent, ignore_errors=True)

    # ---- polling ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._closed.wait(self._poll_secs):
            try:
                self.poll()
            except Exception:  # a bad poll must not end polling
                logger.exception("polling the model repository failed")

    def poll(self) -> None:
        """Scans the repository once: loads new models, reloads changed ones, unloads removed
        ones. The poll thread calls it every repository_poll_secs."""
        if self._closed.is_set():
            return
        unreadable = [repo for repo in self._repos if not repo.is_dir()]
        if not self._repos or unreadable:  # keep serving; say why
            logger.warning("model repository %s cannot be read; not polled",
                           ", ".join(map(str, unreadable or self._repos)))
            return
        present = set(self._repository_names())
        for name in sorted(present):
            if self._closed.is_set():
                return
            fingerprint = tuple(_fingerprint(d) for d in self._model_dirs(name))
            if self._fingerprints.get(name) == fingerprint and name in self._registered:
                continue
            logger.info("model %s changed in the repository: loading", name)
            try:
                with self._ops.hold(name):
                    self._load(name, None, None, startup=False)
            except InferenceServerError as e:
                logger.warning("%s", e.message)
        with self._lock:
            registered = {name: bool(versions) for name, versions in self._registered.items()}
        for name in sorted(set(registered) - present - set(self._given)):
            if registered[name]:
                logger.info("model %s left the repository: unloading", name)
                with self._ops.hold(name):
                    self._unload(name)
            with self._lock:  # no longer in the repository: no longer in the index
                self._states.pop(name, None)
                self._registered.pop(name, None)


# ---- request parameters ---------------------------------------------------------------------


def not_there(name: str, repos: Sequence[Path]) -> InferenceServerError:
    """The 404 of a load of a model that no repository of `repos` has."""
    where = f" in {', '.join(map(str, repos))}" if repos else ""
    return InferenceServerError(
        404, f"failed to load '{name}', failed to poll from model repository: no model directory '{name}'{where}"
    )


def _warm_up(entry: LoadedModel, handle: Any, model_dir: Path | None) -> str | None:
    """Runs the version's model_warmup samples (see `openinfer._repository.warmup`) before it is served;
    returns why it failed, or None."""
    assert entry.model is not None
    try:
        config = triton_config.normalize(entry.config, "config.pbtxt")
        built = warmup.samples(config, entry.model.max_batch_size, model_dir)
        warmup.run(handle, built)
    except (warmup.WarmupError, ConfigError) as e:
        logger.warning("model %s version %s: warm-up failed: %s", entry.name, entry.version, e)
        return f"model warm-up failed: {e}"
    return None


def _instances(entry: LoadedModel) -> int:
    """The model instances (executor threads, worker processes, sessions) a version starts."""
    if entry.error is not None or entry.model is None or isinstance(entry.model, ensemble.EnsembleModel):
        return 0  # an ensemble runs its steps' instances
    return int(getattr(entry.model, "instances", 0))


def _check_override(name: str, override: ModelConfig, max_instances: int) -> None:
    """Refuses a config override that names a file outside the model's directory (see
    openinfer._config.paths) or asks for more than the server allows (openinfer._config.limits,
    --max-instances) before the load goes near the file system or allocates anything. A config
    that cannot be normalized is left to the load, which reports it as it does for config.pbtxt."""
    try:
        normalized = triton_config.normalize(override.raw, "the config override")
    except ConfigError:
        return
    asked = limits.instances(normalized)
    if asked > max_instances:
        raise InferenceServerError(400, f"failed to load '{name}': instance_group count {asked} exceeds the "
                                        f"server's limit of {max_instances} instances (--max-instances)")
    try:
        paths.check_config(normalized)
        limits.check(normalized, "config override")
    except paths.PathError as e:
        raise InferenceServerError(400, f"failed to load '{name}': Invalid config override: {e}") from None
    except ConfigError as e:
        raise InferenceServerError(400, f"failed to load '{name}': Invalid {e}") from None


def _hide(text: str | None, model_dir: Path | None) -> str | None:
    """`text` with the directory where a load's files were written (`model_dir`, the server's
    temporary directory) gone: paths in it read relative to the model ('1/model.onnx')."""
    if text is None or model_dir is None:
        return text
    for where in {str(model_dir), os.path.realpath(model_dir)}:
        text = text.replace(where + os.sep, "").replace(where, "the model directory")
    return text


def _check_name(name: str) -> None:
    """Triton's model name check, before a load goes near the file system."""
    if not name.strip():
        raise InferenceServerError(
            400, "Model name cannot be empty. Please enter a valid name to deploy."
        )
    if name.strip() == ".." or "/" in name or "\0" in name:
        raise InferenceServerError(
            400,
            f"invalid model name '{name}', model name must not contain path traversal characters",
        )


def _body_object(body: bytes, what: str, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, Any]:
    try:
        check_json_depth(body, max_depth, "it")
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:  # ConfigError included
        raise InferenceServerError(
            400, f"failed to parse the {what} request JSON buffer: {e}"
        ) from None
    if not isinstance(value, dict):
        raise InferenceServerError(
            400, f"the {what} request must be a JSON object, got {type(value).__name__}"
        )
    return value


def _body_flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise InferenceServerError(
            400, f"Invalid value for '{key}': expected a boolean, got {json.dumps(value)}"
        )
    return value


def _body_parameters(body: bytes | None, what: str, max_depth: int) -> dict[str, Any]:
    if body is None:
        return {}
    params = _body_object(body, what, max_depth).get("parameters", {})
    if not isinstance(params, dict):
        raise InferenceServerError(
            400, f"'parameters' of a {what} request must be a JSON object, got {json.dumps(params)}"
        )
    return params


def _load_params(
    body: bytes | None, params: dict[str, Any] | None, max_depth: int
) -> tuple[str | None, dict[str, bytes]]:
    """A load's "config" and files from an HTTP body (strings; files in base64) or gRPC
    parameters (config a string_param, files bytes_param)."""
    grpc = params is not None
    given = params if params is not None else _body_parameters(body, "load model", max_depth)
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in given.items():
        if key == "config":
            if not isinstance(value, str):
                raise InferenceServerError(
                    400,
                    "invalid value type for load parameter 'config', expected string_param."
                    if grpc
                    else f"load parameter 'config' must be a JSON string, got {json.dumps(value)}",
                )
            config = value
        elif key.startswith("file:"):
            if grpc:
                if not isinstance(value, bytes):
                    raise InferenceServerError(
                        400, f"invalid value type for load parameter '{key}', expected bytes_param."
                    )
                files[key[5:]] = value
                continue
            if not isinstance(value, str):
                raise InferenceServerError(
                    400,
                    f"load parameter '{key}' must be a string of base64, got "
                    f"{type(value).__name__}",
                )
            try:
                files[key[5:]] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as e:
                raise InferenceServerError(
                    400, f"load parameter '{key}' is not valid base64: {e}"
                ) from None
        else:
            raise InferenceServerError(400, f"unrecognized load parameter '{key}'.")
    return config, files


def _unload_params(body: bytes | None, params: dict[str, Any] | None, max_depth: int) -> bool:
    given = params if params is not None else _body_parameters(body, "unload model", max_depth)
    value = given.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise InferenceServerError(
            400,
            "invalid value type for 'unload_dependents' parameter, expected bool_param."
            if params is not None
            else "Unable to parse 'unload_dependents': expected a boolean, got "
            f"{json.dumps(value)}",
        )
    return value


def _file_parts(model: str, path: str, load_code: bool) -> list[str]:
    """The components of a file parameter's path, which must name a file inside the model
    directory: no '.' or '..' components, no empty ones, each a valid file name. A leading '/'
    is the model directory, as tritonserver joins it (`file:/1/model.onnx` is `1/model.onnx`).
    A name too long for the file system fails as tritonserver's write of it does (500, "failed
    to poll from model repository", which Triton's model-control example expects)."""
    shown = paths.printable(path)
    path = path[1:] if path.startswith("/") else path
    parts = path.split("/")
    if (
        not path
        or "\0" in path
        or "\\" in path
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise InferenceServerError(
            400,
            f"Invalid file parameter 'file:{shown}': the path must stay within the model "
            "directory (no '.', '..' or empty components)",
        )
    try:
        too_long = any(len(p.encode("utf-8")) > _NAME_MAX for p in parts)
    except UnicodeEncodeError:
        raise InferenceServerError(400, f"Invalid file parameter 'file:{shown}': the name is not valid UTF-8") from None
    if too_long:
        raise InferenceServerError(
            500,
            f"failed to load '{model}', failed to poll from model repository: file parameter 'file:{shown}': "
            f"a name in the path is longer than {_NAME_MAX} bytes",
        )
    if parts[-1].endswith(".py") and not load_code:
        raise InferenceServerError(
            400,
            f"Invalid file parameter 'file:{shown}': Python files sent with a load run as the server's own "
            "code, so they are taken only where no one beyond this host can reach the repository API "
            "unchecked: restrict it (--http-restricted-api / --grpc-restricted-protocol "
            "model-repository:KEY=VALUE), ask clients for certificates (--http-use-ssl-mutual, "
            "--grpc-use-ssl-mutual), or listen on 127.0.0.1 or a Unix socket",
        )
    return parts


def _write_private(model_dir: Path, parts: list[str], data: bytes, path: str) -> None:
    """Creates directories (0700) and the file (0600) under model_dir, never following a
    symbolic link and never writing over an existing file."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(model_dir, flags)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(part, flags, dir_fd=fd)
            except OSError:
                raise InferenceServerError(
                    400, f"Invalid file parameter 'file:{path}': '{part}' is a file, not a directory"
                ) from None
            os.close(fd)
            fd = sub
        try:
            out = os.open(
                parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd
            )
        except FileExistsError:
            raise InferenceServerError(
                400, f"Invalid file parameter 'file:{path}': a directory or file of that name exists"
            ) from None
        with os.fdopen(out, "wb") as f:
            f.write(data)
    finally:
        os.close(fd)


class _LoadFailed(InferenceServerError):
    """A load that did not load every version (400, in Triton's words); `unpolled`: each failure
    is the model's config, which could not be read or checked (where Triton's poll of the model
    fails)."""

    def __init__(self, name: str, failures: list[LoadedModel]) -> None:
        reasons = "".join(
            f"version {e.version} is at UNAVAILABLE state: {e.error};"
            if e.version is not None
            else f"{e.error};"
            for e in failures
        )
        super().__init__(400, f"load failed for model '{name}': {reasons}")
        self.unpolled = all(not e.polled for e in failures)


# ---- change detection ---------------------------------------------------------------------


def _fingerprint(model_dir: Path) -> object:
    """What poll mode compares: every file of the model directory with its mtime and size
    (config.pbtxt included), so that a new, changed or removed file, or version directory,
    shows."""
    found: list[tuple[str, int, int]] = []
    try:
        for root, dirs, names in os.walk(model_dir):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for n in sorted(names):
                p = os.path.join(root, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                found.append((os.path.relpath(p, model_dir), st.st_mtime_ns, st.st_size))
            for d in dirs:
                found.append((os.path.relpath(os.path.join(root, d), model_dir) + "/", 0, 0))
    except OSError:
        pass
    return tuple(found)


# ---- what the core is told ----------------------------------------------------------------


def _given_entry(name: str, model: Model) -> LoadedModel:
    """A model given in Python, with its sequence_batching as a config.pbtxt's would carry it."""
    return LoadedModel(name, model.version, model, None, sequence=model.sequence_batching)


def _version(entry: LoadedModel) -> int:
    return FAILED_MODEL_VERSION if entry.version is None else entry.version


def _batching(
    max_batch_size: int, batching: DynamicBatching | None, sequence: SequenceBatching | None = None,
    each_parameters: bool = False,
) -> tuple[tuple[int, ...], int] | None:
    """add_model's dynamic_batching: (preferred sizes, max queue delay in µs, max queue size[, level
    policies or None, default priority level, preserve_ordering[, each_parameters]]), or None. With max_batch_size 0 nothing is batched but the queue
    policies and priorities still apply, as in Triton. A
    sequence model batches the ready requests of its sequences as its strategy says.
    `each_parameters`: the model sees each request's own parameters (a Triton Python model), so
    requests with different parameters share a batch, as in Triton."""
    if max_batch_size > 0 and sequence is not None:
        return sequence.batching()
    if batching is None:
        return None
    return (batching.preferred_batch_size, batching.max_queue_delay_microseconds, batching.max_queue_size,
            batching.level_policies(), batching.default_priority_level, batching.preserve_ordering,
            each_parameters)


def _model_config(entry: LoadedModel) -> dict[str, bytes]:
    """add_model's config_json and config_pb: the version's configuration as Triton reports
    it (config.pbtxt, or what was inferred without one, completed as Triton completes it)."""
    model = entry.model
    torch = isinstance(model, TorchModel)
    native = torch or isinstance(model, OnnxModel)
    gpus = sorted({int(d[5:]) for d in model.devices if d.startswith("cuda:")}) if native else []
    config = triton_config.normalize(entry.config) if entry.config else {}
    backend = "pytorch" if torch else "onnxruntime" if native else "python"
    if isinstance(model, ensemble.EnsembleModel):
        backend = ensemble.PLATFORM
    full = triton_config.complete(entry.name, config, model, backend=backend, gpus=tuple(gpus))
    rendered = json.dumps(triton_config.to_json(full), separators=(",", ":"), ensure_ascii=False)
    return {"config_json": rendered.encode(), "config_pb": triton_config.to_protobuf(full)}


def _response_cache(entry: LoadedModel) -> bool:
    """Whether the version asked for the response cache: config.pbtxt's response_cache, or the
    `Model`'s own flag for a model given in Python."""
    enabled = (entry.config or {}).get("response_cache", {}).get("enable")
    return bool(enabled) or bool(getattr(entry.model, "response_cache", False))


def _specs(
    tensors: Sequence[Tensor], as_produced: bool = False
) -> list[tuple[str, str, tuple[int, ...] | None, bool]]:
    """The core's declarations: (name, datatype, shape, flag), the flag an input's `optional` or
    whether an output is answered in the shape the model produced (`as_produced`)."""
    return [(t.name, t.datatype, t.shape, t.optional or as_produced) for t in tensors]


def _model_metadata(
    name: str,
    versions: list[str],
    platform: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
) -> bytes:
    """The body of GET /v2/models/{name}[/versions/{v}], as the V2 protocol defines it."""

    def tensors(ts: Sequence[Tensor]) -> list[dict[str, object]]:
        # V2 metadata cannot say "any rank"; [-1] is the nearest shape it can.
        return [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": [-1] if t.shape is None else list(t.shape),
            }
            for t in ts
        ]

    return json.dumps(
        {
            "name": name,
            "versions": versions,
            "platform": platform,
            "inputs": tensors(inputs),
            "outputs": tensors(outputs),
        },
        separators=(",", ":"),
    ).encode()

