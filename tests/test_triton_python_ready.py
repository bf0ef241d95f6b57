"""A Triton Python model's own readiness (``TritonPythonModel.is_ready()``, sync or async) as
python_backend asks it: on every model ready check over HTTP and gRPC, one call in flight per
instance shared by the checks that come meanwhile, five seconds before a silent one counts as
not ready, and an exception or a non-bool as not ready. Also each worker-process instance's own
``model_instance_name``."""

from __future__ import annotations

import logging
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc

import openinfer

from conftest import triton_grpc, triton_http, wait_for
from test_triton_python_backend import PROLOGUE, add_model

CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }}]
instance_group [{{ kind: KIND_CPU, count: {count} }}]
"""
EXECUTE = """
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                                .as_numpy() * 2)]) for r in requests]
"""
# is_ready answers what the flag file says: "1" ready, "0" not, "raise" raises, "str" a non-bool.
# Each instance notes its model's name and its pid.
FLAG_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os
    class TritonPythonModel:
        def initialize(self, args):
            with open(os.environ["PYR_FLAG"] + ".pids", "a") as f:
                f.write(f"{args['model_name']} {os.getpid()}\\n")

        def is_ready(self):
            flag = open(os.environ["PYR_FLAG"]).read()
            if flag == "raise":
                raise RuntimeError("the feature store is unreachable")
            return "yes" if flag == "str" else flag == "1"
    """
    + EXECUTE
)
# is_ready notes each call, then waits (bounded) for the gate file.
SLOW_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os, time
    class TritonPythonModel:
        def is_ready(self):
            with open(os.environ["PYR_CALLS"], "a") as f:
                f.write("call\\n")
            end = time.monotonic() + 60
            while not os.path.exists(os.environ["PYR_GATE"]) and time.monotonic() < end:
                time.sleep(0.01)
            with open(os.environ["PYR_CALLS"] + ".done", "a") as f:
                f.write("done\\n")
            return True
    """
    + EXECUTE
)
ASYNC_MODEL = PROLOGUE + textwrap.dedent(
    """
    import asyncio, os
    class TritonPythonModel:
        async def is_ready(self):
            await asyncio.sleep(0)
            return open(os.environ["PYR_FLAG"]).read() != "0"
    """
    + EXECUTE
)
# Each instance notes its pid as it starts, and exits at once while the die file exists.
DYING_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os
    class TritonPythonModel:
        def initialize(self, args):
            with open(os.environ["PYR_STARTS"], "a") as f:
                f.write(f"{os.getpid()}\\n")
            if os.path.exists(os.environ["PYR_DIE"]):
                os._exit(3)

        def is_ready(self):
            return True
    """
    + EXECUTE
)
# Each instance notes its model_instance_name.
NAMES_MODEL = PROLOGUE + textwrap.dedent(
    """
    import os
    class TritonPythonModel:
        def initialize(self, args):
            with open(os.environ["PYR_NAMES"], "a") as f:
                f.write(args["model_instance_name"] + "\\n")
    """
    + EXECUTE
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("ready_files")
    paths = {k: d / k for k in ("flag", "calls", "gate", "names", "starts", "die")}
    paths["flag"].write_text("1")
    paths["gate"].touch()  # the slow model answers at once but in its own test
    mp = pytest.MonkeyPatch()
    for k, p in paths.items():
        mp.setenv(f"PYR_{k.upper()}", str(p))
    yield paths
    mp.undo()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("triton_ready")
    add_model(repo, "flag", FLAG_MODEL, CONFIG.format(name="flag", count=1))
    # two instances kept in the server process (KIND_MODEL)
    add_model(repo, "flag2", FLAG_MODEL, CONFIG.format(name="flag2", count=2).replace("KIND_CPU", "KIND_MODEL"))
    add_model(repo, "flag_workers", FLAG_MODEL, CONFIG.format(name="flag_workers", count=2))
    add_model(repo, "slow", SLOW_MODEL, CONFIG.format(name="slow", count=1))
    add_model(repo, "async_ready", ASYNC_MODEL, CONFIG.format(name="async_ready", count=1))
    add_model(repo, "dying", DYING_MODEL, CONFIG.format(name="dying", count=2))
    add_model(repo, "names", NAMES_MODEL, CONFIG.format(name="names", count=3))
    server = openinfer.serve(repo, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False)
    try:
        yield server
    finally:
        server.stop()


def ready(srv: openinfer.Server, model: str) -> tuple[bool, bool, bool]:
    """The model's readiness over tritonclient HTTP, HTTP by version, and tritonclient gRPC."""
    return (
        triton_http(srv).is_model_ready(model),
        triton_http(srv).is_model_ready(model, "1"),
        triton_grpc(srv).is_model_ready(model),
    )


def server_ready(srv: openinfer.Server) -> tuple[bool, bool, int]:
    """The server's (strict) readiness over tritonclient HTTP and gRPC, and the HTTP status."""
    status = requests.get(f"{srv.url}/v2/health/ready", timeout=30).status_code
    return triton_http(srv).is_server_ready(), triton_grpc(srv).is_server_ready(), status


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health(srv: openinfer.Server, service: str = "") -> int:
    """grpc.health.v1 Check of `service` through grpcio's health stub."""
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=60).status


def test_grpc_health_asks_is_ready(srv: openinfer.Server, files: dict[str, Path]) -> None:
    # The health service agrees with /v2/health/ready and ServerReady; as Triton's, every
    # service name (a model's too) gets the server's status.
    files["flag"].write_text("1")
    assert server_ready(srv) == (True, True, 200)
    assert [health(srv, n) for n in ("", "flag", "other")] == [SERVING] * 3
    files["flag"].write_text("0")
    assert server_ready(srv) == (False, False, 400)
    assert [health(srv, n) for n in ("", "flag", "other")] == [NOT_SERVING] * 3
    files["flag"].write_text("1")
    assert health(srv) == SERVING


def test_grpc_health_watch_asks_is_ready(tmp_path: Path, files: dict[str, Path]) -> None:
    add_model(tmp_path, "flag", FLAG_MODEL, CONFIG.format(name="flag", count=1))
    files["flag"].write_text("0")
    with openinfer.serve(tmp_path, http_port=0, grpc_port=0, metrics_port=None, threads=2, log=False,
                         model_control_mode="explicit", load_models=["flag"]) as s:
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(watch).status == NOT_SERVING
            # A change of the server's state (a model reloaded) asks the models again for watchers.
            files["flag"].write_text("1")
            triton_grpc(s).load_model("flag")
            assert next(watch).status == SERVING
            watch.cancel()
    files["flag"].write_text("1")


def test_is_ready_answers_every_check(srv: openinfer.Server, files: dict[str, Path]) -> None:
    files["flag"].write_text("1")
    assert ready(srv, "flag") == (True, True, True)
    assert server_ready(srv) == (True, True, 200)
    files["flag"].write_text("0")
    assert ready(srv, "flag") == (False, False, False)
    # As Triton's strict readiness: the server is ready when every model's instances are.
    assert server_ready(srv) == (False, False, 400)
    answer = requests.get(f"{srv.url}/v2/models/flag/ready", timeout=30)
    assert answer.status_code == 400
    assert answer.json() == {"name": "flag", "version": "1", "ready": False,
                             "error": "the model reports it is not ready"}
    files["flag"].write_text("1")
    assert ready(srv, "flag") == (True, True, True)
    assert requests.get(f"{srv.url}/v2/models/flag/ready", timeout=30).json()["ready"] is True
    assert server_ready(srv) == (True, True, 200)


@pytest.mark.parametrize("model", ["flag2", "flag_workers"])
def test_every_instance_must_be_ready(srv: openinfer.Server, files: dict[str, Path], model: str) -> None:
    # flag2: two instances in the server process; flag_workers: two worker processes
    files["flag"].write_text("1")
    assert ready(srv, model) == (True, True, True)
    files["flag"].write_text("0")
    assert ready(srv, model) == (False, False, False)
    assert server_ready(srv) == (False, False, 400)
    files["flag"].write_text("1")
    assert ready(srv, model) == (True, True, True)


@pytest.mark.parametrize("flag", ["raise", "str"])
def test_is_ready_raising_or_not_bool_is_not_ready_logged_once(
    srv: openinfer.Server, files: dict[str, Path], flag: str, caplog: pytest.LogCaptureFixture
) -> None:
    files["flag"].write_text("1")
    assert ready(srv, "flag") == (True, True, True)
    files["flag"].write_text(flag)
    with caplog.at_level(logging.ERROR, logger="openinfer"):
        for _ in range(3):
            assert ready(srv, "flag") == (False, False, False)
    logged = [r.getMessage() for r in caplog.records if "is_ready()" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "flag_0_0" in logged[0]
    assert ("the feature store is unreachable" if flag == "raise" else "must return a boolean") in logged[0]
    files["flag"].write_text("1")
    assert ready(srv, "flag") == (True, True, True)
    # the model still serves
    client = triton_http(srv)
    import tritonclient.http as httpclient
    import numpy as np

    x = httpclient.InferInput("IN", [2], "FP32")
    x.set_data_from_numpy(np.array([1, 2], np.float32))
    assert client.infer("flag", [x]).as_numpy("OUT").tolist() == [2.0, 4.0]


def test_async_is_ready(srv: openinfer.Server, files: dict[str, Path]) -> None:
    files["flag"].write_text("1")
    assert ready(srv, "async_ready") == (True, True, True)
    files["flag"].write_text("0")
    assert ready(srv, "async_ready") == (False, False, False)
    files["flag"].write_text("1")


def test_slow_is_ready_times_out_and_concurrent_checks_share_one_call(
    srv: openinfer.Server, files: dict[str, Path]
) -> None:
    calls, done = files["calls"], Path(str(files["calls"]) + ".done")
    files["gate"].unlink(missing_ok=True)
    calls.unlink(missing_ok=True)
    done.unlink(missing_ok=True)

    def lines(p: Path) -> int:
        return len(p.read_text().splitlines()) if p.exists() else 0

    with ThreadPoolExecutor(4) as pool:
        http = [pool.submit(lambda: triton_http(srv, timeout=120).is_model_ready("slow")) for _ in range(3)]
        grpc = pool.submit(lambda: triton_grpc(srv).is_model_ready("slow"))
        check = pool.submit(health, srv)
        # While is_ready hangs the event loops go on answering.
        wait_for(lambda: lines(calls) == 1, "is_ready called")
        assert triton_http(srv).is_server_live() and triton_http(srv).is_model_ready("flag")
        assert [f.result(timeout=120) for f in http] == [False, False, False]  # 5 s passed: not ready
        assert grpc.result(timeout=120) is False
        assert check.result(timeout=120) == NOT_SERVING  # the server asks "slow" too
    assert lines(calls) == 1  # one call in flight, its result shared
    files["gate"].touch()
    wait_for(lambda: lines(done) == 1, "the hung is_ready returned")
    assert ready(srv, "slow") == (True, True, True)
    assert lines(calls) >= 2
    files["gate"].touch()


def test_a_dead_worker_is_replaced_without_a_request(srv: openinfer.Server, files: dict[str, Path]) -> None:
    files["flag"].write_text("1")
    pids_file = Path(str(files["flag"]) + ".pids")

    def pids() -> list[int]:
        return [int(line.split()[1]) for line in pids_file.read_text().splitlines()
                if line.split()[0] == "flag_workers"]

    wait_for(lambda: ready(srv, "flag_workers") == (True, True, True), "flag_workers ready")
    before = len(pids())
    assert before >= 2
    os.kill(pids()[-1], signal.SIGKILL)
    # The server notices the death (the worker's socket hangs up) and starts a replacement
    # itself: readiness comes back with no inference request.
    wait_for(lambda: len(pids()) == before + 1, "the killed worker replaced", bound=60)
    wait_for(lambda: ready(srv, "flag_workers") == (True, True, True), "the replacement asked", bound=60)
    assert server_ready(srv) == (True, True, 200)
    assert health(srv) == SERVING
    files["flag"].write_text("0")  # the replacement's own is_ready() is asked
    assert ready(srv, "flag_workers") == (False, False, False)
    files["flag"].write_text("1")
    assert len(pids()) == before + 1


def test_a_worker_that_dies_at_start_is_not_restarted_in_a_tight_loop(
    srv: openinfer.Server, files: dict[str, Path]
) -> None:
    def starts() -> list[int]:
        return [int(x) for x in files["starts"].read_text().split()]

    wait_for(lambda: ready(srv, "dying")[0], "dying ready")
    files["die"].touch()
    try:
        first = len(starts())
        os.kill(starts()[-1], signal.SIGKILL)
        wait_for(lambda: len(starts()) > first, "a replacement started", bound=60)
        # Each successor dies in initialize(): the next waits, doubling (100 ms up to 10 s),
        # so six seconds see a handful of starts, where a tight loop would see dozens.
        window_start = len(starts())
        end = time.monotonic() + 6
        while time.monotonic() < end:
            time.sleep(0.1)
        restarts = len(starts()) - window_start
        assert restarts <= 6, restarts
        assert ready(srv, "dying") == (False, False, False)
    finally:
        files["die"].unlink()
    # Once it can start again the model is whole again, still with no request.
    wait_for(lambda: ready(srv, "dying") == (True, True, True), "dying ready again", bound=60)


def test_worker_instances_have_their_own_names(srv: openinfer.Server, files: dict[str, Path]) -> None:
    names = files["names"]
    wait_for(lambda: names.exists() and len(names.read_text().splitlines()) == 3, "three instances initialized")
    assert sorted(names.read_text().splitlines()) == ["names_0_0", "names_0_1", "names_0_2"]
