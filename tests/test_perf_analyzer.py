"""Triton's load generator, perf_analyzer (the binary in the tritonclient wheel), against
openinfer in each of its modes: a short measurement each, which must end with a throughput and
no request error. Skipped with the reason when the binary cannot run here (it needs Debian's
libb64-0d and libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, which `make test`
installs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Cli, wait_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
MODELS = ("simple", "simple_string", "simple_sequence", "simple_dyna_sequence")


def _perf_analyzer() -> tuple[list[str], dict[str, str]]:
    """The command and environment that run perf_analyzer, or a skip saying why not."""
    exe = Path(sys.executable).parent / "perf_analyzer"
    if not exe.is_file():
        found = shutil.which("perf_analyzer")
        if found is None:
            pytest.skip("no perf_analyzer binary (it comes with the tritonclient wheel)")
        exe = Path(found)
    from openinfer._torch_build import child_environment

    env = child_environment()  # no sanitizer runtime preloaded into Triton's binary (make test-asan)
    try:
        import nvidia.cuda_runtime  # libcudart.so.12, which perf_analyzer links even on a CPU machine

        lib = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    except ImportError:
        pass
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"perf_analyzer cannot run here: {(r.stdout + r.stderr).strip()[-400:]}")
    return [str(exe)], env


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The example models perf_analyzer is pointed at, served by `openinfer serve` in a process of
    its own with HTTP, gRPC and metrics on free ports."""
    repo = tmp_path_factory.mktemp("pa-repo")
    for name in MODELS:
        shutil.copytree(EXAMPLES / name, repo / name)
    # with --http-port 0, gRPC and metrics take free ports too; client shared memory is off by
    # default on the command line, as in tritonserver, and perf_analyzer --shared-memory needs it
    cli = Cli(str(repo), "--allow-client-shm=true")
    try:
        wait_for(lambda: "metrics at" in cli.output(), "the server's metrics line")
        text = cli.output()
        grpc = re.search(r"grpc://127\.0\.0\.1:(\d+)", text)
        metrics = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", text)
        assert grpc and metrics and cli.port, text
        yield {"http": f"127.0.0.1:{cli.port}", "grpc": f"127.0.0.1:{grpc.group(1)}",
               "metrics": f"127.0.0.1:{metrics.group(1)}/metrics"}
    finally:
        cli.kill()


def run(served: dict[str, str], protocol: str, *args: str) -> str:
    cmd, env = _perf_analyzer()
    # Windows of a fixed request count, and any two taken as stable: a check that every mode
    # works end to end, not a measurement (benchmarks/ measures).
    argv = [*cmd, "-u", served[protocol], "-i", protocol, "--measurement-mode", "count_windows",
            "--measurement-request-count", "40", "--stability-percentage", "1000", "--max-trials", "10", *args]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(argv)}\n{out[-3000:]}"
    assert "Throughput:" in out and "error" not in out.lower().replace("warning", ""), out[-3000:]
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", [[], ["-a"], ["--shared-memory", "system"], ["--request-rate-range", "200"],
                                  ["--concurrency-range", "4"]], ids=["sync", "async", "shm", "rate", "c4"])
def test_simple(served: dict[str, str], protocol: str, mode: list[str]) -> None:
    run(served, protocol, "-m", "simple", *mode)


@pytest.mark.parametrize("model", ["simple_sequence", "simple_dyna_sequence"])
@pytest.mark.parametrize("mode", [["-i", "http"], ["-i", "grpc"], ["-i", "grpc", "--streaming"]],
                         ids=["http", "grpc", "stream"])
def test_sequences(served: dict[str, str], model: str, mode: list[str]) -> None:
    protocol = mode[1]
    run(served, protocol, "-m", model, "--sequence-length", "5", *mode[2:])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_data_from_a_json_file(served: dict[str, str], protocol: str, tmp_path: Path) -> None:
    """simple_string reads its strings as integers: perf_analyzer's --input-data gives them."""
    data = {"data": [{"INPUT0": [str(i) for i in range(16)], "INPUT1": ["1"] * 16}]}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data))
    run(served, protocol, "-m", "simple_string", "--input-data", str(path))


def test_metrics_collection(served: dict[str, str]) -> None:
    out = run(served, "http", "-m", "simple", "--collect-metrics", "--metrics-url", served["metrics"],
              "--metrics-interval", "100")
    assert "Failed to" not in out, out[-3000:]
