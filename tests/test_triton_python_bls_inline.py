"""BLS run on the caller's thread: a Python model's `exec()` to a quick Python model whose scheduler
has nothing queued runs the target on the calling executor (no hand-off of the GIL to the target's
executor and back), with the target's statistics, errors and results as when it is queued; a BLS
call from a thread the model started, or from an `async def execute`, is queued as before."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

import openinfer

from conftest import triton_grpc, triton_http
from test_triton_python_backend import PROLOGUE, add_model

# Doubles IN as OUT and says which thread ran it (TID); IN[0] < 0 is the response's error.
WHERE = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                if x[0] < 0:
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative IN")))
                    continue
                tid = np.array([threading.get_ident()], np.int64)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x * 2).astype(np.float32)),
                                                       pb_utils.Tensor("TID", tid)]))
            return out
    """
)
WHERE_CONFIG = """
name: "where"
backend: "python"
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "TID", data_type: TYPE_INT64, dims: [ 1 ] }]
"""

# Calls "where" by BLS itself: the target of a target.
RELAY = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN")
                got = pb_utils.InferenceRequest(model_name="where", inputs=[x],
                                                requested_output_names=["OUT", "TID"]).exec()
                if got.has_error():
                    raise pb_utils.TritonModelException(got.error().message())
                out.append(pb_utils.InferenceResponse(got.output_tensors()))
            return out
    """
)
RELAY_CONFIG = WHERE_CONFIG.replace('"where"', '"relay"')

# N BLS calls to TARGET (MODE "exec": from execute, "thread": from a thread execute starts);
# SAME: how many ran on the calling thread, OK: how many answered right, MSG: the last error.
PROBE = PROLOGUE + textwrap.dedent(
    """
    def calls(n, target, x):
        same, ok, msg = 0, 0, ""
        for _ in range(n):
            r = pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("IN", x)],
                                          requested_output_names=["OUT", "TID"]).exec()
            if r.has_error():
                msg = r.error().message()
                continue
            out = pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()
            tid = int(pb_utils.get_output_tensor_by_name(r, "TID").as_numpy()[0])
            ok += int(out.tolist() == (x * 2).tolist())
            same += int(tid == threading.get_ident())
        return same, ok, msg

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
                target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                if mode == "thread":
                    result = []
                    t = threading.Thread(target=lambda: result.append(calls(n, target, x)))
                    t.start()
                    t.join()
                    same, ok, msg = result[0]
                else:
                    same, ok, msg = calls(n, target, x)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("SAME", np.array([same], np.int64)),
                    pb_utils.Tensor("OK", np.array([ok], np.int64)),
                    pb_utils.Tensor("MSG", np.array([msg.encode()], np.object_))]))
            return responses
    """
)
PROBE_CONFIG = """
name: "probe"
backend: "python"
input [{ name: "N", data_type: TYPE_INT64, dims: [ 1 ] }, { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] },
       { name: "TARGET", data_type: TYPE_STRING, dims: [ 1 ] }, { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "SAME", data_type: TYPE_INT64, dims: [ 1 ] }, { name: "OK", data_type: TYPE_INT64, dims: [ 1 ] },
        { name: "MSG", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

# PROBE's calls from an `async def execute`, awaited with async_exec on the instance's event loop.
ASYNC_PROBE = PROLOGUE + textwrap.dedent(
    """
    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                same, ok = 0, 0
                for _ in range(n):
                    r = await pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("IN", x)],
                                                        requested_output_names=["OUT", "TID"]).async_exec()
                    out = pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()
                    tid = int(pb_utils.get_output_tensor_by_name(r, "TID").as_numpy()[0])
                    ok += int(out.tolist() == (x * 2).tolist())
                    same += int(tid == threading.get_ident())
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("SAME", np.array([same], np.int64)),
                    pb_utils.Tensor("OK", np.array([ok], np.int64)),
                    pb_utils.Tensor("MSG", np.array([b""], np.object_))]))
            return responses
    """
)

N = 20


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("bls_inline")
    add_model(repo, "where", WHERE, WHERE_CONFIG)
    add_model(repo, "relay", RELAY, RELAY_CONFIG)
    add_model(repo, "probe", PROBE, PROBE_CONFIG)
    add_model(repo, "async_probe", ASYNC_PROBE, PROBE_CONFIG.replace('"probe"', '"async_probe"'))
    # Any average execution counts as quick here (ASan and a busy machine slow the models down):
    # whether the target runs on the caller must not depend on the clock. Read as models load.
    before = os.environ.get("OPENINFER_RUN_ON_LOOP_MAX_US")
    os.environ["OPENINFER_RUN_ON_LOOP_MAX_US"] = "10000000"
    try:
        server = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    finally:
        if before is None:
            del os.environ["OPENINFER_RUN_ON_LOOP_MAX_US"]
        else:
            os.environ["OPENINFER_RUN_ON_LOOP_MAX_US"] = before
    try:
        yield server
    finally:
        server.stop()


def probe(srv: openinfer.Server, mode: str, target: str = "where", x: list[float] = [1.0, 2.5],
          model: str = "probe", protocol: str = "http") -> tuple[int, int, str]:
    """(SAME, OK, MSG) of N BLS calls made by `model`, asked through tritonclient."""
    if protocol == "http":
        import tritonclient.http as client

        c = triton_http(srv)
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]

        c = triton_grpc(srv)
    inputs = []
    for name, value, datatype in (("N", np.array([N], np.int64), "INT64"),
                                  ("MODE", np.array([mode.encode()], np.object_), "BYTES"),
                                  ("TARGET", np.array([target.encode()], np.object_), "BYTES"),
                                  ("IN", np.array(x, np.float32), "FP32")):  # fmt: skip
        i = client.InferInput(name, list(value.shape), datatype)
        i.set_data_from_numpy(value)
        inputs.append(i)
    result = c.infer(model, inputs)
    return int(result.as_numpy("SAME")[0]), int(result.as_numpy("OK")[0]), result.as_numpy("MSG")[0].decode()


def successes(srv: openinfer.Server, model: str) -> tuple[int, int]:
    """The model's successful inferences and executions, from the statistics extension."""
    stats = triton_http(srv).get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_quick_bls_target_runs_on_the_callers_thread_and_is_counted(srv: openinfer.Server, protocol: str) -> None:
    before = successes(srv, "where")
    same, ok, msg = probe(srv, "exec", protocol=protocol)
    assert (ok, msg) == (N, "")
    # The first call of a fresh model is queued (no execution time known yet); then each runs
    # on the caller: nothing else is queued on "where" and its one instance is free.
    assert same >= N - 1, f"{same} of {N} BLS calls ran on the calling executor"
    after = successes(srv, "where")
    assert (after[0] - before[0], after[1] - before[1]) == (N, N)


def test_a_target_of_a_target_runs_on_the_first_callers_thread(srv: openinfer.Server) -> None:
    probe(srv, "exec", target="relay")  # both models have run once: their time is known
    before = successes(srv, "relay"), successes(srv, "where")
    same, ok, msg = probe(srv, "exec", target="relay")
    assert (same, ok, msg) == (N, N, "")
    after = successes(srv, "relay"), successes(srv, "where")
    assert after[0][0] - before[0][0] == N and after[1][0] - before[1][0] == N


def test_a_target_that_fails_on_the_callers_thread_is_the_responses_error(srv: openinfer.Server) -> None:
    probe(srv, "exec")  # "where" has a known execution time: its calls run on the caller
    same, ok, msg = probe(srv, "exec", x=[-1.0])
    assert (same, ok) == (0, 0)
    assert "negative IN" in msg
    assert probe(srv, "exec")[:2] == (N, N)  # and the next calls are served as before


def test_bls_from_a_thread_the_model_started_is_queued(srv: openinfer.Server) -> None:
    probe(srv, "exec")
    # That thread's Python state is Python's own, not an executor's: the target runs on its
    # executor, and the thread still gets every answer.
    assert probe(srv, "thread") == (0, N, "")


def test_async_exec_from_an_async_execute_is_queued(srv: openinfer.Server) -> None:
    probe(srv, "exec")
    assert probe(srv, "exec", model="async_probe") == (0, N, "")
