#!/usr/bin/env python3
"""S13: S1's request (two INT32 [1,16] inputs, HTTP JSON) to a model of Triton's identity
backend, which openinfer serves in C (answering each input as its output, on the loop that
read the request): the server with no model work, against the physical limit (a static
nginx `return 200` under the same wrk load), side by side. S1 measures the same with the
Python `simple` model.

    .venv/bin/python benchmarks/s13_identity.py [--quick] [--concurrency 1,8,64]
                                                 [--duration S] [--rounds N]

Protocol as S1 (../shared/BENCHMARKS.md): both servers pinned to one core, wrk to the other,
warmed up, then measured alternately for N rounds; the claim is the median of the per-round
ratios openinfer/nginx with min–max. No peer: the Triton wheel ships only its Python backend.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import wrk_vs_nginx  # noqa: E402
import s1_http_json as S1  # noqa: E402

NAME = "s13_identity"
MODEL = "identity_int32"
INFER_PATH = f"/v2/models/{MODEL}/infer"
CONFIG = f"""
name: "{MODEL}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }} ]
"""


def repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    return root


def check_openinfer_answer(base: str) -> None:
    status, raw = C.http_request(base + INFER_PATH, S1.BODY.encode(), "POST",
                                 {"Content-Type": "application/json"})
    if status != 200:
        raise SystemExit(f"error: {base} answered HTTP {status}: {raw[:300]!r}")
    outs = {o["name"]: o for o in json.loads(raw).get("outputs", [])}
    for name, data in (("OUTPUT0", S1.INPUT0), ("OUTPUT1", S1.INPUT1)):
        o = outs.get(name)
        if o is None or o.get("datatype") != "INT32" or o.get("shape") != [1, 16] or o.get("data") != data:
            raise SystemExit(f"error: wrong {name} from {base}: {o!r}")


def main(argv: list[str] | None = None) -> int:
    args = C.wrk_args(__doc__, argv)
    if S1.lua_body(S1.LUA_SCRIPT) != S1.BODY:
        raise SystemExit(f"error: body in {S1.LUA_SCRIPT} differs from the one verified here")
    with tempfile.TemporaryDirectory(prefix="openinfer-s13-") as tmp:
        return wrk_vs_nginx.run_wrk_vs_nginx(C.WrkScenario(
            name=NAME, tag="s13", title="S13 — S1's request to the C identity backend over HTTP JSON",
            plot_title="S13: identity (C), HTTP JSON (median, min–max)",
            path=INFER_PATH, script=S1.LUA_SCRIPT,
            check_openinfer=check_openinfer_answer, check_nginx=S1.check_nginx_answer,
            peers=(), serve_args=(str(repository(Path(tmp))),),
            work=[f"- Work: `POST {INFER_PATH}`, S1's V2 JSON body ({len(S1.BODY)} bytes: INPUT0 = "
                  "0..15, INPUT1 = ones, INT32 [1,16]), sent by wrk with "
                  f"`{S1.LUA_SCRIPT.relative_to(C.REPO_ROOT)}`, to a model of " '`backend: "identity"` '
                  
                  "(OUTPUT0 = INPUT0, OUTPUT1 = INPUT1, verified before and after the load)."]), args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s13] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
