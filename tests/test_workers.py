"""`openinfer serve --workers N` (several server processes on the parent's sockets) and
`serve(sockets=...)` underneath it, through real sockets and real clients."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

import openinfer
from openinfer._control.workers import merge_metrics

from conftest import Cli, port_is_closed, wait_for

PID_MODEL = """\
import os
import numpy as np

def infer(inputs):
    return {"PID": np.array([os.getpid()], dtype=np.int64)}
"""


@pytest.fixture
def pid_repo(tmp_path: Path) -> Path:
    (tmp_path / "pid" / "1").mkdir(parents=True)
    (tmp_path / "pid" / "config.pbtxt").write_text(
        'name: "pid"\nbackend: "python"\ninput [{name: "X" data_type: TYPE_INT32 dims: [1]}]\n'
        'output [{name: "PID" data_type: TYPE_INT64 dims: [1]}]\n'
    )
    (tmp_path / "pid" / "1" / "model.py").write_text(PID_MODEL)
    return tmp_path


def answering_pid(port: int) -> int:
    """The pid of the worker that answers one request on a new connection."""
    r = requests.post(f"http://127.0.0.1:{port}/v2/models/pid/infer", timeout=30, json={
        "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][0]


def pids_until(port: int, want: int, exclude: set[int] = frozenset(), bound: float = 120.0) -> set[int]:
    """Asks on new connections until `want` distinct workers (outside `exclude`) answered. The
    kernel hands each connection to whichever worker accepts first, so this is a matter of
    asking often enough; `bound` (seconds) only stops a hang."""
    seen: set[int] = set()
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            pid = answering_pid(port)
        except requests.ConnectionError:  # a worker killed with this connection in its queue
            continue
        if pid not in exclude:
            seen.add(pid)
        if len(seen) >= want:
            return seen
    raise AssertionError(f"only {len(seen)} distinct workers answered in {bound}s")


def wait_for_line(cli: Cli, pattern: str, after: str = "", bound: float = 60.0) -> re.Match[str]:
    """The first match of `pattern` in the output lines that follow the first line containing
    `after`; waits for it (`bound` only stops a hang)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        lines = cli.lines[:]
        start = next((i for i, line in enumerate(lines) if after in line), None) if after else 0
        for line in lines[start + 1 if after else 0:] if start is not None else []:
            m = re.search(pattern, line)
            if m:
                return m
        time.sleep(0.02)
    raise AssertionError(f"no line matching {pattern!r}: {cli.output()}")


def metrics_port_of(cli: Cli) -> int:
    line = next(line for line in cli.lines if "workers listening on" in line)
    return int(line.rsplit("metrics http://127.0.0.1:", 1)[1].split("/", 1)[0])


def grpc_port_of(cli: Cli) -> int:
    line = next(line for line in cli.lines if "workers listening on" in line)
    return int(line.split("grpc://127.0.0.1:", 1)[1].split(",", 1)[0])


def test_workers_share_the_ports_restart_and_stop(pid_repo: Path) -> None:
    cli = Cli(str(pid_repo), "--workers", "2", "--drain-grace-secs", "600")
    port = cli.port
    try:
        workers = pids_until(port, 2)
        assert os.getpid() not in workers and cli.proc.pid not in workers

        # gRPC is shared the same way.
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port_of(cli)}")
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        assert int(client.infer("pid", [x]).as_numpy("PID")[0]) in workers
        client.close()

        # /metrics on the parent: both workers' samples, labelled, summing to what was sent.
        before = sum_success(metrics_port_of(cli))
        for _ in range(10):
            answering_pid(port)
        families = scrape(metrics_port_of(cli))
        success = [s for s in families["nv_inference_request_success"].samples if s.labels["model"] == "pid"]
        assert {s.labels["worker"] for s in success} == {"0", "1"}
        assert sum(s.value for s in success) == before + 10

        # A worker killed outright is replaced; the other serves meanwhile.
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        survivor = (workers - {victim}).pop()
        assert answering_pid(port) != victim  # served meanwhile
        wait_for_line(cli, "exited with signal 9; restarting")
        new = int(wait_for_line(cli, r"worker \d started \(pid (\d+)\)", after="exited with signal 9").group(1))
        replacement = pids_until(port, 1, exclude={victim, survivor})
        assert replacement == {new}

        # SIGTERM drains every worker at once: unready on every connection, both still serving.
        cli.proc.send_signal(signal.SIGTERM)
        deadline, unready_in_a_row = time.monotonic() + 60, 0
        while unready_in_a_row < 50:
            assert time.monotonic() < deadline, "the workers never all turned unready"
            r = requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10)
            unready_in_a_row = unready_in_a_row + 1 if r.status_code == 400 else 0
        assert pids_until(port, 2) == {survivor, *replacement}
        cli.proc.send_signal(signal.SIGTERM)  # the second signal ends the drain
        rc, out = cli.wait()
        assert rc == 0, out
        assert port_is_closed(port)
        for pid in {survivor, *replacement}:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        cli.kill()


def scrape(port: int) -> dict:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sum_success(port: int) -> float:
    fam = scrape(port).get("nv_inference_request_success")
    return sum(s.value for s in fam.samples if s.labels.get("model") == "pid") if fam else 0.0


def test_workers_are_out_of_reach_of_the_terminals_signals(pid_repo: Path) -> None:
    """Each worker leads a session of its own (Popen's start_new_session, which Python 3.10 has
    too): a Ctrl-C or hang-up of the terminal goes to the parent's process group only, and the
    parent decides what the workers get (a drain, a TLS reload)."""
    cli = Cli(str(pid_repo), "--workers", "2")
    try:
        for pid in pids_until(cli.port, 2):
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid
            assert os.getpgid(pid) != os.getpgid(cli.proc.pid)
    finally:
        cli.kill()


def test_workers_die_with_their_parent(pid_repo: Path) -> None:
    cli = Cli(str(pid_repo), "--workers", "2")
    try:
        workers = pids_until(cli.port, 2)
        cli.proc.kill()  # SIGKILL: the parent cannot tell them
        cli.proc.wait()
        wait_for(lambda: not any(alive(p) for p in workers), "gone with their parent")
    finally:
        cli.kill()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, its parent gone and not yet reaped by init) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("extra, why", [
    (["--model-control-mode", "explicit"], "one worker only"),
    (["--http-unix", "/tmp/oi-workers-refused.sock"], "TCP ports only"),
    (["--trace-file", "/tmp/oi-workers-trace.json"], "the same file"),
    (["--trace-config", "triton,file=/tmp/oi-workers-trace.json"], "the same file"),
    (["--workers", "0"], "at least 1"),
])
def test_workers_refusals(extra: list[str], why: str) -> None:
    args = ["--workers", "2", *extra] if extra[0] != "--workers" else extra
    proc = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_merge_metrics_labels_every_sample_and_keeps_families_whole() -> None:
    a = '# HELP m_total a counter\n# TYPE m_total counter\nm_total{model="x"} 1\nplain 3\n'
    b = '# HELP m_total a counter\n# TYPE m_total counter\nm_total{model="x"} 2\n'
    merged = merge_metrics([(0, a), (1, b)])
    fams = {f.name: f for f in text_string_to_metric_families(merged)}
    assert [(s.labels, s.value) for s in fams["m"].samples] == [
        ({"worker": "0", "model": "x"}, 1.0), ({"worker": "1", "model": "x"}, 2.0)]
    assert merged.count("# TYPE m_total counter") == 1
    assert 'plain{worker="0"} 3' in merged


def test_serve_on_given_sockets() -> None:
    http = socket.create_server(("127.0.0.1", 0))
    grpc = socket.create_server(("127.0.0.1", 0))
    with openinfer.serve(sockets={"http": http, "grpc": grpc.fileno()}, metrics_port=0, log=False) as srv:
        http_port, grpc_port = http.getsockname()[1], grpc.getsockname()[1]
        http.close()  # the server listens on its own duplicates
        grpc.close()
        assert srv.http_port == http_port and srv.grpc_port == grpc_port
        assert requests.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=10).status_code == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.is_server_ready()
        client.close()
    assert port_is_closed(http_port)


def test_serve_refuses_sockets_it_cannot_serve(tmp_path: Path) -> None:
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    udp = socket.socket(type=socket.SOCK_DGRAM)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "s"))
    unix.listen()
    cases = [({"http": bound}, "not listening"), ({"http": udp}, "SOCK_DGRAM"), ({"http": unix}, "AF_UNIX"),
             ({"web": bound}, "expected the keys"), ({"http": 987654}, "not a socket")]
    running = len(openinfer.servers())
    for sockets, why in cases:
        with pytest.raises(ValueError, match=why):
            openinfer.serve(sockets=sockets, metrics_port=0, log=False)
    for s in (bound, udp, unix):
        s.close()
    assert len(openinfer.servers()) == running  # none was left half-started
