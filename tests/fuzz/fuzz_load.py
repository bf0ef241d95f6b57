"""Fuzz target for the load API's config overrides and `file:` names (python/openinfer/control.py
and paths.py) under atheris. The input is the body of ``POST /v2/repository/models/m/load`` as
a client sends it: ``{"parameters": {"config": "<JSON>", "file:<path>": "<base64>"}}``. It goes
through what a load does before it builds a model: the parameters are read, the config override
is parsed and its paths checked, the files are written into a private directory, and every
path the override names is opened inside the directory it belongs to. The contract:

- a request is refused with a 4xx InferenceServerError (or a ConfigError / PathError naming the
  field), never another exception (a RecursionError from deep nesting, a TypeError from a
  value of an unexpected kind, ...);
- every file written lies inside the model directory, none is a Python file (a folder may end
  in .py), none is a link;
- every file `paths.open_beneath` opens lies inside the directory it was opened in, also in a
  model directory holding symbolic links that lead out.

    .venv/bin/python tests/fuzz/fuzz_load.py -max_total_time=60 WORKDIR tests/fuzz/corpus/fuzz_load
    .venv/bin/python tests/fuzz/fuzz_load.py --replay tests/fuzz/corpus/fuzz_load   (no atheris needed)

`make fuzz` runs the first form (with PYTHONPATH=python).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from atheris_functions import run

_state: dict[str, Any] = {}


def _setup() -> dict[str, Any]:
    """One ModelControl (no core: nothing is built) and a model directory template whose
    links lead out of it, made once per process."""
    if not _state:
        from openinfer._control.control import ModelControl

        root = Path(tempfile.mkdtemp(prefix="fuzz-load-"))
        template = root / "template"
        for sub in ("1", "warmup", "initial_state"):
            (template / sub).mkdir(parents=True)
            (template / sub / "out").symlink_to("/")
            (template / sub / "up").symlink_to("..")
            (template / sub / "file").write_bytes(b"x")
        (template / "1" / "model.py").write_text("")
        control = ModelControl(None, None, [], mode="explicit")
        _state.update(template=template, control=control)
        atexit.register(lambda: (control.close(0), shutil.rmtree(root, ignore_errors=True)))
    return _state


def _check_opened(config: dict[str, Any], model_dir: Path) -> None:
    from openinfer._config import paths

    for what, name, folder, nested in paths.configured(config):
        base = model_dir / ("1" if folder == "<version>" else folder)
        try:
            fd = paths.open_beneath(base, name, what, model_dir, nested)
        except (paths.PathError, OSError):
            continue
        try:
            got = os.readlink(paths.fd_path(fd))
        finally:
            os.close(fd)
        root = os.path.realpath(base)
        if os.path.commonpath([root, got]) != root or got == root:
            raise AssertionError(f"{what} {name!r} opened {got}, outside {root}")


def test_one_input(data: bytes) -> None:
    from openinfer._config import paths, triton_config
    from openinfer.config import DEFAULT_MAX_JSON_DEPTH, ConfigError, parse_json_config
    from openinfer._control.control import _check_override, _load_params
    from openinfer.errors import InferenceServerError

    state = _setup()
    model_dir: Path | None = None
    try:
        config, given = _load_params(data, None, DEFAULT_MAX_JSON_DEPTH)
        override = parse_json_config(config) if config is not None else None
        if override is not None:
            _check_override("m", override, state["control"]._max_instances)
        if given:
            model_dir = state["control"]._write_files("m", given)
            for dirpath, dirnames, filenames in os.walk(model_dir):
                for n in dirnames + filenames:
                    p = Path(dirpath, n)
                    if p.is_symlink() or not p.resolve().is_relative_to(model_dir.resolve()):
                        raise AssertionError(f"{p} is a link or lies outside {model_dir}")
                    if p.suffix == ".py" and p.is_file():
                        raise AssertionError(f"a Python file was written: {p}")
        if override is not None:
            normalized = triton_config.normalize(override.raw, "the config override")
            _check_opened(normalized, model_dir or state["template"])
    except InferenceServerError as e:
        # A file name too long for the file system is tritonserver's 500 (its write of it fails
        # to "poll from model repository"), which Triton's model-control example expects.
        if not 400 <= e.status < 500 and not (e.status == 500 and "failed to poll from model repository" in e.message):
            raise AssertionError(f"a load request answered {e.status}: {e.message}") from None
    except (ConfigError, paths.PathError):
        pass
    finally:
        if model_dir is not None:
            shutil.rmtree(model_dir.parent, ignore_errors=True)


def _outcome(data: bytes) -> str:
    """What one input gives, as text to compare runs with."""
    try:
        test_one_input(data)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return f"{type(e).__name__}: {e}"


def _modules() -> list[Any]:
    import openinfer._config.paths
    import openinfer._control.control
    import openinfer.config

    return [openinfer._config.paths, openinfer._control.control, openinfer.config]


if __name__ == "__main__":
    run(test_one_input, _outcome, _modules, "fuzz_load")
