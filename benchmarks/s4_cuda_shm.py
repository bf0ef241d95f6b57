#!/usr/bin/env python3
"""S4 on a GPU: identity_fp32 fed with a torch CUDA tensor, through CUDA shared memory (the
client exports the tensor's allocation with cudaIpcGetMemHandle and registers it; the server
maps it and copies the bytes out once) against the paths a client without it takes: the tensor
copied to the host first (``x.cpu()``), then sent through system shared memory or the socket.
The limit is that one device-to-host copy alone, which every path must make (identity_fp32 is
a CPU model).

    python benchmarks/s4_cuda_shm.py [--quick] [--sizes 1M,16M,64M] [--seconds S] [--rounds N]

Contenders, per size, in turn for N rounds, each one sequential ``openinfer.Client.infer`` calls
from this process (pinned to --client-cpu; the server to --server-cpu):
  cuda ipc          Client(url).infer({"INPUT0": x_cuda}): CUDA shared memory in, the output
                    back through the client's system shared-memory pool
  host, shm         Client(url).infer({"INPUT0": x_cuda.cpu().numpy()})
  host, socket      Client(url, shared_memory=False), the same host copy, binary HTTP
  D2H copy          x_cuda.cpu() alone (the limit)
GB/s = requests x 2 x tensor bytes / wall time (request + response payload, as in S4); for the
limit, bytes copied / time. Needs torch with CUDA and a GPU. Results:
benchmarks/results/s4_cuda_shm.{md,csv} (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "s4_cuda_shm"
CONTENDERS = ("cuda ipc", "host, shm", "host, socket", "D2H copy")


def timed(fn, seconds: float, min_iters: int = 3) -> tuple[int, float, list[float]]:
    lat: list[float] = []
    start = time.perf_counter()
    end = start + seconds
    while len(lat) < min_iters or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return len(lat), time.perf_counter() - start, sorted(lat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 0.5 s per size")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per loop (default 2; quick 0.5)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5; quick 2)")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    rounds = args.rounds or (2 if args.quick else 5)
    sizes = C.parse_size_list(args.sizes)
    out = args.out or (C.RAW_DIR if args.quick else C.RESULTS_DIR)
    C.check_cpus(args.server_cpu, args.client_cpu)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: S4 on a GPU needs torch with CUDA and a visible GPU")
    import openinfer

    os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
    started, load_before = time.monotonic(), C.loadavg()
    raw_dir = C.RAW_DIR / NAME / time.strftime("%Y%m%d-%H%M%S")
    raw_dir.mkdir(parents=True, exist_ok=True)
    port = C.free_port()
    max_body = max(2 * max(sizes) + (1 << 20), 1 << 30)
    repo = C.make_tmpdir("oi-s4-cuda-")
    shutil.copytree(C.REPO_ROOT / "examples" / "models" / "identity_fp32", repo / "identity_fp32")
    server = C.openinfer_server(port, args.server_cpu, raw_dir / "openinfer.log",
                                extra=["--max-body-bytes", str(max_body), str(repo)])
    url = f"http://127.0.0.1:{port}"
    results: dict[tuple[int, str], list[float]] = {}
    p50: dict[tuple[int, str], list[float]] = {}
    with server, openinfer.Client(url) as shm_client, openinfer.Client(url, shared_memory=False) as sock_client:
        C.wait_http_ready(url + "/v2/health/ready", timeout=300, proc=server)
        for size in sizes:
            x = torch.arange(size // 4, dtype=torch.float32, device="cuda")
            want = x.cpu().numpy()
            calls = {
                "cuda ipc": lambda: shm_client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"],
                "host, shm": lambda: shm_client.infer("identity_fp32", {"INPUT0": x.cpu().numpy()})["OUTPUT0"],
                "host, socket": lambda: sock_client.infer("identity_fp32", {"INPUT0": x.cpu().numpy()})["OUTPUT0"],
            }
            for what, call in calls.items():  # checked before timing
                if not np.array_equal(np.asarray(call()), want):
                    raise SystemExit(f"error: {what} answered a different tensor at {C.fmt_size(size)}")
            if not shm_client._cuda_regions:
                raise SystemExit("error: the client did not take the CUDA shared-memory path")
            for rnd in range(rounds):
                for what in CONTENDERS:
                    fn = calls.get(what, lambda: x.cpu())
                    n, elapsed, lat = timed(fn, seconds)
                    moved = size if what == "D2H copy" else 2 * size
                    results.setdefault((size, what), []).append(n * moved / elapsed / 1e9)
                    p50.setdefault((size, what), []).append(lat[len(lat) // 2] * 1e6)
                print(f"[{NAME}] {C.fmt_size(size)} round {rnd + 1}: " + ", ".join(
                    f"{w} {results[(size, w)][-1]:.2f} GB/s" for w in CONTENDERS), flush=True)
    rows, csv_rows = [], []
    for size in sizes:
        ipc, shm, sock, d2h = (results[(size, w)] for w in CONTENDERS)
        rows.append([C.fmt_size(size), *(C.summarize(results[(size, w)]).fmt(".2f") for w in CONTENDERS),
                     C.summarize(C.paired_ratios(ipc, shm)).fmt(".2f"),
                     C.summarize(C.paired_ratios(ipc, sock)).fmt(".2f"),
                     C.summarize(C.paired_ratios(ipc, d2h)).fmt(".2f"),
                     C.summarize(p50[(size, "cuda ipc")]).fmt(",.0f"), C.summarize(p50[(size, "host, socket")]).fmt(",.0f")])
        for w in CONTENDERS:
            for i, (g, p) in enumerate(zip(results[(size, w)], p50[(size, w)]), 1):
                csv_rows.append([size, i, w, f"{g:.4f}", f"{p:.1f}"])
    out.mkdir(parents=True, exist_ok=True)
    C.write_csv(out / f"{NAME}.csv", ["size_bytes", "round", "what", "GBps", "p50_us"], csv_rows)
    lines = C.report_header(f"S4 on {torch.cuda.get_device_name(0)} — a CUDA tensor through CUDA shared memory",
                            args.quick, time.monotonic() - started) + [
        "GB/s: median (min–max) over rounds; ratios: median of per-round ratios (min–max).",
        "",
        C.markdown_table(["tensor", *(f"{w} GB/s" for w in CONTENDERS), "ipc / host shm", "ipc / host socket",
                          "ipc / D2H copy", "ipc p50 µs", "host socket p50 µs"], rows),
        "## Method",
        "",
        "- Work: `identity_fp32` (a CPU Python model returning its input), one FP32 tensor made on GPU 0 "
        "with torch; sequential `openinfer.Client.infer` calls from one thread; each path's answer checked "
        "equal to the tensor before timing.",
        "- cuda ipc: the client registers the tensor's allocation as a CUDA shared-memory region once "
        "(cudaIpcGetMemHandle) and names it in each request; the server copies the bytes to the host once "
        "(cudaMemcpy). host paths: `x.cpu().numpy()` per call, then the client's system shared memory or "
        "the binary HTTP socket. D2H copy: `x.cpu()` alone, pageable memory, bytes copied / time.",
        f"- GB/s = requests × 2 × tensor bytes / wall time. Server: `python -m openinfer serve --threads 1 "
        f"--max-body-bytes {max_body} <repo of identity_fp32>` on CPU {args.server_cpu}; client on CPU {args.client_cpu}; "
        f"{rounds} rounds of {seconds:g} s per contender and size, in turn.",
        f"- torch {torch.__version__}. " + C.machine_line((load_before, C.loadavg())).lstrip("- "),
        f"- Per-run numbers: `{NAME}.csv`.",
        "",
    ]
    C.write_report(NAME, out, lines, "s4-cuda")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
