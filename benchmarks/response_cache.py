#!/usr/bin/env python3
"""The response cache: answers per second of a model whose every request hits the cache
against the same model run each time, side by side in one run.

    .venv/bin/python benchmarks/response_cache.py [--quick] [--duration S] [--rounds N] [--concurrency 1,8]

One openinfer server (`python -m openinfer serve --cache-config local,size=64MiB`, one loop
thread, pinned to --server-cpu) serves a temporary repository with two identical Python models
on FP32 [256] (Y = tanh(X) summed over 20 passes of numpy work, a model of about 0.1 ms):
`plain`, and `cached` with `response_cache { enable: true }`. wrk (pinned to --client-cpu)
sends the same HTTP JSON request to each for --duration seconds, alternating, N rounds per
concurrency; after its first request every `cached` answer is a hit. The figure is the median
of the per-round ratios cached / plain (min-max). Every answer is checked equal before the runs.
Results: benchmarks/results/response_cache.{md,csv} (--quick: benchmarks/results/raw/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NAME = "response_cache"
MODEL = """import numpy as np


def infer(inputs):
    x = inputs["X"]
    y = np.zeros_like(x)
    for _ in range(20):
        y += np.tanh(x)
    return {"Y": y}
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 256 ] }} ]
{extra}
"""


def write_repo(root: Path) -> None:
    for name, extra in (("plain", ""), ("cached", "response_cache { enable: true }")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=C.parse_int_list, default=[1, 8])
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    a = ap.parse_args()
    if a.quick:
        a.duration, a.rounds = 2.0, 1
    C.check_cpus(a.server_cpu, a.client_cpu)
    out_dir = C.RAW_DIR if a.quick else C.RESULTS_DIR
    tmp = C.make_tmpdir("oi-rcache-")
    repo = tmp / "repo"
    write_repo(repo)
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [256],
                                   "data": [round(i / 256, 4) for i in range(256)]}]})
    script = C.write_wrk_script(tmp / "req.lua", "POST", body, {"Content-Type": "application/json"},
                                comment=["response_cache benchmark request"])
    port = C.free_port()
    server = C.openinfer_server(port, a.server_cpu, tmp / "server.log",
                                extra=[str(repo), "--cache-config", f"local,size={64 << 20}"])
    rows, csv_rows = [], []
    with server:
        url = f"http://127.0.0.1:{port}"
        C.wait_http_ready(url + "/v2/health/ready", proc=server)
        answers = {m: C.http_request(f"{url}/v2/models/{m}/infer", body.encode(),
                                     headers={"Content-Type": "application/json"}) for m in ("plain", "cached")}
        if answers["plain"][0] != 200 or json.loads(answers["plain"][1])["outputs"] != json.loads(
                answers["cached"][1])["outputs"]:
            raise SystemExit(f"the models' answers differ: {answers}")
        for conns in a.concurrency:
            rates: dict[str, list[float]] = {"plain": [], "cached": []}
            for r in range(a.rounds):
                for m in ("plain", "cached"):
                    res = C.run_wrk(f"{url}/v2/models/{m}/infer", script, conns, a.duration, a.client_cpu,
                                    label=m, servers=[server])
                    if res.error or res.non2xx:
                        raise SystemExit(f"{m} c={conns}: {res.error or f'{res.non2xx} non-2xx answers'}")
                    rates[m].append(res.rps)
                    print(f"[{NAME}] c={conns} round {r + 1}/{a.rounds} {m:6} {res.rps:10.0f} answers/s "
                          f"p50 {res.p50_us:.0f} us", flush=True)
            ratio = C.summarize(C.paired_ratios(rates["cached"], rates["plain"]))
            plain, cached = C.summarize(rates["plain"]), C.summarize(rates["cached"])
            rows.append([conns, f"{plain.median:,.0f}", f"{cached.median:,.0f}",
                         f"{ratio.median:.2f} ({ratio.lo:.2f}-{ratio.hi:.2f})"])
            csv_rows.append([conns, plain.median, cached.median, ratio.median, ratio.lo, ratio.hi])
        stats = json.loads(C.http_request(f"{url}/v2/models/cached/stats")[1])["model_stats"][0]["inference_stats"]
    headers = ["concurrency", "plain answers/s", "cached answers/s", "cached / plain"]
    table = C.markdown_table(headers, rows)
    note = (f"cache hits {stats['cache_hit']['count']:,}, misses {stats['cache_miss']['count']:,}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {C.loadavg()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{NAME}.md").write_text(f"# Response cache: every request a hit vs the model run each time\n\n"
                                        f"`benchmarks/response_cache.py`: {__doc__.splitlines()[0]}\n\n"
                                        f"{table}\n\n{note}\n")
    C.write_csv(out_dir / f"{NAME}.csv", ["concurrency", "plain_rps", "cached_rps", "ratio", "ratio_min",
                                         "ratio_max"], csv_rows)
    print(table)
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
