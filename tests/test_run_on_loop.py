"""Quick models run on the loop thread that received the request (oi_scheduler_submit_on_loop):
a TorchScript or ONNX model whose executions average under 50 µs (OPENINFER_RUN_ON_LOOP_MAX_US)
skips the hand-off to its executor and back. Shown by the executor threads' context switches
(an executor that is handed a request wakes for it), through tritonclient over HTTP and gRPC; a
slow model, a batching one and a Python one (users' Python may call the server back) still go
to their executors, and so does every model with the variable at 0. The servers here allow
1 ms: under ASan the C side of a trivial module's call nears the default 50 µs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import openinfer
from conftest import concurrent, executor_switches, save_torchscript, triton_grpc, triton_http

TORCH = """
from typing import Dict

import torch


class Twice(torch.nn.Module):
    def forward(self, IN: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"OUT": IN * 2}


class Slow(torch.nn.Module):
    def forward(self, IN: torch.Tensor) -> Dict[str, torch.Tensor]:
        m = torch.ones(512, 512) + IN.sum() * 0  # made of the input: not folded away
        busy = torch.mm(m, m)  # several ms
        return {"OUT": IN * 2 + (busy[0, 0] - busy[0, 0])}
"""

CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def _torch_model(repo: Path, tmp: Path, name: str, cls: str, mbs: int = 0, extra: str = "") -> None:
    save_torchscript(TORCH, cls, repo / name / "1" / "model.pt", tmp)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, mbs=mbs, extra=extra))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run_on_loop")
    _torch_model(tmp / "repo", tmp, "quick", "Twice")
    _torch_model(tmp / "repo", tmp, "slow", "Slow")
    _torch_model(tmp / "repo", tmp, "batched", "Twice", mbs=8, extra="dynamic_batching { }")
    return tmp / "repo"


def _serve(repo: Path, max_us: str) -> openinfer.Server:
    @openinfer.model(inputs=[openinfer.Tensor("IN", "FP32", [4])], outputs=[openinfer.Tensor("OUT", "FP32", [4])])
    def python(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUT": inputs["IN"] * 2}

    with pytest.MonkeyPatch.context() as mp:  # read as the models load
        mp.setenv("OPENINFER_RUN_ON_LOOP_MAX_US", max_us)
        srv = openinfer.serve(repo, models=[python], http_port=0, grpc_port=0, threads=2, log=False)
    assert srv.failed == {}, srv.failed
    return srv


@pytest.fixture(scope="module")
def server(repo: Path) -> Any:
    srv = _serve(repo, "1000")
    yield srv
    srv.stop()


def _call(client: Any, mod: Any, model: str, x: np.ndarray) -> np.ndarray:
    shape = [1, 4] if model == "batched" else [4]
    inp = mod.InferInput("IN", shape, "FP32")
    inp.set_data_from_numpy(x.reshape(shape))
    return client.infer(model, [inp]).as_numpy("OUT").reshape(4)


def _switches_over(client: Any, mod: Any, model: str, n: int, warm: int = 60) -> int:
    # The first executions go to the executor, which times them; a TorchScript module's first
    # runs (profiling, optimising) are slow, and the average forgets them over some dozens.
    for i in range(warm):
        _call(client, mod, model, np.full(4, i, np.float32))
    before = executor_switches()
    for i in range(n):
        x = np.arange(4, dtype=np.float32) + i
        np.testing.assert_array_equal(_call(client, mod, model, x), x * 2)
    return executor_switches() - before


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_quick_model_runs_on_the_loop(server: openinfer.Server, protocol: str) -> None:
    client, mod = (triton_http(server), httpclient) if protocol == "http" else (triton_grpc(server), grpcclient)
    assert _switches_over(client, mod, "quick", 200) < 20


@pytest.mark.parametrize("model", ["slow", "batched", "python"])
def test_other_models_go_to_their_executors(server: openinfer.Server, model: str) -> None:
    """Each request wakes the executor (at least one switch each way for most of them)."""
    n = 30 if model == "slow" else 100
    assert _switches_over(triton_http(server), httpclient, model, n, warm=5 if model == "slow" else 60) >= n


def test_zero_keeps_every_model_on_its_executor(repo: Path) -> None:
    srv = _serve(repo, "0")
    try:
        assert _switches_over(triton_http(srv), httpclient, "quick", 100) >= 100
    finally:
        srv.stop()


def test_concurrent_clients_and_statistics(server: openinfer.Server) -> None:
    """Clients on both loops at once: every answer right, and the statistics count every
    request and execution whether it ran on a loop or the executor."""
    client = triton_http(server)

    def stats() -> dict[str, Any]:
        return client.get_inference_statistics("quick")["model_stats"][0]

    before = stats()

    def run(k: int) -> None:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        try:
            for i in range(100):
                x = np.full(4, k * 1000 + i, np.float32)
                np.testing.assert_array_equal(_call(c, httpclient, "quick", x), x * 2)
        finally:
            c.close()

    concurrent(4, run)
    after = stats()
    assert int(after["inference_count"]) - int(before["inference_count"]) == 400
    assert int(after["execution_count"]) - int(before["execution_count"]) == 400
    ok = after["inference_stats"]["success"]
    assert int(ok["count"]) - int(before["inference_stats"]["success"]["count"]) == 400
