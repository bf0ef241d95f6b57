"""No Python process of the server imports from the working directory: started from a folder
that holds an `openinfer/__init__.py` and a `numpy.py` of someone else's, the `--workers`
supervisor, its server processes and their model worker processes never run them, and serving
works."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import requests

from conftest import Cli

MODEL = """\
import numpy as np

def infer(inputs):
    return {"Y": inputs["X"] * np.int32(2)}
"""
CONFIG = """\
backend: "python"
input [{name: "X" data_type: TYPE_INT32 dims: [1]}]
output [{name: "Y" data_type: TYPE_INT32 dims: [1]}]
instance_group [{count: 2 kind: KIND_CPU}]
"""


@pytest.mark.parametrize("how", ["script", "python -m"])
def test_planted_modules_in_the_working_directory_never_run(tmp_path: Path, how: str) -> None:
    """`script`: the `openinfer` console script, from a folder holding both plants.
    `python -m`: ``python -m openinfer`` itself imports openinfer from the working directory
    (that is Python's doing, before any of ours runs: docs/security.md says to use the script
    or ``python -P``), so there the folder holds numpy.py alone, which none of ours imports."""
    (tmp_path / "repo" / "double" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "double" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "repo" / "double" / "1" / "model.py").write_text(MODEL)
    marker = tmp_path / "planted-code-ran"
    plant = f"import pathlib\nwith pathlib.Path({str(marker)!r}).open('a') as f:\n    f.write(__name__ + '\\n')\n"
    shared = tmp_path / "shared"
    (shared / "openinfer").mkdir(parents=True)
    (shared / "numpy.py").write_text(plant)
    if how == "script":
        (shared / "openinfer" / "__init__.py").write_text(plant)
        script = Path(sys.executable).parent / "openinfer"
        if not script.is_file():
            pytest.skip("no openinfer console script next to this Python")
        argv = [str(script)]
    else:
        argv = [sys.executable, "-m", "openinfer"]
    cli = Cli(argv=[*argv, "serve", str(tmp_path / "repo"), "--http-port", "0", "--workers", "2"], cwd=shared)
    try:
        for _ in range(8):  # new connections: both server processes answer in turn
            r = requests.post(f"http://127.0.0.1:{cli.port}/v2/models/double/infer", timeout=60, json={
                "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [21]}]})
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [42]
    finally:
        cli.kill()
    assert not marker.exists(), f"planted code ran: {marker.read_text()}\n{cli.output()}"


@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "python3.10"])
def test_the_command_lines_leave_the_working_directory_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, safe_path_flag: bool
) -> None:
    """The command lines `_spawn` makes, as on Python 3.11+ (-P) and as on 3.10 (a first
    statement that takes the working directory off sys.path): a numpy.py there is not imported,
    the module or code runs with its arguments, and PYTHONPATH loses its relative entries."""
    import subprocess

    from openinfer import _spawn

    monkeypatch.setattr(_spawn, "_SAFE_PATH_FLAG", safe_path_flag)
    (tmp_path / "numpy.py").write_text("raise SystemExit('the planted numpy.py ran')\n")
    env = _spawn.environment(env={"PYTHONPATH": os.pathsep.join(["", ".", *sys.path[1:]])})
    assert "" not in env["PYTHONPATH"].split(os.pathsep) and "." not in env["PYTHONPATH"].split(os.pathsep)
    code = _spawn.python_code("import numpy; print(numpy.__file__, sys.argv[1:])", "a", "b")
    out = subprocess.run(code, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path) not in out.stdout and out.stdout.strip().endswith("['a', 'b']"), out.stdout
    module = _spawn.python_module("json.tool", "--sort-keys")
    out = subprocess.run(module, cwd=tmp_path, env=env, input='{"b": 1, "a": 2}', capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.index('"a"') < out.stdout.index('"b"'), out
