#!/usr/bin/env python3
"""S1: model `simple` (INT32 [1,16] add/sub) over HTTP JSON, against the
physical limit (a static nginx `return 200` under the same wrk load) and the
peers (benchmarks/peers.py), side by side.

    .venv/bin/python benchmarks/s1_http_json.py [--quick] [--concurrency 1,8,64]
                                                 [--duration S] [--rounds N]

Protocol (../shared/BENCHMARKS.md): server(s) pinned to one core, wrk to the
other; per concurrency point both servers are warmed up, then measured
alternately A B A B for N rounds; the claim is the median of the per-round
ratios openinfer/nginx with min–max. Results go to benchmarks/results/
(s1_http_json.md, .csv, .png); --quick runs go to benchmarks/results/raw/
unless --out is given, so they never replace the full results.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import wrk_vs_nginx  # noqa: E402

NAME = "s1_http_json"
MODEL = "simple"
INFER_PATH = f"/v2/models/{MODEL}/infer"
LUA_SCRIPT = C.WRK_DIR / "s1_simple_json.lua"

INPUT0 = list(range(16))
INPUT1 = [1] * 16
# Byte-identical to the body in wrk/s1_simple_json.lua (checked below).
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": INPUT0},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": INPUT1},
]}, separators=(",", ":"))

SERVERS = ("openinfer", "nginx")


def lua_body(path: Path) -> str:
    """The wrk.body of the S1 Lua script (concatenated '...' pieces)."""
    text = path.read_text()
    m = re.search(r"wrk\.body\s*=(.*?)\n\s*\n", text, re.S)
    if not m:
        raise SystemExit(f"error: no wrk.body in {path}")
    return "".join(re.findall(r"'([^']*)'", m.group(1)))


def check_openinfer_answer(base: str) -> None:
    """One request whose outputs are verified before anything is measured."""
    status, raw = C.http_request(base + INFER_PATH, BODY.encode(), "POST",
                                 {"Content-Type": "application/json"})
    if status != 200:
        raise SystemExit(f"error: {base} answered HTTP {status}: {raw[:300]!r}")
    resp = json.loads(raw)
    outs = {o["name"]: o for o in resp.get("outputs", [])}
    want = {"OUTPUT0": [a + b for a, b in zip(INPUT0, INPUT1)],
            "OUTPUT1": [a - b for a, b in zip(INPUT0, INPUT1)]}
    for name, data in want.items():
        o = outs.get(name)
        if (o is None or o.get("datatype") != "INT32" or o.get("shape") != [1, 16]
                or o.get("data") != data):
            raise SystemExit(f"error: wrong {name} from {base}: {o!r}")


def check_nginx_answer(base: str) -> None:
    status, raw = C.http_request(base + INFER_PATH, BODY.encode(), "POST",
                                 {"Content-Type": "application/json"})
    if status != 200 or json.loads(raw) != {"ok": True}:
        raise SystemExit(f"error: nginx answered HTTP {status}: {raw[:300]!r}")


def main(argv: list[str] | None = None) -> int:
    args = C.wrk_args(__doc__, argv)
    if lua_body(LUA_SCRIPT) != BODY:
        raise SystemExit(f"error: body in {LUA_SCRIPT} differs from the one verified here")
    return wrk_vs_nginx.run_wrk_vs_nginx(C.WrkScenario(
        name=NAME, tag="s1", title="S1 — `simple` over HTTP JSON",
        plot_title="S1: simple, HTTP JSON (median, min–max)",
        path=INFER_PATH, script=LUA_SCRIPT,
        check_openinfer=check_openinfer_answer, check_nginx=check_nginx_answer,
        peers=("triton", "pytriton", "mlserver", "kserve"),
        work=[f"- Work: `POST {INFER_PATH}`, V2 JSON body ({len(BODY)} bytes: INPUT0 = "
              "0..15, INPUT1 = ones, INT32 [1,16]), `Content-Type: application/json`, "
              f"sent by wrk with `{LUA_SCRIPT.relative_to(C.REPO_ROOT)}`. The openinfer "
              "answer is verified (OUTPUT0 = INPUT0+INPUT1, OUTPUT1 = INPUT0−INPUT1) "
              "before and after the load."]), args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s1] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
