"""Python-based backends, as Triton defines them: a model whose config.pbtxt says
``backend: "echo"`` runs ``echo/model.py`` of a backend directory (--backend-directory), shared by
every model that names it, with the modules beside it (``echo/utils/``) importable,
`pb_utils.get_model_dir()` naming each model's own version folder and each model's
``parameters`` reaching its initialize; over HTTP and gRPC. The backend directory is code: one
writable by others, or holding a file another user owns, is refused, and so are a backend name
that is not a folder's name and a backend that no directory has (Triton's words)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import Cli, triton_grpc, triton_http

# The backend: model.py imports its sibling package utils/ (no __init__.py, as vLLM's), reads
# a file of the model's version folder and the model's PREFIX parameter in initialize, and
# answers each request with PREFIX + the greeting + the input, and the folder get_model_dir()
# names while execute runs.
ECHO_MODEL = textwrap.dedent(
    """
    import json, os
    import numpy as np
    import triton_python_backend_utils as pb_utils
    from utils.words import shout

    class TritonPythonModel:
        @classmethod
        def auto_complete_config(cls, config):
            config.add_input({"name": "IN", "data_type": "TYPE_STRING", "dims": [1]})
            config.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]})
            config.add_output({"name": "DIR", "data_type": "TYPE_STRING", "dims": [1]})
            config.set_max_batch_size(0)
            return config

        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.prefix = config["parameters"]["PREFIX"]["string_value"]
            with open(os.path.join(pb_utils.get_model_dir(), "greeting.txt")) as f:
                self.greeting = f.read().strip()
            self.repository = args["model_repository"]

        def execute(self, requests):
            responses = []
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0].decode()
                out = shout(f"{self.prefix}{self.greeting} {text}")
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([out.encode()], dtype=np.object_)),
                    pb_utils.Tensor("DIR", np.array([pb_utils.get_model_dir().encode()], dtype=np.object_)),
                ]))
            return responses
    """
)
WORDS = "def shout(text):\n    return text.upper() + '!'\n"
CONFIG = """
backend: "echo"
parameters {{ key: "PREFIX" value: {{ string_value: "{prefix}" }} }}
"""


def _backends(root: Path) -> Path:
    """A backend directory holding the echo backend (0755 folders, 0644 files: the server's own)."""
    backends = root / "backends"
    (backends / "echo" / "utils").mkdir(parents=True)
    (backends / "echo" / "model.py").write_text(ECHO_MODEL)
    (backends / "echo" / "utils" / "words.py").write_text(WORDS)
    for folder in (backends, backends / "echo", backends / "echo" / "utils"):
        folder.chmod(0o755)
    return backends


def _model(repo: Path, name: str, config: str, greeting: str = "hello") -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (version / "greeting.txt").write_text(greeting)
    (repo / name / "config.pbtxt").write_text(config)
    return version


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[openinfer.Server, Path]]:
    repo = tmp_path / "repo"
    _model(repo, "alpha", CONFIG.format(prefix="a:"), "hello")
    _model(repo, "beta", CONFIG.format(prefix="b:"), "bonjour")
    srv = openinfer.serve(repo, http_port=0, backend_directory=_backends(tmp_path), log=False)
    try:
        yield srv, repo
    finally:
        srv.stop()


def _http(srv: openinfer.Server, model: str, text: str) -> tuple[str, str]:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("IN", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    result = triton_http(srv).infer(model, [tensor])
    return result.as_numpy("OUT")[0].decode(), result.as_numpy("DIR")[0].decode()


def _grpc(srv: openinfer.Server, model: str, text: str) -> tuple[str, str]:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("IN", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    result = triton_grpc(srv).infer(model, [tensor])
    return result.as_numpy("OUT")[0].decode(), result.as_numpy("DIR")[0].decode()


def test_two_models_share_the_backend_each_with_its_own_folder_and_parameters(served) -> None:
    srv, repo = served
    for call in (_http, _grpc):
        assert call(srv, "alpha", "x") == ("A:HELLO X!", str(repo / "alpha" / "1"))
        assert call(srv, "beta", "y") == ("B:BONJOUR Y!", str(repo / "beta" / "1"))


def test_the_config_is_the_backends_completion_and_initialize_gets_the_models_folder(served) -> None:
    srv, repo = served
    config = triton_http(srv).get_model_config("alpha")
    assert config["backend"] == "echo"
    assert [t["name"] for t in config["input"]] == ["IN"]
    assert config["parameters"]["PREFIX"]["string_value"] == "a:"


def _reason(srv: openinfer.Server, model: str) -> str:
    index = {m["name"]: m for m in triton_http(srv).get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE", index[model]
    return index[model]["reason"]


def _refused(tmp_path: Path, config: str, backends: Path | None = None) -> str:
    repo = tmp_path / "repo"
    _model(repo, "m", config)
    srv = openinfer.serve(repo, http_port=0, backend_directory=backends or _backends(tmp_path), log=False,
                          strict_readiness=False)
    try:
        return _reason(srv, "m")
    finally:
        srv.stop()


def test_a_backend_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    backends = _backends(tmp_path)
    (backends / "echo").chmod(0o777)
    reason = _refused(tmp_path, CONFIG.format(prefix=""), backends)
    assert f"{backends / 'echo'} is writable by others" in reason, reason
    assert "backend 'echo' is not loaded" in reason


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_backend_module_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    backends = _backends(tmp_path)
    os.chown(backends / "echo" / "utils" / "words.py", 65534, 65534)
    reason = _refused(tmp_path, CONFIG.format(prefix=""), backends)
    assert f"{backends / 'echo' / 'utils' / 'words.py'} is owned by uid 65534" in reason, reason


def test_a_symbolic_link_in_the_backend_is_refused(tmp_path: Path) -> None:
    backends = _backends(tmp_path)
    (backends / "echo" / "utils" / "more.py").symlink_to(tmp_path / "elsewhere.py")
    reason = _refused(tmp_path, CONFIG.format(prefix=""), backends)
    assert "more.py is a symbolic link (not followed)" in reason, reason


@pytest.mark.parametrize("name", ["../echo", "echo/..", "..", ".hidden"])
def test_a_backend_name_that_is_not_a_folder_name_is_refused(tmp_path: Path, name: str) -> None:
    reason = _refused(tmp_path, f'backend: "{name}"\n')
    assert reason.startswith(f"backend '{name}' is not a backend name"), reason


def test_a_missing_backend_fails_with_tritons_words(tmp_path: Path) -> None:
    reason = _refused(tmp_path, 'backend: "nope"\n')
    assert reason.startswith(
        "unable to find backend library for backend 'nope', try specifying runtime on the model configuration."
    ), reason
    assert str(tmp_path / "backends" / "nope" / "model.py") in reason


def test_the_backend_directory_flag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _model(repo, "alpha", CONFIG.format(prefix="c:"), "hi")
    cli = Cli(str(repo), "--grpc-port", "0", "--metrics-port", "0", "--backend-directory", str(_backends(tmp_path)))
    try:
        import requests

        body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "BYTES", "data": ["z"]}]}
        got = requests.post(f"http://127.0.0.1:{cli.port}/v2/models/alpha/infer", json=body, timeout=30).json()
        assert {o["name"]: o["data"] for o in got["outputs"]}["OUT"] == ["C:HI Z!"], got
    finally:
        cli.kill()
