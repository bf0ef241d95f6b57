#!/usr/bin/env python3
"""S14: the example MLP as a PyTorch 2 AOTInductor package (examples/models/mlp_pt2, run by
libtorch's AOTIModelPackageLoader inside the torch shim) beside the same network as TorchScript
(examples/models/mlp, S6's model), served over HTTP with the binary tensor extension.

    .venv/bin/python benchmarks/s14_pt2.py [--quick] [--rounds N] [--duration S] [--device cuda]

With --device cuda both models are instances on GPU 0 (KIND_GPU), the package is compiled for
CUDA, and the in-process calls copy the input to the GPU and the output back, as the server
must; results go to s14_pt2_cuda.*.

Per round, side by side:
  * overhead: wrk with one connection sends batch-1 requests; the p50 latency minus the p50 of
    the same file called in-process on the same batch-1 input (the package through
    ``torch._inductor.aoti_load_package(path)(x)``, the TorchScript module through ``module(x)``,
    one thread, inference mode, on the server's core) is the serving overhead. Claim: the
    package's overhead is at most TorchScript's.
  * dynamic batching: wrk with --connections batch-1 requests to each model with
    dynamic_batching (max_batch_size = --max-batch); rows/s against the transport's rate, the
    same load on a model of the identity backend (the server with no model work: it answers
    on the loop that read the request), measured right before each batched run. Claim: the
    package's rows/s >= 90% of it. The in-process rate on batches of --max-batch rows is shown
    beside it.
The package is compiled by the example's recipe (examples/models/mlp_pt2/1/export.py), or
taken from openinfer's cache when a server compiled it already. The server (`openinfer serve`,
one loop thread, one instance per model) and the in-process runs are pinned to --server-cpu,
wrk to --client-cpu. Results: benchmarks/results/s14_pt2.md, .csv and .ratios.json (--quick:
benchmarks/results/raw/).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import s6_torchscript as S6  # noqa: E402

NAME = "s14_pt2"
EXAMPLES = C.REPO_ROOT / "examples" / "models"
RUNTIMES = {"pt2": "mlp_pt2", "torchscript": "mlp"}  # runtime -> model served
IDENTITY = "identity_fp32x16"
IDENTITY_CONFIG = f"""name: "{IDENTITY}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }} ]
"""


def pt2_config(name: str, max_batch: int, batching: bool, device: str) -> str:
    text = f'name: "{name}"\nplatform: "torch_aoti"\nmax_batch_size: {max_batch}\n'
    text += 'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    text += 'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    kind = "KIND_GPU gpus: [ 0 ]" if device == "cuda" else "KIND_CPU"
    text += f"instance_group [ {{ count: 1 kind: {kind} }} ]\n"
    text += 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
    if batching:
        text += "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    return text


def package(dest: Path, device: str) -> str:
    """The example's package at `dest`: copied from openinfer's cache when a server built it
    for this torch (the CPU package only), else compiled now by the example's recipe. Returns
    where it came from."""
    version_dir = EXAMPLES / "mlp_pt2" / "1"
    try:
        from openinfer._pt2_build import package_path

        cached = package_path(version_dir) if device == "cpu" else None
    except Exception:  # noqa: BLE001  (no openinfer or torch here: compile below)
        cached = None
    dest.parent.mkdir(parents=True, exist_ok=True)
    if cached is not None and cached.is_file():
        shutil.copy(cached, dest)
        return f"openinfer's cache ({cached})"
    print(f"[s14] compiling the mlp_pt2 package for {device} (tens of seconds)", flush=True)
    out = subprocess.run([sys.executable, str(version_dir / "export.py"), str(dest), device], capture_output=True,
                         text=True, timeout=900)  # fmt: skip
    if out.returncode != 0 or not dest.is_file():
        raise SystemExit(f"error: compiling the package failed:\n{out.stderr[-3000:]}")
    return f"compiled by `{C.rel(version_dir / 'export.py')}`"


def make_repo(path: Path, max_batch: int, device: str) -> str:
    source = package(path / "mlp_pt2" / "1" / "model.pt2", device)
    (path / "mlp_pt2_batched" / "1").mkdir(parents=True)
    shutil.copy(path / "mlp_pt2" / "1" / "model.pt2", path / "mlp_pt2_batched" / "1" / "model.pt2")
    for name, batching in (("mlp_pt2", False), ("mlp_pt2_batched", True)):
        (path / name / "config.pbtxt").write_text(pt2_config(name, max_batch, batching, device))
    for name, batching in (("mlp", False), ("mlp_batched", True)):
        (path / name / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / "mlp" / "1" / "model.pt", path / name / "1" / "model.pt")
        (path / name / "config.pbtxt").write_text(S6.config(name, "mlp", max_batch, batching, device))
    (path / IDENTITY / "1").mkdir(parents=True)
    (path / IDENTITY / "config.pbtxt").write_text(IDENTITY_CONFIG)
    return source


def identity_request() -> tuple[bytes, dict[str, str]]:
    """S6's mlp request with the identity model's input name: FP32 [1, 16] of zeros."""
    data = bytes(4 * 16)
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()  # fmt: skip
    return header + data, {"Inference-Header-Content-Length": str(len(header)),
                           "Content-Type": "application/octet-stream"}  # fmt: skip


IN_PROCESS_PT2 = """
import json, sys, time, torch
torch.set_num_threads(1)
path, batch, seconds, device = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
m = torch._inductor.aoti_load_package(path)
x = torch.zeros(batch, 16)


def call():  # on CUDA as a server must: the input to the GPU, the outputs back (.cpu() synchronizes)
    return m(x) if device == "cpu" else [o.cpu() for o in m(x.to(device))]


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


def in_process(runtime: str, package_file: Path, batch: int, seconds: float, cpu: str,
               device: str) -> dict[str, float]:
    if runtime == "torchscript":
        return S6.in_process("mlp", batch, seconds, cpu, device)
    argv = ["taskset", "-c", cpu, sys.executable, "-c", IN_PROCESS_PT2, str(package_file), str(batch), str(seconds),
            device]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"error: in-process run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_answers(base: str, body: bytes, headers: dict[str, str]) -> None:
    """Every model answers 200, and the package's answer is the TorchScript one's."""
    answers = {}
    for model in ("mlp_pt2", "mlp_pt2_batched", "mlp", "mlp_batched"):
        status, raw = C.http_request(f"{base}/v2/models/{model}/infer", body, "POST", headers)
        if status != 200:
            raise SystemExit(f"error: {model} answered {status}: {raw[:300]!r}")
        answers[model] = raw[-16:]  # OUTPUT__0: 4 FP32, the body's last bytes
    got, want = struct.unpack("<4f", answers["mlp_pt2"]), struct.unpack("<4f", answers["mlp"])
    if any(abs(g - w) > 1e-5 * max(1.0, abs(w)) for g, w in zip(got, want)):
        raise SystemExit(f"error: mlp_pt2 answered {answers['mlp_pt2']!r}, mlp {answers['mlp']!r}")
    ibody, iheaders = identity_request()
    status, raw = C.http_request(f"{base}/v2/models/{IDENTITY}/infer", ibody, "POST", iheaders)
    if status != 200 or raw[-64:] != bytes(64):
        raise SystemExit(f"error: {IDENTITY} answered {status}: {raw[:300]!r}")


def main() -> int:
    def s14_options(ap) -> None:
        ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model instances run (cuda: GPU 0, KIND_GPU)")

    args = C.model_args(__doc__, s14_options)
    try:
        import torch
    except ImportError as e:
        raise SystemExit(f"error: S14 needs torch in this Python ({e})") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA GPU here")
    name = NAME if args.device == "cpu" else f"{NAME}_{args.device}"
    out_dir = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    started, load_before = time.monotonic(), C.loadavg()
    raw_dir = C.RAW_DIR / name / time.strftime("%Y%m%d-%H%M%S")
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = C.make_tmpdir("oi-s14-")
    repo = tmp / "repo"
    source = make_repo(repo, args.max_batch, args.device)
    package_file = repo / "mlp_pt2" / "1" / "model.pt2"
    port = C.free_port()
    base = f"http://127.0.0.1:{port}"
    server = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log", threads=1, extra=[str(repo)])
    data: dict[str, list[dict]] = {r: [] for r in RUNTIMES}
    with server:
        C.wait_http_ready(f"{base}/v2/health/ready", timeout=180, proc=server)
        body, headers = S6.binary_request("mlp")  # both models take INPUT__0 [1, 16] -> OUTPUT__0
        check_answers(base, body, headers)
        script = C.write_wrk_script(tmp / "mlp.lua", "POST", body, headers)
        ibody, iheaders = identity_request()
        iscript = C.write_wrk_script(tmp / "identity.lua", "POST", ibody, iheaders)
        if not args.quick:  # warm-up, discarded
            for model in ("mlp_pt2", "mlp_pt2_batched", "mlp", "mlp_batched"):
                C.run_wrk(f"{base}/v2/models/{model}/infer", script, 1 if "batched" not in model else args.connections,
                          1, args.client_cpu, servers=[server])  # fmt: skip
            C.run_wrk(f"{base}/v2/models/{IDENTITY}/infer", iscript, args.connections, 1, args.client_cpu,
                      servers=[server])  # fmt: skip
        for rnd in range(args.rounds):
            for runtime, model in RUNTIMES.items():
                w = C.run_wrk(f"{base}/v2/models/{model}/infer", script, 1, args.duration, args.client_cpu,
                              label=f"{model} c1", servers=[server])
                ip1 = in_process(runtime, package_file, 1, args.duration, args.server_cpu, args.device)
                # The transport's rate right before the batched run: the pair is the ratio's.
                wi = C.run_wrk(f"{base}/v2/models/{IDENTITY}/infer", iscript, args.connections, args.duration,
                               args.client_cpu, label="identity", servers=[server])  # fmt: skip
                wb = C.run_wrk(f"{base}/v2/models/{model}_batched/infer", script, args.connections, args.duration,
                               args.client_cpu, label=f"{model} batched", servers=[server])
                ipb = in_process(runtime, package_file, args.max_batch, args.duration, args.server_cpu, args.device)
                for r in (w, wi, wb):
                    if not r.ok:
                        raise SystemExit(f"error: wrk: {r.error}\n{r.raw[-1000:]}")
                data[runtime].append({"c1": w, "ip1": ip1, "batched": wb, "ipb": ipb, "transport": wi})
                print(f"[{runtime} round {rnd + 1}] batch 1: {w.rps:,.0f} req/s, HTTP p50 {w.p50_us:.0f} us, "
                      f"in-process p50 {ip1['p50_us']:.1f} us, overhead {w.p50_us - ip1['p50_us']:.0f} us | "
                      f"batching: {wb.rps:,.0f} rows/s vs transport {wi.rps:,.0f} req/s, in-process batch "
                      f"{args.max_batch} {ipb['rows_per_s']:,.0f} rows/s", flush=True)
    load_after = C.loadavg()

    rows, csv_rows, ratio_rows = [], [], []
    limits = {"pt2": "`aoti_load_package(path)(x)`", "torchscript": "`module(x)`"}
    overheads = {}
    for runtime, rounds in data.items():
        c1, bt = [r["c1"] for r in rounds], [r["batched"] for r in rounds]
        ip1, ipb = [r["ip1"] for r in rounds], [r["ipb"] for r in rounds]
        overhead = overheads[runtime] = [w.p50_us - i["p50_us"] for w, i in zip(c1, ip1)]
        vs_transport = [w.rps / r["transport"].rps for w, r in zip(bt, rounds)]
        ratio_rows.append(C.ratio_row("S14", f"{RUNTIMES[runtime]} dynamic batching, c={args.connections}",
                                      f"the transport (identity model, c={args.connections})", "limit", "rows/s",
                                      vs_transport))
        rows.append([runtime, RUNTIMES[runtime], C.summarize([w.rps for w in c1]).fmt(",.0f"),
                     C.summarize([w.p50_us for w in c1]).fmt(",.0f"),
                     C.summarize([i["p50_us"] for i in ip1]).fmt(",.1f"), C.summarize(overhead).fmt(",.0f"),
                     C.summarize([w.rps for w in bt]).fmt(",.0f"),
                     C.summarize([r["transport"].rps for r in rounds]).fmt(",.0f"),
                     C.summarize(vs_transport).fmt(".0%"),
                     C.summarize([i["rows_per_s"] for i in ipb]).fmt(",.0f")])
        for i, (w, b, a1, ab, r) in enumerate(zip(c1, bt, ip1, ipb, rounds), 1):
            csv_rows.append([runtime, i, f"{w.rps:.1f}", w.p50_us, w.p99_us, f"{a1['p50_us']:.2f}",
                             f"{a1['calls_per_s']:.1f}", f"{b.rps:.1f}", b.p50_us, b.p99_us,
                             f"{r['transport'].rps:.1f}", f"{ab['rows_per_s']:.1f}"])
    # The overhead claim as a ratio: the package's p50 overhead over TorchScript's, per round
    # (<= 1: the package costs no more to serve than the TorchScript module).
    ratio_rows.insert(0, C.ratio_row(
        "S14", "mlp_pt2 batch 1, c=1: p50 overhead over in-process", "TorchScript's overhead (mlp)", "limit",
        "µs/µs", [p / t for p, t in zip(overheads["pt2"], overheads["torchscript"])],
        note="lower is better: <= 1 means serving the package costs no more than serving TorchScript"))
    headers_md = ["runtime", "model", "batch-1 req/s (c=1)", "HTTP p50 µs", "in-process p50 µs",
                  "p50 overhead µs", f"batching rows/s (c={args.connections})",
                  f"transport req/s (identity, c={args.connections})", "of the transport's rate",
                  f"in-process rows/s (batch {args.max_batch})"]
    out_dir.mkdir(parents=True, exist_ok=True)
    C.write_csv(out_dir / f"{name}.csv", ["runtime", "round", "c1_rps", "c1_p50_us", "c1_p99_us",
                                         "inproc_b1_p50_us", "inproc_b1_calls_per_s", "batched_rows_per_s",
                                         "batched_p50_us", "batched_p99_us", "transport_rps",
                                         "inproc_batch_rows_per_s"], csv_rows)
    C.write_ratios(out_dir, name, ratio_rows)
    ratio = C.summarize([p / t for p, t in zip(overheads["pt2"], overheads["torchscript"])])
    lines = C.report_header("S14 — PyTorch 2 AOTInductor package beside TorchScript: overhead and dynamic "
                            "batching", args.quick, time.monotonic() - started) + [
        "Cells: median (min–max) over rounds. 'p50 overhead': the HTTP p50 at one connection minus the "
        "in-process p50 of the same file on the same batch-1 input; 'of the transport's rate': rows/s under "
        f"dynamic batching at {args.connections} connections as a share of the requests/s the server answers "
        "at the same load for a model of the identity backend (no model work).",
        "",
        C.markdown_table(headers_md, rows),
        f"The package's p50 overhead over TorchScript's, per round: {ratio.fmt('.2f')} (<= 1: no more "
        "costly to serve).",
        "",
        "## Method",
        "",
        "- openinfer: `python -m openinfer serve --threads 1 <repo>`, the repo made here: `mlp_pt2` "
        f"(`platform: \"torch_aoti\"`, the package of examples/models/mlp_pt2, {source}), `mlp` (the same network "
        "and weights as TorchScript, examples/models/mlp), both INTRA_OP_THREAD_COUNT 1; `<model>`: no "
        f"batching, `<model>_batched`: dynamic_batching, max_queue_delay 1000 µs, max_batch_size {args.max_batch}; "
        f"one {'CPU' if args.device == 'cpu' else 'GPU 0'} instance each; `{IDENTITY}`: `backend: \"identity\"`, FP32 [1, 16] in and out.",
        f"- In-process: `torch._inductor.aoti_load_package(path)(x)` and `module(x)` (torch {torch.__version__}, "
        "one thread, inference_mode), batch 1 and batch max_batch_size, on the server's CPU.",
        f"- Load: wrk on CPU {args.client_cpu} (`-c 1` for batch 1, `-c {args.connections}` for batching and the "
        "transport), HTTP with the binary tensor extension, batch-1 requests of zeros (the package's answer "
        f"checked equal to TorchScript's first); the server and the in-process runs on CPU {args.server_cpu}. "
        f"{args.rounds} rounds of {args.duration:g} s, runtimes in turn; the transport is measured right before "
        "each batched run, and each ratio is of that pair.",
        C.machine_line((load_before, load_after)),
        f"- Per-run numbers: `{name}.csv`; logs `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    C.write_report(name, out_dir, lines, "s14")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s14] interrupted; server stopped", file=sys.stderr)
        sys.exit(130)
