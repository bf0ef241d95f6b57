#!/usr/bin/env python3
"""Executors under SCHED_BATCH against the kernel's normal policy, side by side in one run
(issue 19 item 2: the hand-offs between a loop and an executor sharing a CPU).

    .venv/bin/python benchmarks/executor_policy.py [--quick] [--duration S] [--rounds N]
                                                  [--warmup S] [--concurrency 1,8,64]

Two openinfer servers (`python -m openinfer serve --threads 1`, the example repository, both
pinned to --server-cpu, so the loop and the executor share that CPU), one started with
OPENINFER_EXECUTOR_SCHED=normal (executors keep the normal policy), one as shipped (executors
SCHED_BATCH: waking one does not preempt the loop that woke it). wrk (pinned to --client-cpu)
sends Triton's `simple` as HTTP JSON to each in turn for --duration seconds (after --warmup
seconds discarded per server and concurrency), N rounds per concurrency. The figure is the median of per-round ratios batch / normal (min-max), with each
server's CPU time per request. Results: benchmarks/results/executor_policy.{md,csv} (--quick:
results/raw/).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "executor_policy"
POLICIES = ("normal", "batch")


def main() -> int:
    a = C.wrk_args(__doc__)
    C.check_cpus(a.server_cpu, a.client_cpu)
    started, load_before = time.monotonic(), C.loadavg()
    out_dir = a.out
    tmp = C.make_tmpdir("oi-policy-")
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]})
    script = C.write_wrk_script(tmp / "req.lua", "POST", body, {"Content-Type": "application/json"},
                                comment=["executor_policy benchmark request"])
    servers, urls = {}, {}
    for policy in POLICIES:
        env = {k: v for k, v in os.environ.items() if k != "OPENINFER_EXECUTOR_SCHED"}
        if policy == "normal":
            env["OPENINFER_EXECUTOR_SCHED"] = "normal"
        port = C.free_port()
        servers[policy] = C.openinfer_server(port, a.server_cpu, tmp / f"{policy}.log")
        servers[policy].env = env
        urls[policy] = f"http://127.0.0.1:{port}"
    rows, csv_rows = [], []
    try:
        for policy in POLICIES:
            servers[policy].start()
            C.wait_http_ready(urls[policy] + "/v2/health/ready", proc=servers[policy])
            status, _, answer = C.http_request_full(urls[policy] + "/v2/models/simple/infer", body.encode(), "POST",
                                                    headers={"Content-Type": "application/json"})
            if status != 200 or json.loads(answer)["outputs"][0]["data"] != [i + 1 for i in range(16)]:
                raise SystemExit(f"{policy}: unexpected answer {status} {answer[:200]!r}")
        for conns in a.concurrency:
            for policy in POLICIES:
                if a.warmup:
                    C.run_wrk(urls[policy] + "/v2/models/simple/infer", script, conns, a.warmup, a.client_cpu,
                              label=policy, servers=[servers[policy]])
            rates: dict[str, list[float]] = {p: [] for p in POLICIES}
            cpu_us: dict[str, list[float]] = {p: [] for p in POLICIES}
            for r in range(a.rounds):
                for policy in POLICIES:
                    server = servers[policy]
                    cpu0 = C.proc_cpu_seconds(server.proc.pid)
                    res = C.run_wrk(urls[policy] + "/v2/models/simple/infer", script, conns, a.duration,
                                    a.client_cpu, label=policy, servers=[server])
                    cpu1 = C.proc_cpu_seconds(server.proc.pid)
                    if res.error or res.non2xx:
                        raise SystemExit(f"{policy} c={conns}: {res.error or f'{res.non2xx} non-2xx answers'}")
                    rates[policy].append(res.rps)
                    cpu_us[policy].append(1e6 * (cpu1 - cpu0) / max(1, res.requests))
                    print(f"[{NAME}] c={conns} round {r + 1}/{a.rounds} {policy:6} {res.rps:10,.0f} req/s "
                          f"p50 {res.p50_us:.0f} us, server CPU {cpu_us[policy][-1]:.1f} us/req", flush=True)
            ratio = C.summarize(C.paired_ratios(rates["batch"], rates["normal"]))
            med = {p: C.summarize(rates[p]).median for p in POLICIES}
            cpu = {p: C.summarize(cpu_us[p]).median for p in POLICIES}
            rows.append([conns, f"{med['normal']:,.0f}", f"{med['batch']:,.0f}",
                         f"{ratio.median:.2f} ({ratio.lo:.2f}–{ratio.hi:.2f})",
                         f"{cpu['normal']:.1f}", f"{cpu['batch']:.1f}"])
            csv_rows.append([conns, med["normal"], med["batch"], ratio.median, ratio.lo, ratio.hi,
                             cpu["normal"], cpu["batch"]])
    finally:
        for server in servers.values():
            server.stop()
    headers = ["concurrency", "normal req/s", "SCHED_BATCH req/s", "batch / normal",
               "server CPU µs/req normal", "server CPU µs/req batch"]
    lines = C.report_header("Executors under SCHED_BATCH vs the normal policy", a.quick,
                            time.monotonic() - started)
    lines += [C.markdown_table(headers, rows), "", "## Method", "",
              f"- Servers: `{servers['batch'].command}` and the same with OPENINFER_EXECUTOR_SCHED=normal, "
              f"both on CPU {a.server_cpu} (one loop thread and the model's executor share it); wrk "
              f"`-t 1` on CPU {a.client_cpu}, {a.rounds} rounds of {a.duration:g} s per concurrency, the "
              "servers in turn; HTTP JSON `simple` (INT32 [1,16] add/sub, a Python model).",
              C.machine_line((load_before, C.loadavg())), ""]
    C.write_report(NAME, out_dir, lines, NAME)
    C.write_csv(out_dir / f"{NAME}.csv", ["concurrency", "normal_rps", "batch_rps", "ratio", "ratio_min",
                                         "ratio_max", "normal_cpu_us", "batch_cpu_us"], csv_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
