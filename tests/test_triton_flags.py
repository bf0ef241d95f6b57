"""`openinfer serve` with tritonserver's command-line flags (issue 33, items 6 and 9): the flags
openinfer honours, with tritonserver's meaning, seen through tritonclient HTTP and gRPC; the
flags it cannot honour refused by name; and a body near the limit that --http-max-input-size
raises, served without a second copy."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor

from conftest import Cli

# Every flag of tritonserver's src/command_line_parser.cc (triton-inference-server/server e1db8a6).
TRITONSERVER_FLAGS = """help id exit-timeout-secs model-store model-repository exit-on-error disable-auto-complete-config
strict-readiness model-control-mode repository-poll-secs load-model model-config-name model-load-thread-count
model-load-retry-count model-namespacing enable-peer-access allow-http http-address http-port reuse-http-port
http-header-forward-pattern http-thread-count http-max-input-size http-restricted-api allow-grpc grpc-address
grpc-port reuse-grpc-port grpc-header-forward-pattern grpc-infer-thread-count grpc-infer-allocation-pool-size
grpc-max-response-pool-size grpc-use-ssl grpc-use-ssl-mutual grpc-server-cert grpc-server-key grpc-root-cert
grpc-infer-response-compression-level grpc-keepalive-time grpc-keepalive-timeout grpc-keepalive-permit-without-calls
grpc-http2-max-pings-without-data grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes
grpc-max-connection-age grpc-max-connection-age-grace grpc-restricted-protocol log-verbose log-info log-warning
log-error log-format log-file allow-sagemaker sagemaker-port sagemaker-safe-port-range sagemaker-thread-count
allow-vertex-ai vertex-ai-port vertex-ai-thread-count vertex-ai-default-model allow-metrics allow-gpu-metrics
allow-cpu-metrics metrics-address metrics-port metrics-interval-ms metrics-config trace-config cache-config
cache-directory rate-limit rate-limit-resource pinned-memory-pool-byte-size cuda-memory-pool-byte-size
cuda-virtual-address-size min-supported-compute-capability buffer-manager-thread-count host-policy
model-load-gpu-limit allow-client-shm backend-directory backend-config repoagent-directory strict-model-config
response-cache-byte-size trace-file trace-level trace-rate trace-count trace-log-frequency""".split()

IDENTITY = """name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ -1 ] }} ]
"""


def _repo(tmp_path: Path, broken: bool = False, dtype: str = "TYPE_FP32") -> Path:
    repo = tmp_path / "repo"
    (repo / "good" / "1").mkdir(parents=True)
    (repo / "good" / "config.pbtxt").write_text(IDENTITY.format(name="good", dtype=dtype))
    if broken:  # a model that fails to load: not ready
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "no-such-backend"\n')
    return repo


def _grpc_port(cli: Cli) -> int:
    m = re.search(r"grpc://127\.0\.0\.1:(\d+)", cli.output())
    assert m, cli.output()
    return int(m.group(1))


def _serve_args(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", *args],
                          capture_output=True, text=True, timeout=60)


def test_tritonserver_flags_as_tritonserver_means_them(tmp_path: Path) -> None:
    """--model-repository, --strict-readiness=false, --id, --http/--grpc-address,
    --http-thread-count, --exit-timeout-secs: a broken model leaves the server ready, and the
    server's metadata carries the id, over HTTP and gRPC."""
    repo = _repo(tmp_path, broken=True)
    cli = Cli("--model-repository", str(repo), "--strict-readiness=false", "--id", "my-triton",
              "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--grpc-port", "0",
              "--metrics-port", "0", "--http-thread-count", "1", "--exit-timeout-secs", "5",
              "--exit-on-error=false")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}")
        assert http.is_server_ready() and grpc.is_server_ready()
        assert http.is_model_ready("good") and not http.is_model_ready("broken")
        assert http.get_server_metadata()["name"] == "my-triton"
        assert grpc.get_server_metadata().name == "my-triton"
        data = np.arange(4, dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(data)
        assert (http.infer("good", [inp]).as_numpy("OUTPUT0") == data).all()
    finally:
        cli.kill()


def test_strict_readiness_is_the_default(tmp_path: Path) -> None:
    """tritonserver's default (and --strict-readiness=true): not ready while a model is not."""
    cli = Cli(str(_repo(tmp_path, broken=True)), "--grpc-port", "0", "--metrics-port", "0",
              "--strict-readiness", "true")
    try:
        assert not httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}").is_server_ready()
        assert not grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}").is_server_ready()
        cli.proc.send_signal(signal.SIGTERM)
        rc, out = cli.wait()
        assert rc == 0 and "model broken version 1 failed to load" in out, out  # logged without --log-warning=false
    finally:
        cli.kill()


def test_exit_on_error_exits_when_a_model_fails(tmp_path: Path) -> None:
    done = _serve_args("--model-repository", str(_repo(tmp_path, broken=True)), "--grpc-port", "0",
                       "--metrics-port", "0", "--exit-on-error=true")
    assert done.returncode == 1, done.stderr
    assert "--exit-on-error: model(s) failed to load: broken" in done.stderr


def test_allow_grpc_false_serves_no_grpc(tmp_path: Path) -> None:
    cli = Cli(str(_repo(tmp_path)), "--allow-grpc=false", "--metrics-port", "0")
    try:
        assert "grpc://" not in cli.output()
        assert httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}").is_server_live()
    finally:
        cli.kill()


def test_allow_http_false_serves_http_on_the_unix_socket_only(tmp_path: Path) -> None:
    sock = tmp_path / "oi.sock"
    cli = Cli(str(_repo(tmp_path)), "--allow-http=false", "--http-unix", str(sock), "--grpc-port", "0",
              "--metrics-port", "0")
    try:
        out = cli.output()
        assert f"unix://{sock}" in out and "http://127.0.0.1" not in out, out
        assert grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}").is_server_live()
    finally:
        cli.kill()


def test_log_warning_false_drops_warnings_only(tmp_path: Path) -> None:
    """tritonserver turns each level off on its own: info lines stay, warnings go."""
    cli = Cli(str(_repo(tmp_path, broken=True)), "--grpc-port", "0", "--metrics-port", "0",
              "--log-warning=false")
    try:
        assert httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}").is_server_live()
        cli.proc.send_signal(signal.SIGTERM)  # the whole log, once it has stopped
        rc, out = cli.wait()
        assert rc == 0, out
        assert "listening on" in out and "model good version 1 ready" in out
        assert "failed to load" not in out and "WARNING" not in out
    finally:
        cli.kill()


def test_model_repository_repeated_serves_each_and_not_a_model_two_have(tmp_path: Path) -> None:
    """--model-repository given twice: the models of both are served; one that both have is
    served from neither, with tritonserver's reason in the repository index."""
    a, b = tmp_path / "a", tmp_path / "b"
    for repo, names in ((a, ("first", "twice")), (b, ("second", "twice"))):
        for name in names:
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(IDENTITY.format(name=name, dtype="TYPE_FP32"))
    cli = Cli("--model-repository", str(a), "--model-repository", str(b), "--grpc-port", "0",
              "--metrics-port", "0")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(cli)}")
        assert http.is_model_ready("first") and grpc.is_model_ready("second")
        assert not http.is_model_ready("twice") and not grpc.is_model_ready("twice")
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert set(index) == {"first", "second", "twice"}
        assert index["twice"]["state"] == "UNAVAILABLE"
        assert index["twice"]["reason"] == "failed to poll model 'twice': not unique across all model repositories"
    finally:
        cli.kill()


def test_every_tritonserver_flag_is_served_or_refused_and_in_the_docs_table() -> None:
    """No flag of tritonserver's falls through as argparse's generic "unrecognized arguments",
    and docs/features.md's table says for each whether it is served."""
    from openinfer import cli

    serve = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    known = {o for a in serve._actions for o in a.option_strings}
    assert [f for f in TRITONSERVER_FLAGS if "--" + f not in known] == []
    table = (Path(__file__).parent.parent / "docs" / "features.md").read_text().split(
        "## tritonserver's command-line flags")[1]
    assert [f for f in TRITONSERVER_FLAGS if f"`--{f}" not in table] == []


@pytest.mark.parametrize("args, words", [
    (["--pinned-memory-pool-byte-size=0"],
     "tritonserver's --pinned-memory-pool-byte-size is not supported by openinfer: openinfer keeps no pinned "
     "memory pool"),
    (["--backend-config=python,shm-default-byte-size=1048576"],
     "tritonserver's --backend-config is not supported by openinfer: openinfer's backends take no backend "
     "settings"),
    (["--http-header-forward-pattern", "x-("],
     "http_header_forward_pattern x-( is not a regular expression openinfer takes"),
    (["--strict-model-config=true"], "tritonserver's --strict-model-config true is not supported by openinfer"),
    (["--http-max-input-size=0"], "Error: --http-max-input-size must be greater than 0."),
    (["--model-repository", "/no/such/repository"], "model repository '/no/such/repository' is not a directory"),
    (["--allow-http=false"], "--allow-http false needs --http-unix PATH"),
])
def test_flags_openinfer_cannot_honour_are_refused_by_name(args: list[str], words: str) -> None:
    done = _serve_args(*args)
    assert done.returncode in (1, 2), done.stderr
    assert words in done.stderr


def test_http_max_input_size_sets_the_limit_and_the_error_names_it(tmp_path: Path) -> None:
    """Item 9: the limit applies as tritonserver applies it (to JSON, not to binary tensor data
    after a JSON header) and is said the way tritonserver says it, naming the flag."""
    cli = Cli(str(_repo(tmp_path)), "--grpc-port", "0", "--metrics-port", "0", "--http-max-input-size", "4096")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        small = httpclient.InferInput("INPUT0", [16], "FP32")
        small.set_data_from_numpy(np.ones(16, np.float32))
        assert http.infer("good", [small]).as_numpy("OUTPUT0").sum() == 16
        big = httpclient.InferInput("INPUT0", [2048], "FP32")
        big.set_data_from_numpy(np.ones(2048, np.float32))  # 8 KiB in binary: served
        assert http.infer("good", [big]).as_numpy("OUTPUT0").sum() == 2048
        big.set_data_from_numpy(np.ones(2048, np.float32), binary_data=False)
        with pytest.raises(InferenceServerException) as e:
            http.infer("good", [big])
        size = re.search(r"request JSON size of (\d+) bytes", str(e.value))
        assert size and int(size.group(1)) > 4096, str(e.value)
        assert (f"request JSON size of {size.group(1)} bytes exceeds the maximum allowed input size of 4096 bytes. "
                "Use --http-max-input-size to increase the limit.") in str(e.value)
    finally:
        cli.kill()


def _echo_parameters(inputs: dict[str, np.ndarray], parameters: dict[str, object]) -> dict[str, np.ndarray]:
    return {"PARAMS": np.array([json.dumps(parameters, sort_keys=True).encode()], dtype=object)}


ECHO = Model("echo", _echo_parameters, inputs=[Tensor("X", "INT32", [1])], outputs=[Tensor("PARAMS", "BYTES", [1])])


def test_header_forward_patterns_give_matching_headers_to_the_model_as_parameters() -> None:
    """--http-header-forward-pattern / --grpc-header-forward-pattern: headers (metadata) whose
    names match, case-insensitively, reach the model as string parameters, after the request's
    own; others do not; a name tritonserver reserves is refused in its words."""
    with openinfer.serve(models=[ECHO], http_port=0, grpc_port=0, log=False, http_header_forward_pattern="^x-",
                         grpc_header_forward_pattern="^(x-|triton_)") as srv:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        hin = httpclient.InferInput("X", [1], "INT32")
        hin.set_data_from_numpy(np.array([1], np.int32))
        got = http.infer("echo", [hin], headers={"X-Team": "blue", "Y-Other": "no"}, parameters={"p": 1})
        assert json.loads(got.as_numpy("PARAMS")[0]) == {"x-team": "blue", "p": 1}  # its client lower-cases names
        got = http.infer("echo", [hin])
        assert json.loads(got.as_numpy("PARAMS")[0]) == {}
        gin = grpcclient.InferInput("X", [1], "INT32")
        gin.set_data_from_numpy(np.array([1], np.int32))
        got = grpc.infer("echo", [gin], headers={"x-team": "green", "y-other": "no"})
        assert json.loads(got.as_numpy("PARAMS")[0]) == {"x-team": "green"}
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("echo", [gin], headers={"triton_x": "1"})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == "Header 'triton_x' is reserved for Triton usage and cannot be forwarded."
    with openinfer.serve(models=[ECHO], http_port=0, grpc_port=None, log=False,
                         http_header_forward_pattern="priority|^x-") as srv:
        r = requests.post(f"{srv.url}/v2/models/echo/infer", headers={"priority": "1"}, timeout=10,
                          json={"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
        assert r.status_code == 400
        assert r.json() == {"error": "Header 'priority' is reserved for Triton usage and cannot be forwarded."}


def test_a_restricted_api_key_is_never_forwarded_to_the_model() -> None:
    """A forward pattern that matches the header carrying a restricted API's key passes the
    other headers on, never the key (tritonserver would hand the secret to the model)."""
    with openinfer.serve(models=[ECHO], http_port=0, grpc_port=0, log=False, http_header_forward_pattern="^x-",
                         grpc_header_forward_pattern="^x-", http_restricted_api=["inference:x-key=s3cret"],
                         grpc_restricted_protocol=["inference:x-key=s3cret"]) as srv:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
        hin = httpclient.InferInput("X", [1], "INT32")
        hin.set_data_from_numpy(np.array([1], np.int32))
        got = http.infer("echo", [hin], headers={"x-key": "s3cret", "x-team": "blue"})
        assert json.loads(got.as_numpy("PARAMS")[0]) == {"x-team": "blue"}
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        gin = grpcclient.InferInput("X", [1], "INT32")
        gin.set_data_from_numpy(np.array([1], np.int32))
        got = grpc.infer("echo", [gin], headers={"triton-grpc-protocol-x-key": "s3cret", "x-team": "green"})
        assert json.loads(got.as_numpy("PARAMS")[0]) == {"x-team": "green"}


def _vm(pid: int, key: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(key + r":\s+(\d+)", text)
    assert m
    return int(m.group(1)) << 10


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("OPENINFER_BIG_TESTS") != "1",
                    reason="moves 2.5 GiB through loopback and holds ~4 GiB (~15 s): set OPENINFER_BIG_TESTS=1")
def test_a_body_past_1_gib_is_served_with_one_copy(tmp_path: Path) -> None:
    """Item 9: a 1.25 GiB tensor (past the 1 GiB default, so only with --http-max-input-size)
    goes in and comes back through the identity model; the server's peak RSS grows by about
    the payload once, not twice (the body is the tensor, the response views it)."""
    n = (5 << 30) // 4  # 1.25 GiB of INT8
    cli = Cli(str(_repo(tmp_path, dtype="TYPE_INT8")), "--grpc-port", "0", "--metrics-port", "0",
              "--http-max-input-size", str(2 << 30))
    try:
        base = _vm(cli.proc.pid, "VmHWM")
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "INT8",
                                         "parameters": {"binary_data_size": n}}],
                             "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
        payload = np.zeros(n, dtype=np.int8)
        payload[::4096] = 7
        with socket.create_connection(("127.0.0.1", cli.port), timeout=120) as s:
            s.sendall(b"POST /v2/models/good/infer HTTP/1.1\r\nHost: x\r\n"
                      b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                      % (len(header), len(header) + n))
            s.sendall(header)
            s.sendall(memoryview(payload))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                assert chunk, head
                head += chunk
            status_line, _, rest = head.partition(b"\r\n")
            assert b" 200 " in status_line, head[:2000]
            headers, _, got = rest.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", headers).group(1))
            json_len = int(re.search(rb"(?i)inference-header-content-length: (\d+)", headers).group(1))
            body = bytearray(length)
            view = memoryview(body)
            view[:len(got)] = got
            pos = len(got)
            while pos < length:
                k = s.recv_into(view[pos:], min(length - pos, 1 << 24))
                assert k, pos
                pos += k
        out = json.loads(bytes(body[:json_len]))["outputs"][0]
        assert out["shape"] == [n] and out["parameters"]["binary_data_size"] == n
        tail = np.frombuffer(body, dtype=np.int8, offset=json_len)
        assert int(tail[::4096].sum()) == 7 * len(range(0, n, 4096)) and int(tail.sum()) == int(payload.sum())
        growth = _vm(cli.proc.pid, "VmHWM") - base
        print(f"server peak RSS growth: {growth / n:.2f}x the {n} byte payload")
        assert growth < 1.5 * n, f"peak RSS grew by {growth / n:.2f}x the payload"
    finally:
        cli.kill()
