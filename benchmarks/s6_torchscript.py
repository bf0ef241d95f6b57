#!/usr/bin/env python3
"""S6: TorchScript MLP and small CNN (examples/make_torchscript.py) served over HTTP with the
binary tensor extension, against the in-process limit: the same module called directly
(``module(x)`` under torch.inference_mode, one intra-op thread) on the same core.

    .venv/bin/python benchmarks/s6_torchscript.py [--quick] [--rounds N] [--duration S] [--device cuda]

With --device cuda the models are instances on GPU 0 (KIND_GPU) and the in-process limit is the
call a server must make for each request: the host input copied to the GPU, ``module(x)``, the
outputs copied back (``module(x.cuda())`` then ``.cpu()``); results go to s6_torchscript_cuda.*.

Two measures per model, each taken side by side A B A B for N rounds:
  * overhead: wrk with one connection sends batch-1 requests; the p50 latency minus the
    p50 of the in-process call on the same batch-1 input is the serving overhead.
  * dynamic batching: wrk with --connections batch-1 requests to the model with
    dynamic_batching (max_batch_size = --max-batch); rows/s against the in-process
    throughput of calling the module on batches of max_batch_size rows (the largest batch
    the server can form, so the ratio is a lower bound).
The server (`openinfer serve`, --threads loop threads (1), one model instance) and the in-process
runs are pinned to --server-cpu, wrk to --client-cpu. Results: benchmarks/results/
s6_torchscript.md and .csv (--quick: benchmarks/results/raw/).
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

NAME = "s6_torchscript"
EXAMPLES = C.REPO_ROOT / "examples" / "models"
# model -> (input name, per-row shape, outputs (name, per-row dims))
MODELS = {
    "mlp": ("INPUT__0", [16], [("OUTPUT__0", [4])]),
    "cnn": ("image", [1, 28, 28], [("logits", [10]), ("probabilities", [10])]),
}


def config(name: str, model: str, max_batch: int, batching: bool, device: str = "cpu") -> str:
    inp, dims, outs = MODELS[model]
    text = f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch}\n'
    text += f'input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: {dims} }} ]\n'
    text += "output [ " + ", ".join(
        f'{{ name: "{o}" data_type: TYPE_FP32 dims: {d} }}' for o, d in outs
    ) + " ]\n"
    kind = "KIND_GPU gpus: [ 0 ]" if device == "cuda" else "KIND_CPU"
    text += f"instance_group [ {{ count: 1 kind: {kind} }} ]\n"
    text += 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
    if batching:
        text += "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    return text


def make_repo(path: Path, max_batch: int, device: str) -> None:
    for model in MODELS:
        for name, batching in ((model, False), (f"{model}_batched", True)):
            (path / name / "1").mkdir(parents=True)
            shutil.copy(EXAMPLES / model / "1" / "model.pt", path / name / "1" / "model.pt")
            (path / name / "config.pbtxt").write_text(config(name, model, max_batch, batching, device))


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
device = sys.argv[5]
m = torch.jit.load(path, map_location=device).eval()
x = torch.zeros(batch, *dims)


def host(out):  # outputs back in host memory, as a server must send them (.cpu() synchronizes)
    if isinstance(out, torch.Tensor):
        return out.cpu()
    values = out.values() if isinstance(out, dict) else out
    return [host(v) for v in values]


def call():
    return m(x) if device == "cpu" else host(m(x.to(device)))


with torch.inference_mode():
    for _ in range(200):
        call()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns(); call(); times.append(time.perf_counter_ns() - t0)
times.sort()
print(json.dumps({"p50_us": times[len(times) // 2] / 1e3, "p99_us": times[int(len(times) * 0.99)] / 1e3,
                  "calls_per_s": len(times) / (sum(times) / 1e9), "rows_per_s": batch * len(times) / (sum(times) / 1e9)}))
"""


def in_process(model: str, batch: int, seconds: float, cpu: str, device: str = "cpu") -> dict[str, float]:
    _, dims, _ = MODELS[model]
    argv = ["taskset", "-c", cpu, sys.executable, "-c", IN_PROCESS,
            str(EXAMPLES / model / "1" / "model.pt"), str(batch), json.dumps(dims), str(seconds), device]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"error: in-process run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


CUDA_TRITON_LINE = ("- Triton's PyTorch backend is not compared: the Triton server that pip installs (the "
                    "nvidia-pytriton wheel) ships Triton's `python` backend only, so the claim is against the "
                    "in-process limit.")


def triton_backends_line(PEERS) -> str:
    """Why Triton itself is not a row here: which backends the wheel that ships it has."""
    try:
        dist = PEERS.triton_dist()
        have = ", ".join(f"`{b}`" for b in dist.backend_names())
        what = f"{dist.wheel} ships Triton's {have} backend only"
    except PEERS.PeerUnavailable as e:
        what = f"the nvidia-pytriton wheel could not be inspected ({e})"
    return (f"- Triton's PyTorch backend is not compared: {what} (the Triton server that pip installs here), so the "
            "TorchScript claim is against the in-process limit, and Triton appears only as PyTriton "
            "calling the module from Python.")


def main() -> int:
    import peers as PEERS

    def s6_options(ap) -> None:
        ap.add_argument("--models", default=None, help="default mlp,cnn (quick: mlp)")
        ap.add_argument("--peers", default=None, help="'pytriton' (default) or 'none'")
        ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model instances run (cuda: GPU 0, KIND_GPU)")
        ap.add_argument("--threads", type=int, default=1,
                        help="server event-loop threads (1); give --server-cpu as many CPUs")
        ap.add_argument("--wrk-threads", type=int, default=1, help="wrk threads for the batching runs (1)")

    args = C.model_args(__doc__, s6_options)
    name = NAME if args.device == "cpu" else f"{NAME}_{args.device}"
    name += f"_t{args.threads}" if args.threads > 1 else ""
    args.models = args.models or ("mlp" if args.quick else "mlp,cnn")
    try:
        import torch
    except ImportError:
        raise SystemExit("error: S6 needs torch in this Python (make test installs it)") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA GPU here")
    models = [m for m in args.models.split(",") if m]
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    started, load_before = time.monotonic(), C.loadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / name / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = C.make_tmpdir("oi-s6-")
    repo = tmp / "repo"
    make_repo(repo, args.max_batch, args.device)
    port = C.free_port()
    server = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log", threads=args.threads,
                                extra=[str(repo)])
    peer_problems: list[str] = []
    peers: dict = {}
    # per model: list of per-round dicts
    data: dict[str, list[dict]] = {m: [] for m in models}
    try:
        with server:
            C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout=180, proc=server)
            bases = {"openinfer": f"http://127.0.0.1:{port}"}
            procs = {"openinfer": server}
            peers = PEERS.start_peers(C.peer_list(args.peers, ["pytriton"]), args.server_cpu, raw_dir,
                                      peer_problems, torch_repo=EXAMPLES, timeout=300,
                                      models=("simple", "mlp", "mlp_batched", "cnn", "cnn_batched"))
            for n, p in peers.items():
                bases[n], procs[n] = p.http_url, p.proc
            for model in models:
                body, headers = binary_request(model)
                script = C.write_wrk_script(tmp / f"{model}.lua", "POST", body, headers)
                for n in list(bases):
                    status, raw = C.http_request(f"{bases[n]}/v2/models/{model}/infer", body, "POST", headers)
                    if status != 200:
                        if n == "openinfer":
                            raise SystemExit(f"error: {model} answered {status}: {raw[:300]!r}")
                        peer_problems.append(f"{peers[n].label} {model}: HTTP {status}: {raw[:300]!r}")
                        del bases[n]
                for n in (bases if not args.quick else []):  # warm-up, discarded
                    for suffix, conns in (("", 1), ("_batched", args.connections)):
                        C.run_wrk(f"{bases[n]}/v2/models/{model}{suffix}/infer", script, conns, 1,
                                  args.client_cpu, servers=[procs[n]])
                for rnd in range(args.rounds):
                    d: dict = {}
                    for n in bases:  # A B (limit) per measure
                        w = C.run_wrk(f"{bases[n]}/v2/models/{model}/infer", script, 1, args.duration,
                                      args.client_cpu, label=f"{n} {model} c1", servers=[procs[n]])
                        if not w.ok:
                            raise SystemExit(f"error: wrk {n}: {w.error}\n{w.raw[-1000:]}")
                        d[(n, "c1")] = w
                    d["ip1"] = in_process(model, 1, args.duration, args.server_cpu, args.device)
                    for n in bases:
                        wb = C.run_wrk(f"{bases[n]}/v2/models/{model}_batched/infer", script, args.connections,
                                       args.duration, args.client_cpu, label=f"{n} {model} batched",
                                       threads=args.wrk_threads, servers=[procs[n]])
                        if not wb.ok:
                            raise SystemExit(f"error: wrk {n}: {wb.error}\n{wb.raw[-1000:]}")
                        d[(n, "batched")] = wb
                    d["ipb"] = in_process(model, args.max_batch, args.duration, args.server_cpu, args.device)
                    data[model].append(d)
                    w, wb, ip, ipb = d[("openinfer", "c1")], d[("openinfer", "batched")], d["ip1"], d["ipb"]
                    extra = "".join(f" | {n}: c1 {d[(n, 'c1')].rps:,.0f} req/s p50 {d[(n, 'c1')].p50_us:.0f} us, "
                                    f"batched {d[(n, 'batched')].rps:,.0f} rows/s" for n in bases if n != "openinfer")
                    print(f"[{model} round {rnd + 1}] batch 1: {w.rps:,.0f} req/s, HTTP p50 {w.p50_us:.0f} us, "
                          f"in-process p50 {ip['p50_us']:.1f} us | batching: {wb.rps:,.0f} rows/s vs in-process "
                          f"batch {args.max_batch} {ipb['rows_per_s']:,.0f} rows/s" + extra, flush=True)
    finally:
        for p in peers.values():
            p.stop()

    # ---- report ----
    rows, csv_rows, ratio_rows = [], [], []
    labels = {"openinfer": "openinfer", **{n: p.label for n, p in peers.items()}}
    for model in models:
        rounds = data[model]
        if not rounds:
            continue
        names = [k[0] for k in rounds[0] if isinstance(k, tuple) and k[1] == "c1"]
        for n in names:
            c1 = [r[(n, "c1")] for r in rounds]
            bt = [r[(n, "batched")] for r in rounds]
            ip1 = [r["ip1"] for r in rounds]
            ipb = [r["ipb"] for r in rounds]
            overhead = [w.p50_us - i["p50_us"] for w, i in zip(c1, ip1)]
            vs_ip1 = [w.rps / i["calls_per_s"] for w, i in zip(c1, ip1)]
            vs_ipb = [w.rps / i["rows_per_s"] for w, i in zip(bt, ipb)]
            if n == "openinfer":
                ratio_rows.append(C.ratio_row("S6", f"{model} batch 1, c=1", "in-process module(x)", "limit",
                                              "req/s", vs_ip1))
                ratio_rows.append(C.ratio_row("S6", f"{model} dynamic batching, c={args.connections}",
                                              f"in-process module(x), batch {args.max_batch}", "limit",
                                              "rows/s", vs_ipb))
                r1 = rb = "1"
            else:
                oc1 = [r[("openinfer", "c1")].rps for r in rounds]
                obt = [r[("openinfer", "batched")].rps for r in rounds]
                rs1 = C.paired_ratios(oc1, [w.rps for w in c1])
                rsb = C.paired_ratios(obt, [w.rps for w in bt])
                ratio_rows.append(C.ratio_row("S6", f"{model} batch 1, c=1", labels[n], "peer", "req/s", rs1))
                ratio_rows.append(C.ratio_row("S6", f"{model} dynamic batching, c={args.connections}",
                                              labels[n], "peer", "rows/s", rsb))
                r1, rb = C.summarize(rs1).fmt(".2f"), C.summarize(rsb).fmt(".2f")
            rows.append([model, labels[n], C.summarize([w.rps for w in c1]).fmt(",.0f"), r1,
                         C.summarize([w.p50_us for w in c1]).fmt(",.0f"),
                         C.summarize([w.p99_us for w in c1]).fmt(",.0f"),
                         C.summarize(overhead).fmt(",.0f"), C.summarize(vs_ip1).fmt(".0%"),
                         C.summarize([w.rps for w in bt]).fmt(",.0f"), rb,
                         C.summarize([w.p99_us for w in bt]).fmt(",.0f"), C.summarize(vs_ipb).fmt(".0%")])
            for i, (w, b, a1, ab) in enumerate(zip(c1, bt, ip1, ipb), 1):
                csv_rows.append([model, n, i, f"{w.rps:.1f}", w.p50_us, w.p99_us, f"{a1['p50_us']:.2f}",
                                 f"{a1['calls_per_s']:.1f}", f"{b.rps:.1f}", b.p50_us, b.p99_us,
                                 f"{ab['rows_per_s']:.1f}"])
        ip = C.summarize([r["ip1"]["p50_us"] for r in rounds])
        rows.append([model, "in-process `module(x)` (limit)",
                     C.summarize([r["ip1"]["calls_per_s"] for r in rounds]).fmt(",.0f"), "", ip.fmt(",.1f"),
                     C.summarize([r["ip1"]["p99_us"] for r in rounds]).fmt(",.1f"), "0", "100%",
                     C.summarize([r["ipb"]["rows_per_s"] for r in rounds]).fmt(",.0f")
                     + f" (batch {args.max_batch})", "", "", "100%"])
    headers_md = ["model", "server", "batch-1 req/s (c=1)", "openinfer/X", "p50 µs", "p99 µs",
                  "p50 overhead over in-process µs", "of in-process rate",
                  f"batching rows/s (c={args.connections})", "openinfer/X", "batching p99 µs",
                  "of in-process batch rate"]
    out_dir.mkdir(parents=True, exist_ok=True)
    C.write_csv(out_dir / f"{name}.csv", ["model", "server", "round", "c1_rps", "c1_p50_us", "c1_p99_us",
                                         "inproc_b1_p50_us", "inproc_b1_calls_per_s", "batched_rows_per_s",
                                         "batched_p50_us", "batched_p99_us", "inproc_batch_rows_per_s"],
                csv_rows)
    C.write_ratios(out_dir, name, ratio_rows)
    facts = C.machine_facts()
    peer_lines = [f"- {p.label}: {p.version} with torch {torch.__version__} in its venv, `{p.command}`: "
                  "each model bound twice (`<model>` with no queue delay, `<model>_batched` with "
                  f"max_queue_delay 1000 µs), max_batch_size {args.max_batch}, the PyTriton function calling the "
                  "same TorchScript file under torch.inference_mode with one intra-op thread." for p in peers.values()]
    peer_lines.append(triton_backends_line(PEERS) if args.device == "cpu" else CUDA_TRITON_LINE)
    where = "" if args.device == "cpu" else f" on {torch.cuda.get_device_name(0)}"
    lines = C.report_header(f"S6 — TorchScript serving{where}: overhead and dynamic batching", args.quick,
                            time.monotonic() - started) + [
        "**openinfer/X** = median of per-round ratios (min–max); other cells median (min–max) over rounds. "
        "'of in-process rate': the server's rate as a share of the same module called directly "
        f"(batch 1; and batches of {args.max_batch} rows, the largest the server can form, so that share "
        "is a lower bound).",
        "",
        C.markdown_table(headers_md, rows),
        "## Method",
        "",
        f"- openinfer: `python -m openinfer serve --threads {args.threads} <repo>`, the repo made here from "
        f"examples/models/{{mlp,cnn}} (`<model>`: no batching; `<model>_batched`: dynamic_batching, "
        f"max_queue_delay 1000 µs, max_batch_size {args.max_batch}), one "
        f"{'CPU instance' if args.device == 'cpu' else 'instance on GPU 0 (KIND_GPU)'}, INTRA_OP_THREAD_COUNT 1.",
        *([] if args.device == "cpu" else [
            "- In-process on CUDA: `module(x.cuda())` and every output `.cpu()` per call, from a host tensor, "
            "as the server must do for each request."]),
        *peer_lines,
        f"- Load: wrk on CPU {args.client_cpu} (`wrk -t 1 -c 1` for batch 1, `-c {args.connections}` for "
        "batching), HTTP with the binary tensor extension, batch-1 requests of zeros; every server and the "
        f"in-process runs on CPU {args.server_cpu}. {args.rounds} rounds of {args.duration:g} s, servers "
        "and in-process in turn; a 1 s discarded warm-up per server and model.",
        f"- torch {torch.__version__}; {facts['cpu']}, {facts['nproc']} cores; load before {load_before}, "
        f"after {C.loadavg()}.",
        f"- Per-run numbers: `{name}.csv`; logs `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    if peer_problems:
        lines += ["## Peers that did not run", "", *[f"- {p}" for p in peer_problems], ""]
    C.write_report(name, out_dir, lines, "s6")
    print("\n".join(lines[-20:]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s6] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
