"""serve() from Python, the pytest plugin's fixtures, and the `openinfer serve` command with
its signal handling, through real sockets."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Model, Tensor

from conftest import Cli, port_is_closed, wait_for


def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["X"] * 2}


DOUBLE = Model("double", double, inputs=[Tensor("X", "FP64", [-1])], outputs=[Tensor("Y", "FP64", [-1])])


def test_serve_returns_running_server_at_once() -> None:
    server = openinfer.serve(models=[DOUBLE], http_port=0, log=False)
    try:  # back on this thread while the server runs: the request below is answered
        assert server.running and server.http_port > 0
        assert server.url == f"http://127.0.0.1:{server.http_port}"
        assert repr(server) == f"<openinfer.Server {server.url} {server.grpc_url} models=[double]>"
        r = requests.post(server.url + "/v2/models/double/infer", timeout=10, json={
            "inputs": [{"name": "X", "shape": [3], "datatype": "FP64", "data": [1, 2.5, -3]}]})
        assert r.json()["outputs"][0]["data"] == [2.0, 5.0, -6.0]
    finally:
        server.stop()
    assert not server.running
    assert port_is_closed(server.http_port)
    server.stop()  # idempotent


def test_context_manager_and_two_servers() -> None:
    with openinfer.serve(models=[DOUBLE], http_port=0, log=False) as a, \
            openinfer.serve(http_port=0, log=False) as b:
        assert a.http_port != b.http_port
        assert requests.get(a.url + "/v2/models/double/ready", timeout=10).status_code == 200
        assert requests.get(b.url + "/v2/models/simple/ready", timeout=10).status_code == 200
        assert requests.get(b.url + "/v2/models/double/ready", timeout=10).status_code == 400  # not served
        assert requests.get(b.url + "/v2/models/double", timeout=10).status_code == 404
    assert port_is_closed(a.http_port) and port_is_closed(b.http_port)


def test_port_in_use_is_a_clear_error() -> None:
    with openinfer.serve(models=[DOUBLE], http_port=0, log=False) as a:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{a.http_port}"):
            openinfer.serve(models=[DOUBLE], http_port=a.http_port, log=False)


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = openinfer.serve(models=[DOUBLE], host="::1", http_port=0, log=False)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    with server:
        assert server.url.startswith("http://[::1]:")
        assert requests.get(server.url + "/v2/health/live", timeout=10).json() == {"live": True}


def test_stop_drains_in_flight_requests() -> None:
    entered = threading.Event()

    def slow(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        entered.set()
        time.sleep(0.5)  # still running when stop() begins, unless the machine stalls (then the test is weaker only)
        return {"Y": inputs["X"]}

    model = Model("slow", slow, inputs=[Tensor("X", "INT32", [1])], outputs=[Tensor("Y", "INT32", [1])])
    server = openinfer.serve(models=[model], http_port=0, log=False)
    results: list[int] = []

    def call() -> None:
        r = requests.post(server.url + "/v2/models/slow/infer", timeout=10, json={
            "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [7]}]})
        results.append(r.status_code)

    t = threading.Thread(target=call)
    t.start()
    assert entered.wait(30), "the request never reached the model"
    server.stop(timeout=30)
    t.join(30)
    assert results == [200]


def test_plugin_fixture(openinfer_server) -> None:
    server = openinfer_server(models=[DOUBLE], log=False)
    assert requests.get(server.url + "/v2/models/double/ready", timeout=10).status_code == 200


def test_plugin_example_fixture(openinfer_example_server) -> None:
    names = requests.get(openinfer_example_server.url + "/v2/models/simple", timeout=10).json()["name"]
    assert names == "simple"


def test_cli_serves_examples_and_sigterm_drains(tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / "sleepy" / "1").mkdir(parents=True)
    (repo / "sleepy" / "config.pbtxt").write_text(
        'name: "sleepy"\nbackend: "python"\n'
        'input [{name: "X" data_type: TYPE_INT32 dims: [1]}]\noutput [{name: "Y" data_type: TYPE_INT32 dims: [1]}]\n'
    )
    (repo / "sleepy" / "1" / "model.py").write_text(
        "import time\nfrom pathlib import Path\n\ndef infer(inputs):\n"
        "    (Path(__file__).parents[2] / 'running').touch()\n    time.sleep(0.8)\n    return {'Y': inputs['X'] + 1}\n"
    )
    cli = Cli(str(repo))
    proc, port = cli.proc, cli.port
    try:
        url = f"http://127.0.0.1:{port}"
        result: dict[str, object] = {}

        def call() -> None:
            r = requests.post(url + "/v2/models/sleepy/infer", timeout=20, json={
                "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [41]}]})
            result["status"], result["body"] = r.status_code, r.json()

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: (repo / "running").exists(), "the request with the model")
        proc.send_signal(signal.SIGTERM)
        t.join(20)
        assert result["status"] == 200 and result["body"]["outputs"][0]["data"] == [42]
        rc, out = cli.wait()
        assert rc == 0, out
        assert "sleepy" in out
        assert port_is_closed(port)
    finally:
        cli.kill()


def test_cli_default_repository_and_ctrl_c() -> None:
    cli = Cli()
    proc, port = cli.proc, cli.port
    try:
        url = f"http://127.0.0.1:{port}"
        body = {"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
        r = requests.post(url + "/v2/models/simple/infer", json=body, timeout=10)
        assert r.json()["outputs"][0]["data"] == list(range(1, 17))
        proc.send_signal(signal.SIGINT)
        rc, out = cli.wait()
        assert rc == 0, out
        for model in ("simple", "simple_string", "identity_fp32"):
            assert model in out
    finally:
        cli.kill()


def test_cli_bad_repository_is_a_clear_error(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "openinfer", "serve", str(tmp_path / "missing"), "--http-port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "missing" in r.stderr + r.stdout


def test_cli_version() -> None:
    r = subprocess.run([sys.executable, "-m", "openinfer", "--version"], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == f"openinfer {openinfer.__version__}"


def test_cli_model_control_explicit() -> None:
    cli = Cli("--model-control-mode", "explicit", "--load-model", "simple", "--load-model", "simple_string")
    try:
        url = f"http://127.0.0.1:{cli.port}/v2/repository"
        index = {m["name"]: m for m in requests.post(url + "/index", timeout=10).json()}
        assert index["simple"]["state"] == index["simple_string"]["state"] == "READY"
        assert index["identity_fp32"] == {"name": "identity_fp32"}
        assert requests.post(url + "/models/identity_fp32/load", timeout=30).status_code == 200
        assert requests.get(f"http://127.0.0.1:{cli.port}/v2/models/identity_fp32/ready", timeout=10).status_code == 200
        cli.proc.send_signal(signal.SIGINT)
        rc, out = cli.wait()
        assert rc == 0, out
    finally:
        cli.kill()


def test_cli_load_model_needs_explicit_mode() -> None:
    r = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--load-model", "simple"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "explicit" in r.stderr
