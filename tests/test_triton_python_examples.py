"""python_backend's auto_complete and pytorch examples, served unchanged from a repository laid out
as their READMEs say, each checked by its own client script; and auto_complete_config's checks
worded as Triton words them."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import numpy as np
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


# A gauge and a histogram with labels, as /metrics must show them after one request.
HISTOGRAM_MODEL = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def initialize(self, args):
            self.gauge = pb_utils.MetricFamily("pyb_queue_depth", "Depth\\\\of queue", pb_utils.MetricFamily.GAUGE).Metric(
                labels={"model": args["model_name"], "b": "x\\"y"})
            family = pb_utils.MetricFamily("pyb_sizes", "Request sizes", pb_utils.MetricFamily.HISTOGRAM)
            self.sizes = family.Metric(labels={"model": args["model_name"]}, buckets=[1, 4, 16])
            try:
                family.Metric(labels={})
            except ValueError as e:
                self.missing = str(e)

        def execute(self, requests):
            for request in requests:
                n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().size
                self.gauge.set(2.5)
                self.sizes.observe(n)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.missing.encode()], np.object_))])
                    for _ in requests]
    """
)
HISTOGRAM_CONFIG = """
name: "histogram"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    pytest.importorskip("torch")
    repo = tmp_path_factory.mktemp("triton_examples")
    example(repo, "nobatch_auto_complete", "auto_complete/nobatch_model.py", None)
    example(repo, "batch_auto_complete", "auto_complete/batch_model.py", None)
    example(repo, "pytorch", "pytorch/model.py", "pytorch/config.pbtxt")
    add_model(repo, "conflict", CONFLICT_MODEL)
    add_model(repo, "wrong_return", WRONG_RETURN_MODEL)
    example(repo, "custom_metrics", "custom_metrics/model.py", "custom_metrics/config.pbtxt")
    add_model(repo, "histogram", HISTOGRAM_MODEL, HISTOGRAM_CONFIG)
    server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
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


def test_custom_metrics_example_and_its_client_unchanged(srv: openinfer.Server) -> None:
    out = run_client(srv, EXAMPLES / "custom_metrics" / "client.py")
    assert "PASS: custom_metrics" in out, out


def test_gauge_and_histogram_on_metrics(srv: openinfer.Server) -> None:
    import requests
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(np.zeros(4, np.float32))
    result = triton_http(srv).infer("histogram", [tensor])
    assert result.as_numpy("OUT")[0] == b"Missing required buckets for histogram metrics."
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30).text
    assert "# HELP pyb_queue_depth Depth\\\\of queue\n# TYPE pyb_queue_depth gauge\n" in text
    assert 'pyb_queue_depth{b="x\\"y",model="histogram"} 2.5\n' in text
    assert "# TYPE pyb_sizes histogram\n" in text
    for line in ['pyb_sizes_bucket{model="histogram",le="1"} 0', 'pyb_sizes_bucket{model="histogram",le="4"} 1',
                 'pyb_sizes_bucket{model="histogram",le="+Inf"} 1', 'pyb_sizes_sum{model="histogram"} 4',
                 'pyb_sizes_count{model="histogram"} 1']:  # fmt: skip
        assert line + "\n" in text, (line, text)
    assert text.index("nv_inference_request_success") < text.index("pyb_queue_depth")
