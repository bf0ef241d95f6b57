"""The access log (serve(access_log=...), --access-log): one line per answered request over
HTTP (tritonclient.http, raw sockets) and gRPC (tritonclient.grpc), errors included, with the
fields checked against what each request sent and got; lines dropped and counted, never
waited for, while the writer is stuck on a pipe nobody reads."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) (?P<peer>\S+) (?P<proto>HTTP/1\.1|gRPC) "
    r"(?P<method>\S+) (?P<target>\S+) (?P<version>\S+) (?P<status>\d+) (?P<bytes_in>\d+) "
    r"(?P<bytes_out>\d+) (?P<us>\d+)us$"
)


def _echo(inputs: dict) -> dict:
    return {"OUTPUT0": inputs["INPUT0"]}


def _refuse(inputs: dict) -> dict:
    raise ValueError("refused on purpose")


SPEC = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
MODELS = [Model("echo", _echo, **SPEC), Model("refuse", _refuse, **SPEC)]


def _lines(path: Path) -> list[dict[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        assert m, f"not an access log line: {line!r}"
        out.append(m.groupdict())
    return out


def _http_input() -> httpclient.InferInput:
    i = httpclient.InferInput("INPUT0", [4], "INT32")
    i.set_data_from_numpy(np.arange(4, dtype=np.int32), binary_data=False)
    return i


def _grpc_input() -> grpcclient.InferInput:
    i = grpcclient.InferInput("INPUT0", [4], "INT32")
    i.set_data_from_numpy(np.arange(4, dtype=np.int32))
    return i


def test_http_and_grpc_lines(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    with openinfer.serve(models=MODELS, http_port=0, log=False, access_log=path) as s:
        h = httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        h.infer("echo", [_http_input()])
        with pytest.raises(InferenceServerException):
            h.infer("refuse", [_http_input()])
        with pytest.raises(InferenceServerException):
            h.get_model_metadata("missing")
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        g.infer("echo", [_grpc_input()], model_version="1")
        with pytest.raises(InferenceServerException):
            g.infer("refuse", [_grpc_input()])
        with pytest.raises(InferenceServerException):
            g.get_model_metadata("missing", "7")
        assert g.is_server_live()
        # a raw request with a known size in and out
        with socket.create_connection(("127.0.0.1", s.http_port), timeout=10) as sock:
            head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall(head)
            assert b'{"live":true}' in sock.recv(4096)
    after = datetime.now(timezone.utc) + timedelta(seconds=1)
    lines = _lines(path)
    assert len(lines) == 8
    for line in lines:
        assert line["peer"] == "127.0.0.1"
        when = datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        assert before <= when <= after
    assert [line["time"] for line in lines] == sorted(line["time"] for line in lines)
    ok, refused, missing, gok, grefused, gmissing, live, raw = lines
    assert (ok["proto"], ok["method"], ok["target"], ok["version"], ok["status"]) == (
        "HTTP/1.1", "POST", "/v2/models/echo/infer", "-", "200")
    assert int(ok["bytes_in"]) > int(ok["bytes_out"]) > 0
    assert (refused["target"], refused["status"]) == ("/v2/models/refuse/infer", "500")
    assert (missing["method"], missing["target"], missing["status"]) == ("GET", "/v2/models/missing", "404")
    assert (gok["proto"], gok["method"], gok["target"], gok["version"], gok["status"]) == (
        "gRPC", "ModelInfer", "echo", "1", "0")
    assert int(gok["bytes_in"]) > 0 and int(gok["bytes_out"]) > 0
    assert (grefused["method"], grefused["target"], grefused["status"]) == ("ModelInfer", "refuse", "13")
    assert grefused["bytes_out"] == "0"
    assert (gmissing["method"], gmissing["target"], gmissing["version"], gmissing["status"]) == (
        "ModelMetadata", "missing", "7", "5")
    assert (live["method"], live["target"], live["status"]) == ("ServerLive", "-", "0")
    assert (raw["method"], raw["target"], raw["status"]) == ("GET", "/v2/health/live", "200")
    assert raw["bytes_in"] == str(len(b"/v2/health/liveHostx"))  # what the parser counts
    assert raw["bytes_out"] == str(len(b'{"live":true}'))


def test_refused_requests_and_forged_names(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    with openinfer.serve(models=MODELS, http_port=0, log=False, access_log=path) as s:
        # refused by the transport itself (a bad byte in the path): still one line, a 400
        with socket.create_connection(("127.0.0.1", s.http_port), timeout=10) as sock:
            sock.sendall(b"GET /v2/models/a\x7f/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 400 ")
        # a gRPC model name may hold spaces and newlines: it must not forge a line or a field
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        with pytest.raises(InferenceServerException):
            g.get_model_metadata("a b\n2026-01-01T00:00:00.000000Z 6.6.6.6 gRPC x y z 0 1 1 1us")
    refused, forged = _lines(path)
    # the request line broke before its path was read: neither is known
    assert (refused["method"], refused["target"], refused["status"]) == ("-", "-", "400")
    assert forged["target"].startswith("a?b?2026-01-01T00:00:00.000000Z?6.6.6.6?gRPC")
    assert (forged["method"], forged["status"]) == ("ModelMetadata", "5")


def test_off_by_default_and_bad_path(tmp_path: Path) -> None:
    with openinfer.serve(models=MODELS, http_port=0, log=False) as s:
        assert s._core is not None  # nothing to write: no access log exists
    with pytest.raises(OSError, match="cannot open the access log"):
        openinfer.serve(models=MODELS, http_port=0, log=False, access_log=tmp_path / "no" / "such" / "dir.log")


def test_stdout(tmp_path: Path) -> None:
    script = (
        "import openinfer, urllib.request\n"
        "with openinfer.serve(http_port=0, grpc_port=None, metrics_port=None, log=False, access_log='-') as s:\n"
        "    urllib.request.urlopen(f'http://127.0.0.1:{s.http_port}/v2/health/ready').read()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    (line,) = [m.groupdict() for m in map(LINE.match, out.stdout.splitlines()) if m]
    assert (line["method"], line["target"], line["status"]) == ("GET", "/v2/health/ready", "200")


def test_stuck_writer_drops_instead_of_blocking(tmp_path: Path) -> None:
    """The log is a FIFO nobody reads until the end: the writer blocks once the pipe is full,
    the queue fills, and requests are still answered, their lines dropped and counted."""
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the server's open complete
    requests_sent = 6000
    try:
        with openinfer.serve(models=MODELS, http_port=0, grpc_port=None, metrics_port=None, log=False,
                             access_log=fifo) as s:
            with socket.create_connection(("127.0.0.1", s.http_port), timeout=60) as sock:
                one = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                sender = threading.Thread(target=sock.sendall, args=(one * requests_sent,))
                sender.start()
                got = b""
                while got.count(b'{"live":true}') < requests_sent:
                    chunk = sock.recv(1 << 20)
                    assert chunk, "the server closed the connection"
                    got += chunk
                sender.join()
            # every request was answered while the writer was stuck; now let it go
            data = b""
            os.set_blocking(reader, True)
            stop = threading.Thread(target=s.stop, args=(10,))
            stop.start()
            while chunk := os.read(reader, 1 << 20):
                data += chunk
            stop.join()
    finally:
        os.close(reader)
    text = data.decode()
    written = [line for line in text.splitlines() if LINE.match(line)]
    notes = re.findall(r"^# access log: (\d+) lines dropped so far \(the writer fell behind\)$", text, re.M)
    assert notes, "no drop was noted"
    dropped = int(notes[-1])
    assert dropped > 0
    assert len(written) + dropped == requests_sent
