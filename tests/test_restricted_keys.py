"""Restricted-API keys off the command line (issue 38, point 7): `openinfer serve` takes the
--http-restricted-api and --grpc-restricted-protocol entries from a file
(--http-restricted-api-file, --grpc-restricted-protocol-file) or from the environment
(OPENINFER_HTTP_RESTRICTED_API, OPENINFER_GRPC_RESTRICTED_PROTOCOL); the key is then nowhere in
the server's /proc/PID/cmdline, which every local user can read, and it guards the API as the
flag's does: a wrong key is refused, the right one accepted, over HTTP and gRPC."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from conftest import Cli, python_model

BOUND = 60.0  # seconds: a bound for a hung test, not a measurement
HTTP_KEY = "s3cret-http-4f9a1c"
GRPC_KEY = "s3cret-grpc-77d2e0"
ADDS = "def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0'] + 1}\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    python_model(root, "add", ADDS)
    return root


def _serve(repo: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[tuple[Cli, str]]:
    cli = Cli(str(repo), "--grpc-port", "0", "--metrics-port", "0", *args, env=env)
    try:
        m = re.search(r"grpc://127\.0\.0\.1:(\d+)", cli.output())
        assert m, cli.output()
        yield cli, f"127.0.0.1:{m.group(1)}"
    finally:
        cli.kill()


@pytest.fixture(params=["file", "env"])
def served(request: pytest.FixtureRequest, repo: Path, tmp_path: Path) -> Iterator[tuple[Cli, str]]:
    http = f"model-repository,inference:admin-key={HTTP_KEY}"
    grpc = f"model-repository:admin-key={GRPC_KEY}"
    if request.param == "file":
        keys = tmp_path / "keys"
        keys.mkdir(mode=0o700)
        (keys / "http").write_text(f"# the admin key\n\n{http}\n")
        (keys / "grpc").write_text(grpc + "\n")
        yield from _serve(repo, "--http-restricted-api-file", str(keys / "http"),
                          "--grpc-restricted-protocol-file", str(keys / "grpc"))
    else:
        env = {**os.environ, "OPENINFER_HTTP_RESTRICTED_API": http, "OPENINFER_GRPC_RESTRICTED_PROTOCOL": grpc}
        yield from _serve(repo, env=env)


def test_a_key_from_a_file_or_the_environment_guards_the_api_and_stays_off_the_command_line(
    served: tuple[Cli, str],
) -> None:
    cli, grpc_url = served
    cmdline = Path(f"/proc/{cli.proc.pid}/cmdline").read_bytes()
    assert b"openinfer" in cmdline and HTTP_KEY.encode() not in cmdline and GRPC_KEY.encode() not in cmdline
    url = f"http://127.0.0.1:{cli.port}"
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    for key, status in ((None, 403), ("wrong", 403), (HTTP_KEY, 200)):
        headers = {"admin-key": key} if key else {}
        r = requests.post(f"{url}/v2/repository/index", headers=headers, timeout=BOUND)
        assert r.status_code == status, (key, r.text)
        r = requests.post(f"{url}/v2/models/add/infer", json=body, headers=headers, timeout=BOUND)
        assert r.status_code == status, (key, r.text)
    assert r.json()["outputs"][0]["data"] == [2]
    assert requests.get(f"{url}/v2/health/ready", timeout=BOUND).status_code == 200  # not restricted
    client = tgrpc.InferenceServerClient(grpc_url)
    for key in (None, "wrong"):
        with pytest.raises(InferenceServerException, match="This protocol is restricted, expecting header "
                                                           "'triton-grpc-protocol-admin-key'"):
            client.get_model_repository_index(headers={"triton-grpc-protocol-admin-key": key} if key else None)
    index = client.get_model_repository_index(headers={"triton-grpc-protocol-admin-key": GRPC_KEY}, as_json=True)
    assert [m["name"] for m in index["models"]] == ["add"]


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ("missing", "--http-restricted-api-file {tmp}/missing: cannot read it: No such file or directory"),
        (f"model-repository admin-key {HTTP_KEY}", "--http-restricted-api option format is "
                                                   "'<config name>:<setting>=<value>'. Got <hidden>"),
        (f"model-repository:admin-key {HTTP_KEY}", "--http-restricted-api option format is "
                                                   "'<config name>:<setting>=<value>'. Got model-repository:<hidden>"),
        (f"no-such-group:admin-key={HTTP_KEY}", "unknown restricted api 'no-such-group'"),
    ],
    ids=["unreadable", "no-colon", "no-equals", "unknown-group"],
)
def test_a_bad_key_file_is_an_error_that_never_shows_the_key(
    repo: Path, tmp_path: Path, given: str, error: str
) -> None:
    path = tmp_path / "missing"
    if given != "missing":
        path = tmp_path / "keys"
        path.write_text(given + "\n")
    argv = [sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--http-restricted-api-file", str(path),
            str(repo)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 1, done.stderr
    assert f"openinfer: error: {error.format(tmp=tmp_path)}" in done.stderr
    assert HTTP_KEY not in done.stderr + done.stdout
