#!/usr/bin/env python3
"""OpenAI's API under aiperf: the example language models served by openinfer, profiled as an
LLM server is (time to first token, inter-token latency, throughput).

aiperf (NVIDIA's successor to genai-perf) lives in a virtual environment of its own (it pins
versions openinfer's tests do not want): `python3 -m venv /work/aiperf-venv &&
/work/aiperf-venv/bin/pip install aiperf`, or name its `aiperf` with --aiperf / $AIPERF. Each
model is run with BENCHMARKS.md's command line,

    aiperf profile -m MODEL --tokenizer examples/models/MODEL --endpoint-type chat --streaming
      --url localhost:PORT --concurrency 4 --request-count 40
      --synthetic-input-tokens-mean 32 --output-tokens-mean 16

against one `openinfer serve` of the example repository (toy_llm and tiny_llama loaded), the
server pinned to CPU 0 and aiperf to CPU 1, the models alternated round by round.

    .venv/bin/python benchmarks/openai_aiperf.py [--quick] [--rounds R] [--concurrency C]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "openai_aiperf"
MODELS = ("toy_llm", "tiny_llama")
# aiperf's metric tags in its JSON export, and how each is shown.
METRICS = (
    ("time_to_first_token", "TTFT p50 (ms)", "p50"),
    ("time_to_first_token", "TTFT p99 (ms)", "p99"),
    ("inter_token_latency", "inter-token p50 (ms)", "p50"),
    ("request_throughput", "requests/s", "avg"),
    ("output_token_throughput", "output tokens/s", "avg"),
    ("output_sequence_length", "output tokens / request", "avg"),
)


def find_aiperf(given: str | None) -> str:
    for candidate in (given, os.environ.get("AIPERF"), "/work/aiperf-venv/bin/aiperf"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("aiperf not found: install it in a venv of its own (see this file's docstring) or pass --aiperf")


def profile(aiperf: str, model: str, port: int, args: argparse.Namespace, out: Path) -> dict[str, dict]:
    """One aiperf run against `model`; its metrics by tag (aiperf's JSON export)."""
    argv = ["taskset", "-c", args.client_cpus, aiperf, "profile", "-m", model,
            "--tokenizer", str(C.REPO_ROOT / "examples" / "models" / model),
            "--endpoint-type", "chat", "--streaming", "--url", f"localhost:{port}",
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            "--warmup-request-count", str(args.concurrency),
            "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "16",
            "--use-server-token-count",  # the usage the server reports, not a re-tokenization
            "--artifact-dir", str(out), "--ui-type", "none"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    (out / "aiperf.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "aiperf.log").write_text(done.stdout + done.stderr)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        raise RuntimeError(f"aiperf failed ({done.returncode}); its log: {out / 'aiperf.log'}\n{done.stderr[-2000:]}")
    data = json.loads(exports[-1].read_text())
    records = data.get("records", data)
    return {tag: value for tag, value in records.items() if isinstance(value, dict)}


def cell(runs: list[dict[str, dict]], tag: str, stat: str) -> str:
    values = [r[tag][stat] for r in runs if tag in r and r[tag].get(stat) is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    spread = f" ({min(values):,.1f}–{max(values):,.1f})" if len(values) > 1 else ""
    return f"{med:,.1f}{spread}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of 16 requests")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--aiperf", help="the aiperf executable (default: $AIPERF, /work/aiperf-venv/bin/aiperf)")
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 16
    aiperf = find_aiperf(args.aiperf)
    C.check_cpus(args.server_cpus, args.client_cpus)
    tmp = C.make_tmpdir("openai-aiperf-")
    started, load0 = time.time(), C.loadavg()
    port = C.free_port()
    loads = [a for m in MODELS for a in ("--load-model", m)]
    server = C.openinfer_server(port, args.server_cpus, tmp / "server.log",
                                extra=["--model-control-mode", "explicit", *loads])  # fmt: skip
    runs: dict[str, list[dict[str, dict]]] = {m: [] for m in MODELS}
    problems: list[str] = []
    with server:
        for m in MODELS:
            C.wait_http_ready(f"http://127.0.0.1:{port}/v2/models/{m}/ready", timeout=300)
        for r in range(args.rounds):
            for m in MODELS if r % 2 == 0 else reversed(MODELS):
                try:
                    runs[m].append(profile(aiperf, m, port, args, tmp / f"{m}-{r}"))
                    print(f"[{NAME}] round {r} {m}: done", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    problems.append(f"{m} round {r}: {e}")
                    print(f"[{NAME}] round {r} {m}: failed: {e}", flush=True)
    version = C.tool_version([aiperf, "--version"])
    lines = C.report_header("OpenAI's API under aiperf: toy_llm and tiny_llama", args.quick, time.time() - started)
    lines += [
        f"aiperf `profile --endpoint-type chat --streaming`, concurrency {args.concurrency}, {args.requests} requests "
        f"(after {args.concurrency} warm-up), synthetic input 32 tokens, output 16 tokens asked, each model's own "
        f"tokenizer (`--tokenizer examples/models/MODEL`); medians of {args.rounds} round(s) (min–max), models "
        f"alternated. One `openinfer serve` (both models loaded, one event-loop thread) pinned to CPU "
        f"{args.server_cpus}, aiperf to CPU {args.client_cpus}.",
        "",
        C.markdown_table(["model", *(label for _, label, _ in METRICS)],
                         [[m, *(cell(runs[m], tag, stat) for tag, _, stat in METRICS)] for m in MODELS]),
        "",
        C.machine_line((load0, C.loadavg()), [f"aiperf {version}"]),
        "- toy_llm: deterministic, a byte per token, ends at a sentence's end (so fewer than 16 tokens); "
        "tiny_llama: the 2-layer Llama of `openinfer._examples.tiny_llama` (random weights) on transformers, "
        "one instance, a KV cache per request, requests one after the other.",
        "",
        *C.problems_section(problems),
    ]
    C.write_report(NAME, C.REPO_ROOT / "benchmarks" / "results", lines, NAME)


if __name__ == "__main__":
    main()
