#!/usr/bin/env python3
"""S12: the example MLP as an ONNX model (examples/models/mlp_onnx, ONNX Runtime through its C
API) beside the same network as TorchScript (examples/models/mlp, S6's model), each served
over HTTP with the binary tensor extension and each against its own in-process limit: the
file run directly (``InferenceSession.run`` with one intra-op thread; ``module(x)`` under
torch.inference_mode with one thread) on the same core.

    .venv/bin/python benchmarks/s12_onnx.py [--quick] [--rounds N] [--duration S] [--device cuda]

With --device cuda (onnxruntime-gpu) both models are instances on GPU 0 (KIND_GPU: ONNX
Runtime's CUDA execution provider) and the in-process calls take host arrays and return host
arrays, as the server must; results go to s12_onnx_cuda.*.

Per runtime, side by side in each round:
  * overhead: wrk with one connection sends batch-1 requests; the p50 latency minus the p50
    of the in-process call on the same batch-1 input is the serving overhead (target for
    ONNX: <= 100 µs).
  * dynamic batching: wrk with --connections batch-1 requests to the model with
    dynamic_batching (max_batch_size = --max-batch); rows/s against the in-process
    throughput on batches of max_batch_size rows (the largest batch the server can form, so
    the share is a lower bound).
The server (`openinfer serve`, one loop thread, one instance per model) and the in-process
runs are pinned to --server-cpu, wrk to --client-cpu. Results: benchmarks/results/s12_onnx.md
and .csv (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s6_torchscript as S6  # noqa: E402

NAME = "s12_onnx"
EXAMPLES = C.REPO_ROOT / "examples" / "models"
RUNTIMES = {"onnx": "mlp_onnx", "torchscript": "mlp"}  # runtime -> example model


def onnx_config(name: str, max_batch: int, batching: bool, device: str) -> str:
    text = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
    text += 'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    text += 'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    kind = "KIND_GPU gpus: [ 0 ]" if device == "cuda" else "KIND_CPU"
    text += f"instance_group [ {{ count: 1 kind: {kind} }} ]\n"
    text += 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
    text += 'parameters { key: "inter_op_thread_count" value: { string_value: "1" } }\n'
    if batching:
        text += "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    return text


def make_repo(path: Path, max_batch: int, device: str) -> None:
    for name, batching in (("mlp_onnx", False), ("mlp_onnx_batched", True)):
        (path / name / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / "mlp_onnx" / "1" / "model.onnx", path / name / "1" / "model.onnx")
        (path / name / "config.pbtxt").write_text(onnx_config(name, max_batch, batching, device))
    for name, batching in (("mlp", False), ("mlp_batched", True)):
        (path / name / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / "mlp" / "1" / "model.pt", path / name / "1" / "model.pt")
        (path / name / "config.pbtxt").write_text(S6.config(name, "mlp", max_batch, batching, device))


IN_PROCESS_ONNX = """
import json, sys, time
import numpy as np, onnxruntime as ort
path, batch, seconds, device = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
s = ort.InferenceSession(path, so, providers=providers)
feed = {"INPUT__0": np.zeros((batch, 16), np.float32)}
for _ in range(200):
    s.run(None, feed)
times = []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    t0 = time.perf_counter_ns(); s.run(None, feed); times.append(time.perf_counter_ns() - t0)
times.sort()
print(json.dumps({"p50_us": times[len(times) // 2] / 1e3, "p99_us": times[int(len(times) * 0.99)] / 1e3,
                  "calls_per_s": len(times) / (sum(times) / 1e9), "rows_per_s": batch * len(times) / (sum(times) / 1e9)}))
"""


def in_process(runtime: str, batch: int, seconds: float, cpu: str, device: str) -> dict[str, float]:
    if runtime == "torchscript":
        return S6.in_process("mlp", batch, seconds, cpu, device)
    argv = ["taskset", "-c", cpu, sys.executable, "-c", IN_PROCESS_ONNX,
            str(EXAMPLES / "mlp_onnx" / "1" / "model.onnx"), str(batch), str(seconds), device]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"error: in-process run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    def s12_options(ap) -> None:
        ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model instances run (cuda: GPU 0, KIND_GPU)")

    args = C.model_args(__doc__, s12_options)
    try:
        import onnxruntime
        import torch
    except ImportError as e:
        raise SystemExit(f"error: S12 needs onnxruntime and torch in this Python ({e})") from None
    if args.device == "cuda" and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise SystemExit("error: --device cuda: this onnxruntime has no CUDA execution provider "
                         "(pip install onnxruntime-gpu)")
    name = NAME if args.device == "cpu" else f"{NAME}_{args.device}"
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    started, load_before = time.monotonic(), C.loadavg()
    raw_dir = C.RAW_DIR / name / time.strftime("%Y%m%d-%H%M%S")
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = C.make_tmpdir("oi-s12-")
    repo = tmp / "repo"
    make_repo(repo, args.max_batch, args.device)
    port = C.free_port()
    base = f"http://127.0.0.1:{port}"
    server = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log", threads=1, extra=[str(repo)])
    data: dict[str, list[dict]] = {r: [] for r in RUNTIMES}
    with server:
        C.wait_http_ready(f"{base}/v2/health/ready", timeout=180, proc=server)
        body, headers = S6.binary_request("mlp")  # both models take INPUT__0 [1, 16] -> OUTPUT__0
        script = C.write_wrk_script(tmp / "mlp.lua", "POST", body, headers)
        for model in ("mlp_onnx", "mlp_onnx_batched", "mlp", "mlp_batched"):
            status, raw = C.http_request(f"{base}/v2/models/{model}/infer", body, "POST", headers)
            if status != 200:
                raise SystemExit(f"error: {model} answered {status}: {raw[:300]!r}")
            if not args.quick:  # warm-up, discarded
                C.run_wrk(f"{base}/v2/models/{model}/infer", script, 1 if "batched" not in model else args.connections,
                          1, args.client_cpu, servers=[server])  # fmt: skip
        for rnd in range(args.rounds):
            for runtime, model in RUNTIMES.items():
                w = C.run_wrk(f"{base}/v2/models/{model}/infer", script, 1, args.duration, args.client_cpu,
                              label=f"{model} c1", servers=[server])
                ip1 = in_process(runtime, 1, args.duration, args.server_cpu, args.device)
                wb = C.run_wrk(f"{base}/v2/models/{model}_batched/infer", script, args.connections, args.duration,
                               args.client_cpu, label=f"{model} batched", servers=[server])
                ipb = in_process(runtime, args.max_batch, args.duration, args.server_cpu, args.device)
                for r in (w, wb):
                    if not r.ok:
                        raise SystemExit(f"error: wrk: {r.error}\n{r.raw[-1000:]}")
                data[runtime].append({"c1": w, "ip1": ip1, "batched": wb, "ipb": ipb})
                print(f"[{runtime} round {rnd + 1}] batch 1: {w.rps:,.0f} req/s, HTTP p50 {w.p50_us:.0f} us, "
                      f"in-process p50 {ip1['p50_us']:.1f} us, overhead {w.p50_us - ip1['p50_us']:.0f} us | "
                      f"batching: {wb.rps:,.0f} rows/s vs in-process batch {args.max_batch} "
                      f"{ipb['rows_per_s']:,.0f} rows/s", flush=True)

    rows, csv_rows, ratio_rows = [], [], []
    limits = {"onnx": "`InferenceSession.run`", "torchscript": "`module(x)`"}
    for runtime, rounds in data.items():
        c1, bt = [r["c1"] for r in rounds], [r["batched"] for r in rounds]
        ip1, ipb = [r["ip1"] for r in rounds], [r["ipb"] for r in rounds]
        overhead = [w.p50_us - i["p50_us"] for w, i in zip(c1, ip1)]
        vs_ip1 = [w.rps / i["calls_per_s"] for w, i in zip(c1, ip1)]
        vs_ipb = [w.rps / i["rows_per_s"] for w, i in zip(bt, ipb)]
        ratio_rows.append(C.ratio_row("S12", f"{RUNTIMES[runtime]} batch 1, c=1", f"in-process {limits[runtime]}",
                                      "limit", "req/s", vs_ip1))
        ratio_rows.append(C.ratio_row("S12", f"{RUNTIMES[runtime]} dynamic batching, c={args.connections}",
                                      f"in-process {limits[runtime]}, batch {args.max_batch}", "limit", "rows/s",
                                      vs_ipb))
        rows.append([runtime, RUNTIMES[runtime], C.summarize([w.rps for w in c1]).fmt(",.0f"),
                     C.summarize([w.p50_us for w in c1]).fmt(",.0f"),
                     C.summarize([i["p50_us"] for i in ip1]).fmt(",.1f"), C.summarize(overhead).fmt(",.0f"),
                     C.summarize(vs_ip1).fmt(".0%"), C.summarize([w.rps for w in bt]).fmt(",.0f"),
                     C.summarize([i["rows_per_s"] for i in ipb]).fmt(",.0f"), C.summarize(vs_ipb).fmt(".0%")])
        for i, (w, b, a1, ab) in enumerate(zip(c1, bt, ip1, ipb), 1):
            csv_rows.append([runtime, i, f"{w.rps:.1f}", w.p50_us, w.p99_us, f"{a1['p50_us']:.2f}",
                             f"{a1['calls_per_s']:.1f}", f"{b.rps:.1f}", b.p50_us, b.p99_us,
                             f"{ab['rows_per_s']:.1f}"])
    headers_md = ["runtime", "model", "batch-1 req/s (c=1)", "HTTP p50 µs", "in-process p50 µs",
                  "p50 overhead µs", "of in-process rate", f"batching rows/s (c={args.connections})",
                  f"in-process rows/s (batch {args.max_batch})", "of in-process batch rate"]
    out_dir.mkdir(parents=True, exist_ok=True)
    C.write_csv(out_dir / f"{name}.csv", ["runtime", "round", "c1_rps", "c1_p50_us", "c1_p99_us",
                                         "inproc_b1_p50_us", "inproc_b1_calls_per_s", "batched_rows_per_s",
                                         "batched_p50_us", "batched_p99_us", "inproc_batch_rows_per_s"], csv_rows)
    C.write_ratios(out_dir, name, ratio_rows)
    facts = C.machine_facts()
    lines = C.report_header("S12 — ONNX Runtime serving beside TorchScript: overhead and dynamic batching",
                            args.quick, time.monotonic() - started) + [
        "Cells: median (min–max) over rounds. 'p50 overhead': the HTTP p50 at one connection minus the "
        "in-process p50 of the same file on the same batch-1 input; 'of in-process batch rate': rows/s "
        f"under dynamic batching as a share of the file run in-process on batches of {args.max_batch} rows "
        "(the largest the server forms, so a lower bound).",
        "",
        C.markdown_table(headers_md, rows),
        "## Method",
        "",
        "- openinfer: `python -m openinfer serve --threads 1 <repo>`, the repo made here from "
        "examples/models/mlp_onnx (ONNX Runtime through its C API, intra_op_thread_count 1) and "
        "examples/models/mlp (the same network as TorchScript, INTRA_OP_THREAD_COUNT 1); `<model>`: no "
        f"batching, `<model>_batched`: dynamic_batching, max_queue_delay 1000 µs, max_batch_size {args.max_batch}; "
        f"one {'CPU' if args.device == 'cpu' else 'GPU 0'} instance each.",
        f"- In-process limits: `InferenceSession.run` (onnxruntime {onnxruntime.__version__}, one intra-op "
        f"and one inter-op thread) and `module(x)` (torch {torch.__version__}, one thread, inference_mode).",
        f"- Load: wrk on CPU {args.client_cpu} (`-c 1` for batch 1, `-c {args.connections}` for batching), HTTP "
        f"with the binary tensor extension, batch-1 requests of zeros; the server and the in-process runs on "
        f"CPU {args.server_cpu}. {args.rounds} rounds of {args.duration:g} s, runtimes in turn.",
        f"- {facts['cpu']}, {facts['nproc']} cores; load before {load_before}, after {C.loadavg()}.",
        f"- Per-run numbers: `{name}.csv`; logs `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    C.write_report(name, out_dir, lines, "s12")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s12] interrupted; server stopped", file=sys.stderr)
        sys.exit(130)
