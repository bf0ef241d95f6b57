#!/usr/bin/env python3
"""S2: model `simple` (INT32 [1,16] add/sub) over HTTP with the binary tensor
data extension, against the physical limit (a static nginx `return 200` under
the same wrk load) and the peers
(benchmarks/peers.py: Triton run directly, Triton through PyTriton, KServe; MLServer is
tried and left out with its answer when it does not speak the extension), side by side.

    .venv/bin/python benchmarks/s2_http_binary.py [--quick] [--concurrency 1,8,64]
                                                   [--duration S] [--rounds N]

The request is the exact one tritonclient.http sends for binary inputs and
binary outputs: a JSON header (inputs with `binary_data_size`, outputs with
`binary_data: true`) followed by the raw little-endian INT32 tensors, with
`Inference-Header-Content-Length` and geventhttpclient's User-Agent (wrk adds
Host and Content-Length, as geventhttpclient does). The body is built here,
with tritonclient's own encoder when it is importable, and written into
wrk/s2_simple_binary.lua (regenerated on every run; deterministic).

Protocol as S1 (see s1_http_json.py and ../shared/BENCHMARKS.md). Results go
to benchmarks/results/s2_http_binary.{md,csv,png}; --quick runs to
benchmarks/results/raw/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import wrk_vs_nginx  # noqa: E402

NAME = "s2_http_binary"
MODEL = "simple"
INFER_PATH = f"/v2/models/{MODEL}/infer"
LUA_SCRIPT = C.WRK_DIR / "s2_simple_binary.lua"
USER_AGENT = "python/gevent-http-client-2.6.1"  # what tritonclient 2.x sends

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)


def build_body() -> tuple[bytes, int, str]:
    """(body, JSON header length, how it was built)."""
    header = json.dumps({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
             "parameters": {"binary_data_size": INPUT0.nbytes}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
             "parameters": {"binary_data_size": INPUT1.nbytes}}],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()
    ours = header + INPUT0.astype("<i4").tobytes() + INPUT1.astype("<i4").tobytes()
    try:
        import tritonclient.http as http
    except ImportError:
        return ours, len(header), "built here (tritonclient not importable)"
    i0 = http.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_data_from_numpy(INPUT0, binary_data=True)
    i1 = http.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_data_from_numpy(INPUT1, binary_data=True)
    outs = [http.InferRequestedOutput("OUTPUT0", binary_data=True),
            http.InferRequestedOutput("OUTPUT1", binary_data=True)]
    body, json_size = http.InferenceServerClient.generate_request_body(
        [i0, i1], outputs=outs)
    if body != ours or json_size != len(header):
        raise SystemExit("error: tritonclient's request body differs from the one "
                         f"built here:\n{body!r}\n{ours!r}")
    return body, json_size, "tritonclient.http generate_request_body (checked equal)"


BODY, JSON_SIZE, BODY_SOURCE = build_body()
HEADERS = {"User-Agent": USER_AGENT,
           "Inference-Header-Content-Length": str(JSON_SIZE)}


def check_openinfer_answer(base: str) -> None:
    """One request whose binary outputs are verified."""
    status, hdrs, raw = C.http_request_full(base + INFER_PATH, BODY, "POST", HEADERS)
    if status != 200:
        raise SystemExit(f"error: {base} answered HTTP {status}: {raw[:300]!r}")
    try:
        hlen = int(hdrs["inference-header-content-length"])
    except (KeyError, ValueError):
        raise SystemExit(f"error: no Inference-Header-Content-Length in {hdrs}")
    head = json.loads(raw[:hlen])
    off, got = hlen, {}
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None or o.get("datatype") != "INT32" or o.get("shape") != [1, 16]:
            raise SystemExit(f"error: output not binary INT32 [1,16]: {o!r}")
        got[o["name"]] = np.frombuffer(raw[off:off + size], dtype="<i4").reshape(1, 16)
        off += size
    if off != len(raw):
        raise SystemExit(f"error: body is {len(raw)} bytes, outputs end at {off}")
    want = {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}
    for name, arr in want.items():
        if name not in got or not np.array_equal(got[name], arr):
            raise SystemExit(f"error: wrong {name} from {base}: {got.get(name)!r}")


def check_nginx_answer(base: str) -> None:
    status, raw = C.http_request(base + INFER_PATH, BODY, "POST", HEADERS)
    if status != 200 or json.loads(raw) != {"ok": True}:
        raise SystemExit(f"error: nginx answered HTTP {status}: {raw[:300]!r}")


def main(argv: list[str] | None = None) -> int:
    args = C.wrk_args(__doc__, argv)
    C.write_wrk_script(LUA_SCRIPT, "POST", BODY, HEADERS, comment=[
        "S2: KServe V2 binary tensor request for `simple` (INPUT0 = 0..15,",
        "INPUT1 = ones, INT32 [1,16]; binary outputs requested), byte for byte",
        "what tritonclient.http sends. Written by benchmarks/s2_http_binary.py."])
    return wrk_vs_nginx.run_wrk_vs_nginx(C.WrkScenario(
        name=NAME, tag="s2", title="S2 — `simple` over HTTP, binary tensor extension",
        plot_title="S2: simple, HTTP binary tensors (median, min–max)",
        path=INFER_PATH, script=LUA_SCRIPT,
        check_openinfer=check_openinfer_answer, check_nginx=check_nginx_answer,
        peers=("triton", "pytriton", "kserve", "mlserver"),
        work=[f"- Work: `POST {INFER_PATH}`, {len(BODY)}-byte body = {JSON_SIZE}-byte "
              "JSON header (inputs with `binary_data_size` 64, outputs with "
              "`binary_data: true`) + 2 × 64 bytes of raw INT32 (INPUT0 = 0..15, "
              f"INPUT1 = ones, [1,16]); headers `Inference-Header-Content-Length: "
              f"{JSON_SIZE}`, `User-Agent: {USER_AGENT}` — the bytes tritonclient.http "
              f"sends ({BODY_SOURCE}), sent by wrk with "
              f"`{LUA_SCRIPT.relative_to(C.REPO_ROOT)}`. The openinfer answer (JSON "
              "header + binary OUTPUT0 = INPUT0+INPUT1, OUTPUT1 = INPUT0−INPUT1) is "
              "verified before and after the load."]), args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[s2] interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
