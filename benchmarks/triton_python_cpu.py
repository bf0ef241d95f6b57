#!/usr/bin/env python3
"""Server CPU per request for python_backend's `add_sub` (TritonPythonModel) and the same
computation as an `infer()` model (`add_sub_infer`), HTTP JSON by wrk, one openinfer server per
checkout given (its `python/` directory), servers in turn. The server process's CPU time (user +
system, from /proc) over the requests wrk completed: unlike req/s, it hardly moves when other work
shares the machine, so a change's before and after show on a busy one.

    .venv/bin/python benchmarks/triton_python_cpu.py --roots /work/wt/base/python,python
                                                     [--concurrency 8] [--rounds 3] [--duration 3]
                                                     [--batching]

--batching: both models with max_batch_size 8 and dynamic_batching (add_sub's model.py is
unchanged; requests then send [1, 4]), so that concurrent requests reach execute as batches.

Prints, per model and checkout, the median CPU µs per request and each round's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import triton_python as T  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", required=True, help="comma-separated python/ directories, one server each")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--batching", action="store_true", help="max_batch_size 8 with dynamic_batching")
    args = ap.parse_args()
    tmp = C.make_tmpdir("oi-triton-python-cpu-")
    repo = T.repository(tmp / "repo", with_infer=True)
    if args.batching:
        for model in ("add_sub", "add_sub_infer"):
            config = repo / model / "config.pbtxt"
            config.write_text(config.read_text() + "\nmax_batch_size: 8\ndynamic_batching { }\n")
    servers = {}
    for i, root in enumerate(args.roots.split(",")):
        port = C.free_port()
        env = dict(os.environ, PYTHONPATH=str(Path(root).resolve()))
        server = C.openinfer_server(port, args.server_cpu, tmp / f"server{i}.log", extra=[str(repo)], env=env).start()
        C.wait_http_ready(f"http://127.0.0.1:{port}/v2/health/ready", 120)
        servers[root] = (server, port)
    per_request: dict[tuple[str, str], list[float]] = {}
    for model in ("add_sub", "add_sub_infer"):
        body = T.json_body(model).replace('"shape":[4]', '"shape":[1,4]') if args.batching else T.json_body(model)
        script = C.write_wrk_script(tmp / f"{model}.lua", "POST", body, {"Content-Type": "application/json"})
        for rnd in range(args.rounds + 1):  # round 0 warms up
            for root, (server, port) in servers.items():
                before = C.proc_cpu_seconds(server.pid)
                run = C.run_wrk(f"http://127.0.0.1:{port}/v2/models/{model}/infer", script, args.concurrency,
                                args.duration, args.client_cpu, servers=(server,))  # fmt: skip
                spent = C.proc_cpu_seconds(server.pid) - before
                if run.error:  # a failed request costs another CPU time than a served one
                    raise SystemExit(f"error: {model} on {root}: {run.error}")
                if rnd and run.requests:
                    per_request.setdefault((model, root), []).append(spent / run.requests * 1e6)
    for server, _ in servers.values():
        server.stop()
    batching = ", dynamic batching" if args.batching else ""
    print(f"HTTP JSON, c={args.concurrency}{batching}, {args.rounds} rounds of {args.duration:g} s; "
          f"load average {C.loadavg()}")
    print("| model | checkout | server CPU µs per request (median) | rounds |")
    print("|:---|:---|---:|:---|")
    for (model, root), values in per_request.items():
        print(f"| {model} | `{root}` | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
