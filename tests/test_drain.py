"""The drain a rolling update relies on: readiness turns false at once on every health surface
(HTTP, gRPC ServerReady, grpc.health.v1 Check and Watch) while new connections are still
accepted and requests served; in-flight requests finish; then the server stops. Through
`Server.drain` and through `openinfer serve --drain-grace-secs` with SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

import openinfer
from openinfer import Model, Tensor

from conftest import Cli, port_is_closed, wait_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def http_ready(port: int) -> int:
    return requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10).status_code


def infer_int32(port: int, model: str, x: int) -> tuple[int, object]:
    """One request on a new connection (a new client, as a load balancer's next pick would be)."""
    r = requests.post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", timeout=30, json={
        "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [x]}]})
    return r.status_code, r.json()


def test_drain_turns_readiness_false_while_serving_then_stops() -> None:
    entered, gate = threading.Event(), threading.Event()

    def gated(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        entered.set()
        gate.wait(60)
        return {"Y": inputs["X"] + 1}

    def plus_one(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"Y": inputs["X"] + 1}

    io = {"inputs": [Tensor("X", "INT32", [1])], "outputs": [Tensor("Y", "INT32", [1])]}
    srv = openinfer.serve(models=[Model("gated", gated, **io), Model("plus_one", plus_one, **io)],
                          http_port=0, grpc_port=0, metrics_port=0, log=False)
    drainer: threading.Thread | None = None
    try:
        port, grpc_url = srv.http_port, f"127.0.0.1:{srv.grpc_port}"
        channel = grpc.insecure_channel(grpc_url)
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(watch).status == SERVING
        assert http_ready(port) == 200

        in_flight: dict[str, object] = {}
        t = threading.Thread(target=lambda: in_flight.update(r=infer_int32(port, "gated", 1)))
        t.start()
        assert entered.wait(30)

        drainer = threading.Thread(target=srv.drain, args=(600.0, 30.0))
        drainer.start()
        wait_for(lambda: http_ready(port) == 400, "unready over HTTP")
        assert next(watch).status == NOT_SERVING  # Watch hears it without asking
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == NOT_SERVING
        gclient = grpcclient.InferenceServerClient(grpc_url)
        assert gclient.is_server_ready() is False
        assert gclient.is_server_live() is True
        hclient = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert hclient.is_server_ready() is False and hclient.is_server_live() is True
            assert hclient.is_model_ready("plus_one")  # models stay ready: only the server drains
        finally:
            hclient.close()

        # Still serving, on new connections, both protocols.
        for x in range(5):
            code, body = infer_int32(port, "plus_one", x)
            assert code == 200 and body["outputs"][0]["data"] == [x + 1]
        inp = grpcclient.InferInput("X", [1], "INT32")
        inp.set_data_from_numpy(np.array([7], dtype=np.int32))
        assert gclient.infer("plus_one", [inp]).as_numpy("Y").tolist() == [8]
        gclient.close()
        assert drainer.is_alive() and srv.running

        # stop() cuts the grace short; the request in flight still finishes.
        stopper = threading.Thread(target=srv.stop, args=(30.0,))
        stopper.start()
        wait_for(lambda: port_is_closed(port), "refusing connections")
        gate.set()
        t.join(30)
        assert in_flight["r"][0] == 200 and in_flight["r"][1]["outputs"][0]["data"] == [2]
        stopper.join(30)
        drainer.join(30)
        assert not drainer.is_alive() and not srv.running
        channel.close()
    finally:
        gate.set()
        srv.stop(5)
        if drainer is not None:
            drainer.join(30)


def test_drain_before_start_or_after_stop_just_stops() -> None:
    srv = openinfer.serve(models=[], http_port=0, grpc_port=None, metrics_port=0, log=False)
    srv.stop()
    srv.drain(600.0)  # stopped already: no grace to wait out
    assert not srv.running


GATED_MODEL = """\
import os, time

def infer(inputs):
    # Holds the request until the test creates the release file.
    while not os.path.exists({release!r}):
        time.sleep(0.01)
    return {{'Y': inputs['X'] + 1}}
"""

IO_CONFIG = (
    'input [{{name: "X" data_type: TYPE_INT32 dims: [1]}}]\n'
    'output [{{name: "Y" data_type: TYPE_INT32 dims: [1]}}]\n'
)


def gated_repo(tmp_path) -> tuple[Path, Path]:
    """A repository of "gated" (holds each request until the file `release` exists) and
    "plus_one"; returns it and `release`."""
    repo, release = tmp_path / "repo", tmp_path / "release"
    for name, code in (("gated", GATED_MODEL.format(release=str(release))),
                       ("plus_one", "def infer(inputs):\n    return {'Y': inputs['X'] + 1}\n")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + IO_CONFIG.format())
        (repo / name / "1" / "model.py").write_text(code)
    return repo, release


def hold_request(port: int) -> tuple[threading.Thread, dict[str, object]]:
    """Sends "gated" 41 from a thread of its own, in flight until `release` exists; its answer
    lands under "r"."""
    in_flight: dict[str, object] = {}
    held = threading.Thread(target=lambda: in_flight.update(r=infer_int32(port, "gated", 41)))
    held.start()
    return held, in_flight


def test_cli_sigterm_drains_under_load_then_second_signal_stops(tmp_path) -> None:
    repo, release = gated_repo(tmp_path)
    cli = Cli(str(repo), "--drain-grace-secs", "600", "--metrics-port", "0")
    port = cli.port
    try:
        assert http_ready(port) == 200
        held, in_flight = hold_request(port)

        # A bounded load on fresh connections across the drain: every request is answered.
        stop_load = threading.Event()
        answers: list[tuple[int, object]] = []
        failures: list[BaseException] = []

        def load() -> None:
            x = 0
            while not stop_load.is_set():
                try:
                    code, body = infer_int32(port, "plus_one", x)
                    answers.append((code, body["outputs"][0]["data"] if code == 200 else body))
                except Exception as e:  # a refused or dropped request is a lost one
                    failures.append(e)
                x += 1

        loaders = [threading.Thread(target=load) for _ in range(2)]
        for th in loaders:
            th.start()
        wait_for(lambda: len(answers) >= 5, "answering the load")
        cli.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: http_ready(port) == 400, "unready after SIGTERM")
        seen = len(answers)
        wait_for(lambda: len(answers) >= seen + 10, "answering new connections while draining")
        assert cli.proc.poll() is None
        stop_load.set()
        for th in loaders:
            th.join(30)
        assert not failures, failures
        assert answers and all(code == 200 for code, _ in answers), [a for a in answers if a[0] != 200][:3]

        # The second signal ends the grace; the held request finishes before the exit.
        cli.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: port_is_closed(port), "closing the port")
        release.write_text("")
        held.join(30)
        assert in_flight["r"] == (200, in_flight["r"][1]) and in_flight["r"][1]["outputs"][0]["data"] == [42]
        rc, out = cli.wait()
        assert rc == 0, out
        assert "draining for 600s" in out and "stopping now" in out
    finally:
        release.write_text("")
        cli.kill()


# `openinfer serve` whose start() is held between opening the ports and returning until the file
# WINDOW exists: the moment a SIGTERM once stopped the server without its drain.
HELD_START = """\
import os, sys, time
from openinfer import cli, server

opened = server.Server._warn_if_open  # runs after the ports open, before start() returns

def held(self):
    end = time.monotonic() + 60
    while not os.path.exists({window!r}) and time.monotonic() < end:
        time.sleep(0.01)
    opened(self)

server.Server._warn_if_open = held
sys.exit(cli.main(sys.argv[1:]))
"""


def test_cli_sigterm_as_the_ports_open_drains(tmp_path) -> None:
    (repo, release), window = gated_repo(tmp_path), tmp_path / "window"
    cli = Cli(argv=[sys.executable, "-c", HELD_START.format(window=str(window)), "serve", "--http-port", "0",
                    "--threads", "1", "--metrics-port", "0", "--drain-grace-secs", "600", str(repo)])
    port = cli.port
    try:
        # The ports answer while start() has not returned; a request goes in flight.
        assert http_ready(port) == 200
        held, in_flight = hold_request(port)
        cli.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM: draining for 600s" in cli.output(), "taking the signal")
        window.write_text("")  # start() returns

        # The drain: not ready, still serving new connections, the process running.
        wait_for(lambda: http_ready(port) == 400, "unready after SIGTERM")
        for x in range(3):
            code, body = infer_int32(port, "plus_one", x)
            assert code == 200 and body["outputs"][0]["data"] == [x + 1]
        assert cli.proc.poll() is None

        # The second signal ends the grace; the request in flight since before finishes.
        cli.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: port_is_closed(port), "closing the port")
        release.write_text("")
        held.join(30)
        assert in_flight["r"][0] == 200 and in_flight["r"][1]["outputs"][0]["data"] == [42]
        rc, out = cli.wait()
        assert rc == 0, out
        assert "draining: not ready, serving for 600s more" in out and "stopping now" in out
    finally:
        window.write_text("")
        release.write_text("")
        cli.kill()
