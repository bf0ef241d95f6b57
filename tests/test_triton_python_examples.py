"""python_backend's auto_complete and pytorch examples, served unchanged from a repository laid out
as their READMEs say, each checked by its own client script; and auto_complete_config's checks
worded as Triton words them."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import openinfer

from conftest import triton_http
from test_triton_python_backend import EXAMPLES, PROLOGUE, add_model, example, run_client

# auto_complete_config that adds an input twice with different datatypes: Triton's conflict error.
CONFLICT_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
            config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
            return config

        def execute(self, requests):
            return []
    """
)
WRONG_RETURN_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            return config.as_dict()

        def execute(self, requests):
            return []
    """
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    pytest.importorskip("torch")
    repo = tmp_path_factory.mktemp("triton_examples")
    example(repo, "nobatch_auto_complete", "auto_complete/nobatch_model.py", None)
    example(repo, "batch_auto_complete", "auto_complete/batch_model.py", None)
    example(repo, "pytorch", "pytorch/model.py", "pytorch/config.pbtxt")
    add_model(repo, "conflict", CONFLICT_MODEL)
    add_model(repo, "wrong_return", WRONG_RETURN_MODEL)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def test_auto_complete_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    out = run_client(srv, EXAMPLES / "auto_complete" / "client.py")
    assert "PASS: auto_complete" in out, out


def test_pytorch_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    out = run_client(srv, EXAMPLES / "pytorch" / "client.py")
    assert "PASS: pytorch" in out, out


def test_auto_complete_errors_as_triton_words_them(srv: openinfer.Server) -> None:
    index = {m["name"]: m for m in triton_http(srv).get_model_repository_index()}
    assert index["conflict"]["state"] == "UNAVAILABLE"
    assert index["conflict"]["reason"].startswith(
        "ValueError: unable to load model 'conflict', configuration expects datatype TYPE_FP32 for input 'IN', "
        "model provides TYPE_INT32"
    )
    assert index["wrong_return"]["reason"] == (
        "auto_complete_config function in model 'wrong_return' must return a valid pb.ModelConfig object."
    )
