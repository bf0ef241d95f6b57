#!/usr/bin/env python3
"""S6: TorchScript MLP and small CNN (examples/make_torchscript.py) served over HTTP with the
binary tensor extension, against the in-process limit: the same module called directly
(``module(x)`` under torch.inference_mode, one intra-op thread) on the same core.

    .venv/bin/python benchmarks/s6_torchscript.py [--quick] [--rounds N] [--duration S]

Two measures per model, each taken side by side A B A B for N rounds:
  * overhead: wrk with one connection sends batch-1 requests; the p50 latency minus the
    p50 of the in-process call on the same batch-1 input is the serving overhead.
  * dynamic batching: wrk with --connections batch-1 requests to the model with
    dynamic_batching (max_batch_size = --max-batch); rows/s against the in-process
    throughput of calling the module on batches of max_batch_size rows (the largest batch
    the server can form, so the ratio is a lower bound).
The server (`openinfer serve`, one loop thread, one model instance) and the in-process
runs are pinned to --server-cpu, wrk to --client-cpu. Results: benchmarks/results/
s6_torchscript.md and .csv (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s6_torchscript"
EXAMPLES = C.REPO_ROOT / "examples" / "models"
# model -> (input name, per-row shape, outputs (name, per-row dims))
MODELS = {
    "mlp": ("INPUT__0", [16], [("OUTPUT__0", [4])]),
    "cnn": ("image", [1, 28, 28], [("logits", [10]), ("probabilities", [10])]),
}


def config(name: str, model: str, max_batch: int, batching: bool) -> str:
    inp, dims, outs = MODELS[model]
    text = f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch}\n'
    text += f'input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: {dims} }} ]\n'
    text += "output [ " + ", ".join(
        f'{{ name: "{o}" data_type: TYPE_FP32 dims: {d} }}' for o, d in outs
    ) + " ]\n"
    text += "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    text += 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
    if batching:
        text += "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    return text


def make_repo(path: Path, max_batch: int) -> None:
    for model in MODELS:
        for name, batching in ((model, False), (f"{model}_batched", True)):
            (path / name / "1").mkdir(parents=True)
            shutil.copy(EXAMPLES / model / "1" / "model.pt", path / name / "1" / "model.pt")
            (path / name / "config.pbtxt").write_text(config(name, model, max_batch, batching))


def binary_request(model: str) -> tuple[bytes, dict[str, str]]:
    inp, dims, outs = MODELS[model]
    count = 1
    for d in dims:
        count *= d
    data = bytes(4 * count)  # zeros: the timing of these models does not depend on values
    header = json.dumps(
        {
            "inputs": [
                {"name": inp, "datatype": "FP32", "shape": [1, *dims],
                 "parameters": {"binary_data_size": len(data)}}
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o, _ in outs],
        },
        separators=(",", ":"),
    ).encode()  # fmt: skip
    return header + data, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


IN_PROCESS = """
import json, sys, time, torch
torch.set_num_threads(1)
path, batch, dims, seconds = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
m = torch.jit.load(path).eval()
x = torch.zeros(batch, *dims)
with torch.inference_mode():
    for _ in range(200):
        m(x)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns(); m(x); times.append(time.perf_counter_ns() - t0)
times.sort()
print(json.dumps({"p50_us": times[len(times) // 2] / 1e3, "p99_us": times[int(len(times) * 0.99)] / 1e3,
                  "calls_per_s": len(times) / (sum(times) / 1e9), "rows_per_s": batch * len(times) / (sum(times) / 1e9)}))
"""


def in_process(model: str, batch: int, seconds: float, cpu: str) -> dict[str, float]:
    _, dims, _ = MODELS[model]
    argv = ["taskset", "-c", cpu, sys.executable, "-c", IN_PROCESS,
            str(EXAMPLES / model / "1" / "model.pt"), str(batch), json.dumps(dims), str(seconds)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"error: in-process run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 2 s (under a minute per model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections for batching")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.duration = 2, 2.0
    C.check_cpus(args.server_cpu, args.client_cpu)
    C.ensure_debian_packages([["wrk"]])
    try:
        import torch
    except ImportError:
        raise SystemExit("error: S6 needs torch in this Python (make test installs it)") from None
    models = [m for m in args.models.split(",") if m]
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    tmp = C.make_tmpdir("oi-s6-")
    repo = tmp / "repo"
    make_repo(repo, args.max_batch)
    port = C.free_port()
    log = tmp / "openinfer.log"
    server = C.openinfer_server(port, args.server_cpu, log, threads=1, extra=[str(repo)])
    rows: list[list[object]] = []
    with server:
        C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout=180, proc=server)
        base = f"http://127.0.0.1:{port}"
        for model in models:
            body, headers = binary_request(model)
            script = C.write_wrk_script(tmp / f"{model}.lua", "POST", body, headers)
            status, raw = C.http_request(f"{base}/v2/models/{model}/infer", body, "POST", headers)
            if status != 200:
                raise SystemExit(f"error: {model} answered {status}: {raw[:300]!r}")
            overhead, p50s, p99s, ratios, served, limit = [], [], [], [], [], []
            for rnd in range(args.rounds):
                w = C.run_wrk(f"{base}/v2/models/{model}/infer", script, 1, args.duration,
                              args.client_cpu, label=f"{model} c1", servers=[server])  # fmt: skip
                if not w.ok:
                    raise SystemExit(f"error: wrk: {w.error}\n{w.raw[-1000:]}")
                ip = in_process(model, 1, args.duration, args.server_cpu)
                overhead.append(w.p50_us - ip["p50_us"])
                p50s.append(w.p50_us)
                p99s.append(w.p99_us)
                wb = C.run_wrk(f"{base}/v2/models/{model}_batched/infer", script, args.connections,
                               args.duration, args.client_cpu, label=f"{model} batched",
                               servers=[server])  # fmt: skip
                if not wb.ok:
                    raise SystemExit(f"error: wrk: {wb.error}\n{wb.raw[-1000:]}")
                ipb = in_process(model, args.max_batch, args.duration, args.server_cpu)
                served.append(wb.rps)
                limit.append(ipb["rows_per_s"])
                ratios.append(wb.rps / ipb["rows_per_s"])
                print(
                    f"[{model} round {rnd + 1}] batch 1: HTTP p50 {w.p50_us:.0f} us, in-process p50 "
                    f"{ip['p50_us']:.1f} us, overhead {overhead[-1]:.0f} us | batching: "
                    f"{wb.rps:,.0f} rows/s (p50 {wb.p50_us:.0f} us) vs in-process batch "
                    f"{args.max_batch} {ipb['rows_per_s']:,.0f} rows/s = {ratios[-1]:.0%}",
                    flush=True,
                )
            o, r = C.summarize(overhead), C.summarize(ratios)
            rows.append([
                model, C.summarize(p50s).fmt(",.0f", " µs"), C.summarize(p99s).fmt(",.0f", " µs"),
                o.fmt(",.0f", " µs"), C.summarize(served).fmt(",.0f"), C.summarize(limit).fmt(",.0f"),
                r.fmt(".0%"),
            ])  # fmt: skip
    headers_md = ["model", "HTTP batch-1 p50", "p99", "overhead over in-process p50",
                  f"batching rows/s (c={args.connections})", f"in-process rows/s (batch {args.max_batch})",
                  "batching / in-process"]  # fmt: skip
    facts = C.machine_facts()
    md = f"# S6: TorchScript serving overhead and dynamic batching ({C.now_utc()})\n\n"
    md += textwrap.dedent(f"""\
        Command: `.venv/bin/python benchmarks/s6_torchscript.py{' --quick' if args.quick else ''}`.
        Server `openinfer serve` (1 loop thread, 1 CPU instance, INTRA_OP_THREAD_COUNT 1) and the
        in-process runs on CPU {args.server_cpu}; wrk on CPU {args.client_cpu}. HTTP with the binary
        tensor extension, batch-1 requests of zeros. {args.rounds} rounds of {args.duration:g} s,
        alternating server and in-process; median (min–max). torch {torch.__version__},
        {facts['cpu']}, {facts['nproc']} cores, load {C.loadavg()}.

        The in-process batching limit calls the module on batches of {args.max_batch} rows, the
        largest the server can form, so the ratio is a lower bound.

        """)
    md += C.markdown_table(headers_md, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.md").write_text(md)
    C.write_csv(out_dir / f"{NAME}.csv", headers_md, rows)
    print(md)


if __name__ == "__main__":
    main()
