"""Triton's async execute: an ``async def execute`` instance runs several batches at once (shown by
a gate that opens only once three are inside execute together), and ``async_exec`` with several
BLS requests in flight (shown by a barrier three instances of the target must reach together)."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http
from test_triton_python_backend import PROLOGUE, add_model

# Each execute waits until three are inside at once (the gate), then answers how many were.
GATED = PROLOGUE + textwrap.dedent(
    """
    import asyncio

    class TritonPythonModel:
        def initialize(self, args):
            self.inside = 0
            self.most = 0
            self.opened = None

        async def execute(self, requests):
            if self.opened is None:
                self.opened = asyncio.Event()
            self.inside += 1
            self.most = max(self.most, self.inside)
            if self.inside >= 3:
                self.opened.set()
            try:
                await asyncio.wait_for(self.opened.wait(), 60)
            finally:
                self.inside -= 1
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([float(self.most)], np.float32))])
                    for _ in requests]
    """
)
GATED_CONFIG = """
name: "gated"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
"""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_async_execute_runs_several_batches_on_one_instance(tmp_path: Path, protocol: str) -> None:
    add_model(tmp_path, "gated", GATED, GATED_CONFIG)
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=2, log=False)
    results: list[float] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            if protocol == "http":  # requests: tritonclient.http's gevent pool is bound to one thread
                import requests

                body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
                r = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/gated/infer", json=body, timeout=120)
                results.append(float(r.json()["outputs"][0]["data"][0]))
                return
            import tritonclient.grpc as client

            c = client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            try:
                t = client.InferInput("IN", [1], "FP32")
                t.set_data_from_numpy(np.zeros(1, np.float32))
                results.append(float(c.infer("gated", [t]).as_numpy("OUT")[0]))
            finally:
                c.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert results == [3.0, 3.0, 3.0]  # the gate opened: three executes were in at once
        assert len(triton_http(server).get_model_config("gated")["instance_group"]) == 1
        assert triton_http(server).get_model_config("gated")["instance_group"][0]["count"] == 1
    finally:
        server.stop()


# Three instances that each wait until all three are inside execute at once (a barrier).
BARRIER = PROLOGUE + textwrap.dedent(
    """
    import sys, types
    g = sys.modules.setdefault("bls_test_barrier", types.SimpleNamespace(barrier=threading.Barrier(3)))

    class TritonPythonModel:
        def execute(self, requests):
            g.barrier.wait(60)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.0], np.float32))])
                    for _ in requests]
    """
)
BARRIER_CONFIG = """
name: "barrier"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
instance_group [{ count: 3, kind: KIND_MODEL }]
"""
# async_exec three BLS requests at once, then sums their answers.
FAN_OUT = PROLOGUE + textwrap.dedent(
    """
    import asyncio

    class TritonPythonModel:
        async def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN")
            calls = [pb_utils.InferenceRequest(model_name="barrier", inputs=[x], requested_output_names=["OUT"])
                     .async_exec() for _ in range(3)]
            answers = await asyncio.gather(*calls)
            errors = [a.error().message() for a in answers if a.has_error()]
            if errors:
                raise pb_utils.TritonModelException(errors[0])
            total = sum(float(a.output_tensors()[0].as_numpy()[0]) for a in answers)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.float32))])]
    """
)
FAN_OUT_CONFIG = """
name: "fan_out"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
"""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_async_exec_has_several_bls_calls_in_flight(tmp_path: Path, protocol: str) -> None:
    add_model(tmp_path, "barrier", BARRIER, BARRIER_CONFIG)
    add_model(tmp_path, "fan_out", FAN_OUT, FAN_OUT_CONFIG)
    server = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        if protocol == "http":
            import tritonclient.http as client

            c = triton_http(server)
        else:
            import tritonclient.grpc as client  # type: ignore[no-redef]

            c = triton_grpc(server)
        t = client.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.zeros(1, np.float32))
        # The barrier opens only with the three BLS requests inside the model at once.
        assert c.infer("fan_out", [t]).as_numpy("OUT").tolist() == [3.0]
    finally:
        server.stop()
