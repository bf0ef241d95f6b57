"""Scanning a Triton-layout model repository: ``<repo>/<model>/config.pbtxt`` and numeric
version directories ``<repo>/<model>/<N>/`` holding the model file.

A scan never raises for a broken model: every model or version that cannot load becomes a
failed `LoadedModel` with its reason, so one bad model.py does not take the others down, and
the server can answer "not ready" with that reason.

Python models: ``<N>/model.py`` defines ``infer(inputs)``, optionally with ``parameters`` and
``request`` (an `openinfer.Request`) parameters. A generator ``infer`` (or one declared
``model_transaction_policy { decoupled: true }``) yields 0..N responses per request.
Their inputs and outputs come from config.pbtxt (whose dims exclude the batch dimension when
max_batch_size > 0, as in Triton) or, when config.pbtxt declares none, from model.py's
module-level ``INPUTS`` and ``OUTPUTS`` lists of `openinfer.Tensor` (full shapes) and optional
``MAX_BATCH_SIZE``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import _pt2_build
from .._backends import ensemble, processes, python_based, triton_model
from .._config import limits, openai_names, paths, sequence, triton_config
from ..config import ConfigError, ModelConfig, VersionPolicy, load_model_config
from .._backends.identity_model import IDENTITY_BACKEND, IdentityLoadError, IdentityModel, load_identity
from ..model import Model, Tensor
from .._backends.onnx_model import ONNX_BACKEND, ONNX_PLATFORM, OnnxLoadError, OnnxModel, OnnxUnavailable, load_onnx
from .._config.sequence import SequenceBatching
from .._backends.model_file import _LoadError, forget, import_model_file, owned_by
from .._backends.torch_aoti import load_package
from .._backends.torch_model import TorchLoadError, TorchModel, TorchUnavailable, load_torchscript

_VERSION_DIR = re.compile(r"[0-9]+")
_PYTHON_BACKENDS = {"python"}
_TORCH_BACKENDS = {"pytorch", "pytorch_libtorch", "torch_aoti"}
_ONNX_BACKENDS = {ONNX_BACKEND, ONNX_PLATFORM}
_NO_TORCH = "torch unavailable: "
_NO_ONNX = "onnxruntime unavailable: "
_NO_PT2 = "PT2 example not served: "
_PT2_PENDING = "PT2 example not built yet: "
_NO_MODULES = "modules unavailable: "
# Reasons the bundled examples leave a model out for (a PT2 example until its package is built).
_NOT_INSTALLED = (_NO_TORCH, _NO_ONNX, _NO_PT2, _PT2_PENDING, _NO_MODULES)
# A Python model's parameter naming the modules it imports beyond openinfer's own (comma-
# separated): without one of them it fails to load saying so, and a bundled example is left out.
REQUIRES_PARAMETER = "openinfer_requires"
logger = logging.getLogger("openinfer")


@dataclass(frozen=True)
class LoadedModel:
    """One model version found in a repository: `model` when it loaded, else `error`.

    `version` is None when the model failed before any version could be chosen (a bad
    config.pbtxt, no version directory). `config` is the parsed config.pbtxt ({} without one).
    """

    name: str
    version: int | None
    model: Model | TorchModel | OnnxModel | IdentityModel | ensemble.EnsembleModel | None
    error: str | None
    config: dict[str, Any] = field(default_factory=dict)
    sequence: SequenceBatching | None = None  # the config's sequence_batching, checked
    labels: dict[str, bytes] = field(default_factory=dict)  # output name -> its label file
    # OpenAI's API: (convention's name, the model's name) pairs, from the config's openai_ parameters.
    openai_names: tuple[tuple[str, str], ...] = ()
    # False: the config could not be read or checked (where Triton's poll of the model fails,
    # before its load: an ensemble's load answers that its step could not be polled).
    polled: bool = True


def examples_path() -> Path:
    """The embedded example repository: package data ``openinfer/examples/models`` in an
    installed wheel, or ``examples/models`` at the root of a source checkout."""
    here = Path(__file__).resolve().parents[1]  # the package's directory
    for candidate in (here / "examples" / "models", here.parents[1] / "examples" / "models"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"the example model repository is missing from this installation ({here})"
    )


def scan(
    repo: str | os.PathLike[str], *, optional_torch: bool = False, backend_directories: Sequence[Path] = (),
) -> list[LoadedModel]:
    """Loads every model of the repository at `repo`, in name then version order. Raises only
    when `repo` itself is not a directory. With `optional_torch`, TorchScript models are left
    out (rather than failed) where torch is not installed: the bundled examples serve
    everywhere. `backend_directories` are searched for Python-based backends before the one
    openinfer ships (python_based)."""
    root = Path(repo)
    if not root.is_dir():
        raise NotADirectoryError(f"model repository {os.fspath(repo)!r} is not a directory")
    loaded: list[LoadedModel] = []
    for model_dir in sorted(root.iterdir()):
        if model_dir.name.startswith(".") or model_dir.name == "__pycache__":
            continue
        if model_dir.is_dir():
            try:
                found = scan_model(model_dir, backend_directories=backend_directories)
                if optional_torch:
                    found = [m for m in found if m.error is None or not m.error.startswith(_NOT_INSTALLED)]
                loaded.extend(found)
            except OSError as e:  # an unreadable directory fails its model only
                loaded.append(LoadedModel(model_dir.name, None, None, f"{model_dir}: {e}"))
    return loaded


def scan_model(
    model_dir: Path,
    *,
    name: str | None = None,
    config: ModelConfig | None = None,
    allow_code: bool = True,
    allow_python: bool | None = None,
    loading: Callable[[list[int], int], None] | None = None,
    backend_directories: Sequence[Path] = (),
) -> list[LoadedModel]:
    """Loads the versions of one model directory that its version policy selects, as `scan`
    does, under `name` (default: the directory's name). `config` replaces the directory's
    config.pbtxt (a load request's override). Without `allow_code`, a version whose model file
    is code (a model.py, or a PT2 package, whose shared library runs when loaded) fails instead:
    files that came over the network are never executed as the server's own code.
    `allow_python` (default: `allow_code`) decides for a model.py alone: a load's model.py runs
    where no one beyond this host can reach the repository API (see ModelControl).
    `loading` hears the versions about to load and the instances each starts (the config's
    count; none for an ensemble), before the slow part starts. What the config
    asks for is bounded (`openinfer._config.limits`) before anything is built. A config whose
    backend is none of openinfer's runs a Python-based backend of `backend_directories` (then
    the bundled one: python_based)."""
    name = name or model_dir.name
    config_path = model_dir / "config.pbtxt"
    overridden = config is not None
    try:
        if config is None:
            try:
                config = load_model_config(model_dir)
            except FileNotFoundError:
                pass
        if config is not None and config.name not in (None, name):
            if overridden:
                raise ConfigError(
                    f"the config override: name {config.name!r} differs from the model's name "
                    f"{name!r}"
                )
            raise ConfigError(
                f"{config_path}: name {config.name!r} differs from the directory name {name!r}"
            )
        seq = None
        steps = None
        names: tuple[tuple[str, str], ...] = ()
        if config is not None:
            source = "the config override" if overridden else str(config_path)
            normalized = triton_config.normalize(config.raw, source)
            try:
                paths.check_config(normalized)
            except paths.PathError as e:
                raise ConfigError(f"{source}: {e}") from None
            limits.check(normalized, source)
            refused, warnings = triton_config.unsupported(normalized, source)
            # An iterative sequence is one request that a Triton Python model reschedules to
            # itself until done: the adapter runs it again (triton_model), no sequence slot is
            # held. Whether model.py is one is known once it is imported (_load_python).
            iterative = bool(normalized.get("sequence_batching", {}).get("iterative_sequence")) and (
                normalized.get("backend", "python") == "python" and not normalized.get("platform")
            )
            if iterative:
                refused = [r for r in refused if "sequence_batching.iterative_sequence" not in r]
            for warning in warnings:
                logger.warning("model %s: %s", name, warning)
            if refused:
                raise ConfigError("; ".join(refused))
            seq = None if iterative else sequence.parse(
                normalized, source, model_dir, tuple(t.name for t in config.inputs)
            )
            if ensemble.is_ensemble(normalized):
                steps = ensemble.parse(normalized, source, name)
            names = openai_names.mapping(config, source)
        labels = read_labels(model_dir, config) if config is not None else {}
    except ConfigError as e:
        return [LoadedModel(name, None, None, str(e), polled=False)]
    raw = config.raw if config else {}

    def failed(version: int | None, reason: str) -> LoadedModel:
        return LoadedModel(name, version, None, reason, raw)

    versions = {
        int(p.name): p for p in model_dir.iterdir() if p.is_dir() and _VERSION_DIR.fullmatch(p.name)
    }
    if not versions:
        return [failed(None, f"{model_dir} has no numeric version directory (e.g. {name}/1/)")]
    policy = config.version_policy if config else VersionPolicy()
    loaded = [
        failed(
            v, f"version {v} is listed in version_policy but {model_dir / str(v)} does not exist"
        )
        for v in policy.versions
        if policy.kind == "specific" and v not in versions
    ]
    selected = policy.select(list(versions))
    if loading is not None:  # an ensemble starts no instance of its own
        loading(selected, 0 if steps is not None else limits.instances(normalized) if config is not None else 1)
    for version in selected:
        if steps is not None and config is not None:  # a graph of other models: no file to load
            loaded.append(LoadedModel(name, version, _ensemble(name, version, config, steps), None, raw,
                                      openai_names=names))
            continue
        try:
            model = _load_version(
                name, version, versions[version], config, allow_code, seq,
                allow_code if allow_python is None else allow_python, backend_directories,
            )
        except _LoadError as e:
            loaded.append(failed(version, str(e)))
        except Exception as e:  # noqa: BLE001 - a fault in loading one model fails that model, not the server
            logger.exception("loading version %s of model '%s' failed unexpectedly", version, name)
            loaded.append(failed(version, f"failed to load: {type(e).__name__}: {e}"))
        else:
            loaded.append(LoadedModel(name, version, model, None, raw, _served_sequence(seq, model), labels, names))
    return sorted(loaded, key=lambda m: m.version or 0)


def _served_sequence(seq: SequenceBatching | None, model: Any) -> SequenceBatching | None:
    """The sequence batching a loaded version is served with: a Triton Python model's (or a
    Python-based backend's) states do not follow its outputs, as Triton's python_backend never
    updates a state (it calls no TRITONBACKEND_StateUpdate): each request gets the initial one."""
    if seq is None or not isinstance(model, triton_model.TritonModel):
        return seq
    return replace(seq, states_follow_outputs=False)


def _ensemble(name: str, version: int, config: ModelConfig, steps: tuple[ensemble.Step, ...]) -> ensemble.EnsembleModel:
    batch = [-1] if config.max_batch_size > 0 else []
    return ensemble.EnsembleModel(
        name,
        version,
        tuple(Tensor(t.name, t.datatype, [*batch, *t.dims], optional=t.optional) for t in config.inputs),
        tuple(Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs),
        config.max_batch_size,
        steps,
        int(config.raw.get("ensemble_scheduling", {}).get("max_inflight_requests", 0)),
    )


def read_labels(model_dir: Path, config: ModelConfig) -> dict[str, bytes]:
    """The label files of the outputs that name one (`label_filename`, a file of the model
    directory as in Triton), for the classification extension. A file that cannot be read, or
    lies outside the model directory, fails the model, naming the field."""
    labels = {}
    for i, tensor in enumerate(config.outputs):
        if not tensor.label_filename:
            continue
        what = f"output[{i}] {tensor.name!r}: label_filename"
        try:
            labels[tensor.name] = paths.read_beneath(model_dir, tensor.label_filename, what, model_dir)
        except paths.PathError as e:
            raise ConfigError(str(e)) from None
        except OSError as e:
            raise ConfigError(f"{what} '{paths.printable(tensor.label_filename)}': cannot read it: "
                              f"{e.strerror or e}") from None
    return labels


def _load_version(
    name: str, version: int, version_dir: Path, config: ModelConfig | None, allow_code: bool = True,
    sequence: SequenceBatching | None = None, allow_python: bool = True,
    backend_directories: Sequence[Path] = (),
) -> Model | TorchModel | OnnxModel | IdentityModel:
    """Dispatches on the backend the config names, else on the model file present."""
    backend = (config.backend or config.platform) if config else None
    if backend == IDENTITY_BACKEND:
        if sequence is not None and sequence.states:  # it has no output to carry a state in
            raise _LoadError("the identity backend takes no implicit state (sequence_batching.state)")
        try:
            return load_identity(name, version, version_dir, config)
        except IdentityLoadError as e:
            raise _LoadError(str(e)) from None
    if config and config.backend and backend not in _PYTHON_BACKENDS | _TORCH_BACKENDS | _ONNX_BACKENDS:
        if not allow_python:
            raise _LoadError(
                f"backend '{config.backend}': a model sent with the load request is not served by a Python-based "
                "backend (its files would configure code that runs as the server's own); put it in the model repository"
            )
        found = python_based.find(config.backend, python_based.search_path(backend_directories))
        return _load_backend(name, version, version_dir, found, config)
    if backend and backend not in _PYTHON_BACKENDS | _TORCH_BACKENDS | _ONNX_BACKENDS:
        raise _LoadError(
            f"backend {backend!r} is not supported (openinfer serves python, pytorch, onnxruntime "
            "and identity models)"
        )
    if config and config.default_model_filename:
        names, what = [config.default_model_filename], "default_model_filename"
    else:
        torch = backend in _TORCH_BACKENDS
        names = ["model.pt", "model.pt2", "model.py"] if torch else ["model.py", "model.pt", "model.pt2"]
        names = ["model.onnx"] if backend in _ONNX_BACKENDS else [*names, "model.onnx"]
        if config and config.platform == "torch_aoti":
            names = ["model.pt2"]
        what = "the model file"
    held = _open_model_file(version_dir, names, what)
    if held is None and what == "default_model_filename":
        raise _LoadError(f"{version_dir / names[0]} (default_model_filename) does not exist")
    if held is None and _pt2_build.has_recipe(version_dir) and _is_example(version_dir):
        held = _example_package(version_dir)
    if held is None:
        listed = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise _LoadError(f"{version_dir} holds no {listed}")
    path = held.path
    if path.suffix == ".py":
        if not allow_python:
            raise _LoadError(
                f"{path.name}: a Python model sent with the load request is not run (it would "
                "execute as the server's own code); put Python models in the model repository"
            )
        _check_requires(name, version_dir, config)
        return _load_python(name, version, path, _read(held), config)
    if _is_package(path, config) and not allow_code:
        raise _LoadError(
            f"{path.name}: a PT2 package sent with the load request is not loaded (its compiled library "
            "would run as the server's own code); put PT2 packages in the model repository"
        )
    if backend in _ONNX_BACKENDS or path.suffix == ".onnx":
        return _load_onnx(name, version, held, config, sequence)
    if path.suffix in (".pt", ".pth", ".pt2"):
        return _load_torchscript(name, version, held, config, sequence)
    raise _LoadError(f"{path.name}: unsupported model file (expected model.py, model.pt or model.pt2)")


def requirements_missing(config: ModelConfig | None) -> list[str]:
    """The modules of the config's `openinfer_requires` parameter that cannot be imported here."""
    wanted = (config.parameters.get(REQUIRES_PARAMETER, "") if config else "").split(",")
    return [m.strip() for m in wanted if m.strip() and importlib.util.find_spec(m.strip()) is None]


def _check_requires(name: str, version_dir: Path, config: ModelConfig | None) -> None:
    """Raises a _NO_MODULES load error naming the modules of the model's `openinfer_requires`
    parameter that cannot be imported here (logged once for a bundled example, which is then
    left out)."""
    missing = requirements_missing(config)
    if not missing:
        return
    why = f"{_NO_MODULES}model {name} imports {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed"
    if _is_example(version_dir):
        why += " (pip install 'openinfer[llm]' to serve it)"
        logger.warning("example %s is not served: %s", name, why[len(_NO_MODULES):])
    raise _LoadError(why)


def _open_model_file(version_dir: Path, names: list[str], what: str) -> paths.HeldFile | None:
    """The first of `names` that the version directory holds, opened (paths.open_beneath: a
    link out of the directory is refused) and held: backends read it through its descriptor.
    None when it holds none of them."""
    for file_name in names:
        try:
            fd = paths.open_beneath(version_dir, file_name, what, version_dir.parent)
        except FileNotFoundError:
            continue
        except paths.PathError as e:
            raise _LoadError(str(e)) from None
        except OSError as e:
            raise _LoadError(f"{version_dir / file_name}: cannot be read: {e.strerror or e}") from None
        return paths.HeldFile(fd, version_dir / file_name)
    return None


def _read(held: paths.HeldFile) -> bytes:
    """The whole of a held file (a model.py), read from its descriptor."""
    try:
        return os.pread(held.fd, os.fstat(held.fd).st_size, 0)
    except OSError as e:
        raise _LoadError(f"{held.path}: cannot be read: {e.strerror or e}") from None


def _is_example(version_dir: Path) -> bool:
    try:
        return version_dir.resolve().is_relative_to(examples_path().resolve())
    except FileNotFoundError:
        return False


def _example_package(version_dir: Path) -> Path:
    """A PT2 example of the bundled repository: its package, compiled on first use into the
    cache (see `openinfer._pt2_build`); left out until then, or where it cannot be."""
    try:
        return _pt2_build.package(version_dir)
    except _pt2_build.Skipped as e:
        raise _LoadError(f"{_NO_PT2}{e}") from None
    except _pt2_build.Pending as e:
        raise _LoadError(f"{_PT2_PENDING}{e}") from None


def _load_torchscript(
    name: str, version: int, model_file: paths.HeldFile, config: ModelConfig | None,
    sequence: SequenceBatching | None = None,
) -> TorchModel:
    path = model_file.path
    try:
        if _is_package(path, config):
            return load_package(name, version, model_file, config, sequence)
        return load_torchscript(name, version, model_file, config, sequence)
    except TorchUnavailable as e:
        raise _LoadError(f"{_NO_TORCH}{e}") from None
    except TorchLoadError as e:
        said = _named(model_file, e)
        raise _LoadError(f"{path}: {said}" if str(path) not in said else said) from None
    except (TypeError, ValueError) as e:
        raise _LoadError(f"{path}: {e}") from None


def _named(model_file: paths.HeldFile, error: Exception) -> str:
    """A backend's message with the file named by its path, not the descriptor it was read by."""
    return str(error).replace(model_file.source, str(model_file.path))


def _is_package(path: Path, config: ModelConfig | None) -> bool:
    """Whether the model file is loaded as a PT2 AOTInductor package (a shared library inside)."""
    return path.suffix == ".pt2" or (config is not None and config.platform == "torch_aoti")


def _load_onnx(
    name: str, version: int, model_file: paths.HeldFile, config: ModelConfig | None,
    sequence: SequenceBatching | None = None,
) -> OnnxModel:
    try:
        return load_onnx(name, version, model_file, config, sequence)
    except OnnxUnavailable as e:
        raise _LoadError(f"{_NO_ONNX}{e}") from None
    except OnnxLoadError as e:
        raise _LoadError(_named(model_file, e)) from None
    except (TypeError, ValueError) as e:
        raise _LoadError(f"{model_file.path}: {e}") from None


def _load_python(name: str, version: int, path: Path, source: bytes, config: ModelConfig | None) -> Model:
    module = import_model_file(name, version, path, source, triton_model.PROVIDED)
    return _owned(module, lambda: _python_model(name, version, path, module, source, config))


def _owned(module: ModuleType, make: Callable[[], Model]) -> Model:
    """The model `make` makes of `module`, which leaves sys.modules when the model is unloaded
    (model_file.forget_model), or at once when `make` fails."""
    try:
        model = make()
    except BaseException:
        forget(module.__name__)
        raise
    return owned_by(model, module)


def _python_model(
    name: str, version: int, path: Path, module: ModuleType, source: bytes, config: ModelConfig | None
) -> Model:
    if triton_model.defines_triton_model(module):
        return triton_model.load(name, version, path, source, module, config, _in_processes(config, triton=True))
    if config is not None and _decoupled(config) and "dynamic_batching" in config.raw:
        raise _LoadError(
            f"{path.parent.parent / 'config.pbtxt'}: model_transaction_policy {{ decoupled: true }} with "
            "dynamic_batching is served for Triton Python models only (an infer() model's batch has one answer "
            "per request); remove dynamic_batching to serve it"
        )
    if config is not None and config.raw.get("sequence_batching", {}).get("iterative_sequence"):
        raise _LoadError(
            f"{path.parent.parent / 'config.pbtxt'}: sequence_batching.iterative_sequence is not supported by "
            "openinfer (no iterative sequences); remove it to serve the model"
        )
    infer = getattr(module, "infer", None)
    if not callable(infer):
        raise _LoadError(f"{path} defines no infer(inputs) function")
    try:
        if config and (config.inputs or config.outputs):
            batch = [-1] if config.max_batch_size > 0 else []
            inputs = [Tensor(t.name, t.datatype, [*batch, *t.dims], optional=t.optional) for t in config.inputs]
            outputs = [Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in config.outputs]
            max_batch_size = config.max_batch_size
        elif hasattr(module, "INPUTS") or hasattr(module, "OUTPUTS"):
            inputs, outputs = getattr(module, "INPUTS", []), getattr(module, "OUTPUTS", [])
            # A config that names no tensors still sets the batch size (Triton's load override
            # {"max_batch_size": "16"} of a model that describes itself).
            given = config is not None and "max_batch_size" in config.raw
            max_batch_size = config.max_batch_size if given else getattr(module, "MAX_BATCH_SIZE", 0)
        else:
            raise _LoadError(
                f"{name}: no inputs or outputs declared: add input/output to config.pbtxt "
                f"or INPUTS/OUTPUTS lists of openinfer.Tensor to {path}"
            )
        model = Model(
            name,
            infer,
            inputs=inputs,
            outputs=outputs,
            max_batch_size=max_batch_size,
            version=version,
            instances=config.instances if config else 1,
            platform=(config.platform or config.backend or "python") if config else "python",
            dynamic_batching=config.dynamic_batching if config else None,
            decoupled=_decoupled(config),
            processes=False,  # unless config.pbtxt says so: then by file, below
        )
    except (TypeError, ValueError) as e:
        raise _LoadError(f"{path}: {e}") from None
    if _in_processes(config):
        processes.bind_file(model, processes.ModelFile(str(path), source, "infer", name, version))
    return model


def _load_backend(
    name: str, version: int, version_dir: Path, backend: python_based.Backend, config: ModelConfig,
) -> Model:
    """A model served by a Python-based backend: the backend's model.py, imported for this model
    (each model its own copy of the backend's modules, as each Triton model has its own stub)."""
    path = backend.model_file
    module = import_model_file(name, version, path, backend.source, triton_model.PROVIDED, backend=True)
    if not triton_model.defines_triton_model(module):
        forget(module.__name__)
        raise _LoadError(f"{path}: a Python-based backend's model.py must define class {triton_model.CLASS}")
    return _owned(module, lambda: triton_model.load(
        name, version, path, backend.source, module, config, _in_processes(config, triton=True), version_dir
    ))


def _in_processes(config: ModelConfig | None, triton: bool = False) -> bool:
    """Whether a repository Python model's instances are worker processes: more than one
    instance, none of kind KIND_MODEL (which keeps them threads of the server), and no
    sequence batching, except a Triton Python model's (`triton`) under the Direct strategy,
    which keeps each sequence on one instance and so one worker, as Triton keeps it on one stub
    process (see _backends/processes.py)."""
    if config is None or config.instances < 2:
        return False
    sb = config.raw.get("sequence_batching")
    if sb is not None and not (triton and "oldest" not in sb and not sb.get("iterative_sequence")):
        return False
    return all(g.kind != "KIND_MODEL" for g in config.instance_groups)


def _decoupled(config: ModelConfig | None) -> bool | None:
    """What config.pbtxt says of model_transaction_policy.decoupled; None when it says nothing
    (then a generator infer makes the model decoupled)."""
    policy = config.raw.get("model_transaction_policy") if config else None
    if not isinstance(policy, dict) or "decoupled" not in policy:
        return None
    return bool(policy["decoupled"])
