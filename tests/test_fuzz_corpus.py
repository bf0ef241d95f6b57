"""The seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) stay valid without
clang: every C target is built with the system compiler under AddressSanitizer and
UndefinedBehaviorSanitizer (`make fuzz-build FUZZ_MODE=replay`, -DOI_FUZZ_MAIN: a main() that
replays files instead of libFuzzer) and replays its whole corpus, regression inputs of fixed
bugs included; the Python targets (config.pbtxt, the load API) replay theirs with plain Python. `make fuzz` is
the real fuzzing run (clang, libFuzzer, atheris)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
OUT = ROOT / "build" / "fuzz" / "replay"
C_TARGETS = ["fuzz_json", "fuzz_pb_infer", "fuzz_pb_response", "fuzz_http1", "fuzz_grpc", "fuzz_shm_register",
             "fuzz_pbtext", "fuzz_tls", "fuzz_openai"]
PY_TARGETS = ["fuzz_config", "fuzz_load"]
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


def _clean_env() -> dict[str, str]:
    """This process's environment without a sanitizer run's preload and options: the
    compiler must not run under LeakSanitizer, and the targets link their own runtime."""
    drop = {"LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def replay_bins() -> Path:
    if shutil.which("cc") is None or shutil.which("make") is None or shutil.which("protoc-c") is None:
        pytest.skip("needs cc, make and protoc-c")
    cmd = ["make", "-s", "-j2", "fuzz-build", "FUZZ_MODE=replay", f"FUZZ_OUT={OUT}", f"FUZZ_TARGETS={' '.join(C_TARGETS)}"]
    r = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return OUT


def test_every_target_has_a_corpus() -> None:
    for target in [*C_TARGETS, *PY_TARGETS]:
        seeds = [p for p in (CORPUS / target).iterdir() if p.is_file()]
        assert len(seeds) >= 3, f"{target}: {len(seeds)} seeds"
        assert all(p.stat().st_size <= 64 * 1024 for p in seeds), f"{target}: keep seeds small"


@pytest.mark.parametrize("target", C_TARGETS)
def test_corpus_replays_clean(replay_bins: Path, target: str) -> None:
    seeds = sorted(str(p) for p in (CORPUS / target).iterdir() if p.is_file())
    r = subprocess.run([str(replay_bins / target), *seeds], cwd=ROOT, env={**_clean_env(), **SANITIZER_ENV},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    if target in ("fuzz_http1", "fuzz_grpc", "fuzz_shm_register"):  # the replay main counts
        assert f"replayed {len(seeds)} inputs" in r.stdout


@pytest.mark.parametrize("target", PY_TARGETS)
def test_python_corpus_replays_clean(target: str) -> None:
    seeds = [p for p in (CORPUS / target).iterdir() if p.is_file()]
    r = subprocess.run([sys.executable, f"tests/fuzz/{target}.py", "--replay", str(CORPUS / target)],
                       cwd=ROOT, env={**_clean_env(), "PYTHONPATH": str(ROOT / "python")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"replayed {len(seeds)} inputs" in r.stdout


@pytest.mark.parametrize("seed", ["hand-pipelined", "hand-pipelined-split1"])
def test_http1_replay_answers_like_a_server(replay_bins: Path, seed: str) -> None:
    """The HTTP/1.1 target really serves its input (a replay that answered nothing would pass
    every corpus run): a pipelined seed gets one answer per request, the inference included,
    written at once or a byte at a time."""
    r = subprocess.run([str(replay_bins / "fuzz_http1"), str(CORPUS / "fuzz_http1" / seed)], cwd=ROOT,
                       env={**_clean_env(), **SANITIZER_ENV, "OI_FUZZ_VERBOSE": "1"}, capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stderr.count(b"HTTP/1.1 200 OK") == 5, r.stderr[-4000:]
    assert b'"model_name":"simple"' in r.stderr


@pytest.mark.parametrize("seed", ["rec-grpc-infer-0", "rec-grpc-infer-0-split1"])
def test_grpc_replay_answers_like_a_server(replay_bins: Path, seed: str) -> None:
    """The gRPC target really serves its input: the recorded tritonclient inference gets a
    response message with the echoed tensor, then grpc-status 0 in the trailers."""
    hpack = pytest.importorskip("hpack")
    r = subprocess.run([str(replay_bins / "fuzz_grpc"), str(CORPUS / "fuzz_grpc" / seed)], cwd=ROOT,
                       env={**_clean_env(), **SANITIZER_ENV, "OI_FUZZ_VERBOSE": "1"}, capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    wire, decoder, data, headers = r.stderr, hpack.Decoder(), b"", []  # the server's side, as written
    while len(wire) >= 9:
        length, kind = int.from_bytes(wire[:3], "big"), wire[3]
        payload, wire = wire[9 : 9 + length], wire[9 + length :]
        if kind == 0:  # DATA
            data += payload
        elif kind == 1:  # HEADERS (no padding or priority from this server)
            headers.append(dict(decoder.decode(payload)))
    trailers = [h for h in headers if "grpc-status" in h]
    assert trailers and trailers[0]["grpc-status"] == "0", headers
    assert b"OUTPUT1" in data
