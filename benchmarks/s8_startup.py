#!/usr/bin/env python3
"""S8: start-up. `openinfer serve` from spawn to ready, `import openinfer`, and idle memory,
against Triton (PyTriton), MLServer and KServe serving the same two models.

    .venv/bin/python benchmarks/s8_startup.py [--quick] [--rounds N] [--peers pytriton,mlserver,kserve]

Per round, each server in turn (A B C D A B C D): spawn it pinned to --server-cpu, poll
(every 5 ms, from --client-cpu) until /v2/health/ready answers 200 and both models
(`simple`, `identity_fp32`) answer ready; that time is "ready". Then 2 s idle, and the memory of
the whole process tree (the server and every descendant: PyTriton's tritonserver, its Python
stubs and helpers; KServe's gRPC process) is read from /proc: the sum of RSS and the sum of
PSS (shared pages split among the sharers, so it does not double count). Then it is stopped.
openinfer serves a repository holding only those two example models, as the peers do.

Import time: `python -c "import X"` minus `python -c "pass"` in the same interpreter (the
wall time of each, median of --imports runs alternated across packages): openinfer, pytriton
(`pytriton.triton`), mlserver, kserve.

Results: benchmarks/results/s8_startup.{md,csv,ratios.json}; --quick to results/raw/.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers as PEERS  # noqa: E402

NAME = "s8_startup"
T = "s8"
MODELS = ("simple", "identity_fp32")
IMPORTS = {"openinfer": "openinfer", "pytriton": "pytriton.triton", "mlserver": "mlserver",
           "kserve": "kserve"}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, 3 import runs (< 1 min)")
    ap.add_argument("--rounds", type=int, help="start-ups per server (default 3; quick 1)")
    ap.add_argument("--imports", type=int, help="import timings per package (default 7; quick 3)")
    ap.add_argument("--idle", type=float, default=2.0, help="seconds idle before reading memory")
    ap.add_argument("--peers", default=None, help="comma-separated peers (default "
                    "pytriton,mlserver,kserve; 'none')")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.imports = a.imports or (3 if a.quick else 7)
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    return a


def tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory_mb(pid: int) -> tuple[float, float, int]:
    """(sum RSS MB, sum PSS MB, number of processes) of pid's process tree."""
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup", encoding="ascii") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss / 1024, pss / 1024, len(pids)


def ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
        try:
            for path in ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in MODELS)]:
                conn.request("GET", path)
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    return False
            return True
        finally:
            conn.close()
    except OSError:
        return False


def openinfer_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    for m in MODELS:
        shutil.copytree(C.REPO_ROOT / "examples" / "models" / m, repo / m,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def one_start(name: str, args, raw_dir: Path, repo: Path, rnd: int) -> dict:
    http_port, grpc_port = C.free_port(), C.free_port()
    work = raw_dir / f"{name}-r{rnd}"
    work.mkdir(parents=True, exist_ok=True)
    if name == "openinfer":
        argv = [sys.executable, "-m", "openinfer", "serve", str(repo), "--host", "127.0.0.1",
                "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--threads", "1",
                "--log-level", "warning"]
        env, cwd = None, C.REPO_ROOT
    else:
        argv, env, cwd, _ = PEERS.peer_argv(name, http_port, grpc_port, work)
    proc = C.ServerProcess(name, argv, args.server_cpu, work / "server.log", cwd=cwd, env=env,
                           stop_signal=2)
    res = {"server": name, "round": rnd, "ready_ms": float("nan"), "rss_mb": float("nan"),
           "pss_mb": float("nan"), "procs": 0, "error": None,
           "command": " ".join(os.path.relpath(a, C.REPO_ROOT) if a.startswith(str(C.REPO_ROOT))
                               else a for a in argv)}
    t0 = time.monotonic()
    proc.start()
    try:
        deadline = t0 + 300
        while not ready(http_port):
            if not proc.alive():
                res["error"] = f"exited rc={proc.returncode()}: {proc.log_tail(5)}"
                return res
            if time.monotonic() > deadline:
                res["error"] = "not ready in 300 s"
                return res
            time.sleep(0.005)
        res["ready_ms"] = (time.monotonic() - t0) * 1e3
        time.sleep(args.idle)
        res["rss_mb"], res["pss_mb"], res["procs"] = memory_mb(proc.pid)
    finally:
        proc.stop(timeout=30)
    return res


def import_times(pythons: dict[str, str], n: int, cpu: str) -> dict[str, list[float]]:
    """Per package: wall ms of `python -c "import X"` minus `python -c "pass"`, n runs each,
    alternated across packages; pinned to cpu."""
    out: dict[str, list[float]] = {k: [] for k in pythons}

    def wall(py: str, code: str) -> float:
        t = time.perf_counter()
        r = subprocess.run(["taskset", "-c", cpu, py, "-c", code], capture_output=True,
                           text=True, cwd="/", timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{py} -c {code!r}: {r.stderr.strip()[-300:]}")
        return (time.perf_counter() - t) * 1e3

    for name, py in pythons.items():  # warm the page cache
        wall(py, f"import {IMPORTS[name]}")
    for _ in range(n):
        for name, py in pythons.items():
            base = wall(py, "pass")
            out[name].append(wall(py, f"import {IMPORTS[name]}") - base)
    return out


def main() -> int:
    args = parse_args()
    C.check_cpus(args.server_cpu, args.client_cpu)
    os.sched_setaffinity(0, {int(args.client_cpu.split(",")[0])})
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), C.loadavg()
    tmp = C.make_tmpdir("oi-s8-")
    repo = openinfer_repo(tmp)
    names = ["openinfer"]
    problems: list[str] = []
    versions = {"openinfer": "openinfer (this checkout)"}
    for n in C.peer_list(args.peers, ["pytriton", "mlserver", "kserve"]):
        if n not in IMPORTS:
            raise SystemExit(f"error: S8 runs openinfer and {', '.join(list(IMPORTS)[1:])}, not {n!r}")
        try:
            py = PEERS.ensure_venv(PEERS.VENV_OF[n], PEERS.REQUIREMENTS[PEERS.VENV_OF[n]])
            dist = PEERS.DIST_OF[n]
            versions[n] = f"{dist} {PEERS._pkg_version(py, dist)}"
            names.append(n)
        except PEERS.PeerUnavailable as e:
            problems.append(f"{PEERS.LABELS[n]} cannot run here: {e}")
    label = {"openinfer": "openinfer", **PEERS.LABELS}
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rnd in range(1, args.rounds + 1):
        for n in names:  # A B C D
            r = one_start(n, args, raw_dir, repo, rnd)
            results[n].append(r)
            print(f"[{T}] round {rnd}/{args.rounds} {n:<9} ready {r['ready_ms']:>8.0f} ms  RSS "
                  f"{r['rss_mb']:>7.1f} MB  PSS {r['pss_mb']:>7.1f} MB  ({r['procs']} processes)"
                  f"  {r['error'] or 'ok'}", flush=True)
    pythons = {"openinfer": sys.executable,
               **{n: str(PEERS.venv_python(PEERS.VENV_OF[n])) for n in names if n != "openinfer"}}
    try:
        imp = import_times(pythons, args.imports, args.server_cpu)
    except RuntimeError as e:
        problems.append(f"import timing failed: {e}")
        imp = {}
    shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started

    # ---- report ----
    rows, csv_rows, ratio_rows = [], [], []
    oi = results["openinfer"]
    for n in names:
        runs = results[n]
        bad = [r for r in runs if r["error"]]
        if bad:
            problems.append(f"{label[n]}: {bad[0]['error']}")
        cells = []
        for key, spec in (("ready_ms", ",.0f"), ("rss_mb", ",.0f"), ("pss_mb", ",.0f")):
            s = C.summarize([r[key] for r in runs if not r["error"]])
            if n == "openinfer" or bad:
                ratio = "1" if n == "openinfer" else "–"
            else:
                rs = C.paired_ratios([r[key] for r in oi], [r[key] for r in runs])
                ratio = C.summarize(rs).fmt(".2f")
                what = {"ready_ms": "serve → ready (ms)", "rss_mb": "idle RSS (MB)",
                        "pss_mb": "idle PSS (MB)"}[key]
                ratio_rows.append(C.ratio_row("S8", what, label[n], "peer", key, rs,
                                              note="lower is better"))
            cells += [s.fmt(spec), ratio]
        im = C.summarize(imp.get(n, []))
        if n != "openinfer" and imp.get(n) and imp.get("openinfer"):
            rs = C.paired_ratios(imp["openinfer"], imp[n])
            im_ratio = C.summarize(rs).fmt(".2f")
            ratio_rows.append(C.ratio_row("S8", "import (ms)", label[n], "peer", "import_ms", rs,
                                          note="lower is better"))
        else:
            im_ratio = "1" if n == "openinfer" else "–"
        rows.append([label[n], *cells, im.fmt(",.0f"), im_ratio,
                     str(runs[0]["procs"]) if runs else ""])
        csv_rows += [[n, r["round"], f"{r['ready_ms']:.1f}", f"{r['rss_mb']:.1f}",
                      f"{r['pss_mb']:.1f}", r["procs"], r["error"] or ""] for r in runs]
        csv_rows += [[n, f"import{i}", "", "", "", "", f"import_ms={v:.1f}"]
                     for i, v in enumerate(imp.get(n, []))]
    out: Path = args.out
    C.write_csv(out / f"{NAME}.csv", ["server", "round", "ready_ms", "rss_mb", "pss_mb",
                                       "processes", "error_or_note"], csv_rows)
    C.write_ratios(out, NAME, ratio_rows)
    cmds = [f"- {label[n]} ({versions[n]}): `{results[n][0]['command']}`" for n in names
            if results[n]]
    lines = C.report_header("S8 — start-up, import time, idle memory", args.quick, elapsed) + [
        "**openinfer/X** = median of per-round ratios (min–max); here lower is better, so a "
        "ratio below 1 means openinfer is that many times quicker or smaller. Other cells: "
        "median (min–max) over rounds.",
        "",
        C.markdown_table(["server", "serve → ready ms", "openinfer/X", "idle RSS MB (tree)",
                          "openinfer/X", "idle PSS MB (tree)", "openinfer/X", "import ms",
                          "openinfer/X", "processes"], rows),
        "## Method",
        "",
        f"- Ready: wall time from spawn (`taskset -c {args.server_cpu}`) until "
        "`/v2/health/ready` and `/v2/models/{simple,identity_fp32}/ready` all answer 200, "
        f"polled every 5 ms from CPU {args.client_cpu}. {args.rounds} rounds, servers in turn.",
        f"- Memory: after {args.idle:g} s idle, the sum over the server's process tree of RSS "
        "and of PSS (`/proc/<pid>/smaps_rollup`). RSS double counts pages shared between "
        "the processes of one tree (PyTriton's several Python processes); PSS does not.",
        f"- Import: `python -c 'import X'` minus `python -c pass`, pinned to CPU "
        f"{args.server_cpu}, {args.imports} runs alternated across packages after one "
        "discarded warm run each; X = " + ", ".join(f"`{v}` ({k})" for k, v in IMPORTS.items()
                                                   if k in names) + ".",
        "- openinfer serves a repository with only `simple` and `identity_fp32` (copied from "
        "examples/models), the models the peers serve; no TorchScript model is loaded by "
        "anyone here.",
        *cmds,
        C.machine_line((load_before, C.loadavg())),
        f"- Per-run numbers: `{NAME}.csv`; server logs: `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    lines += C.problems_section(problems)
    C.write_report(NAME, out, lines, T)
    print("\n" + C.markdown_table(["server", "ready ms", "oi/X", "RSS MB", "oi/X", "PSS MB",
                                   "oi/X", "import ms", "oi/X", "procs"], rows), flush=True)
    return 1 if any(r["error"] for r in oi) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n[{T}] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
