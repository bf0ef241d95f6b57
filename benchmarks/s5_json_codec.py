#!/usr/bin/env python3
"""S5: the V2 JSON codec alone — decode and encode of a 1M-element FP32 and INT64 request
body — openinfer's C codec against orjson + numpy and Python's json + numpy.

    .venv/bin/python benchmarks/s5_json_codec.py [--quick] [--elements N] [--seconds S] [--rounds N]

openinfer: benchmarks/c/json_codec_bench.c, compiled here with -O2 against csrc/codec/json_*.c, num.c
and the core modules it uses (no server, no Python): decode = oi_json_decode_infer_request
(body → packed little-endian tensor), encode = oi_json_encode_infer_response of the decoded
tensor as an output (tensor → JSON response). Python, in the benchmark tools venv
(benchmarks/.venvs/tools): decode = loads + numpy.asarray(data, dtype); encode = dumps of the
same response object (orjson with OPT_SERIALIZE_NUMPY on the array; json on array.tolist()).
Every contender gets the same body bytes (written once by orjson); each encoder's output is
parsed back and checked equal to the input values. All runs pinned to --cpu; per round each
contender runs in turn (A B C A B C), each for at least S seconds and 3 iterations; the figure
per round is the median time of one operation. Claims: medians of per-round ratios (min–max).

Results: benchmarks/results/s5_json_codec.{md,csv,ratios.json}; --quick to results/raw/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers as PEERS  # noqa: E402

NAME = "s5_json_codec"
T = "s5"
DRIVER_SRC = C.BENCH_DIR / "c" / "json_codec_bench.c"
CODEC_SOURCES = ["csrc/core/buf.c", "csrc/core/budget.c", "csrc/core/dtype.c", "csrc/core/status.c",
                 "csrc/core/tensor.c", "csrc/codec/json_decode.c", "csrc/codec/json_encode.c",
                 "csrc/codec/json_params.c", "csrc/codec/num.c"]
DTYPES = ("FP32", "INT64")

PY_BENCH = r'''
import json, sys, time
import numpy as np
import orjson
lib, path, dtype, seconds, check_out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
body = open(path, "rb").read()
npt = {"FP32": np.float32, "INT64": np.int64}[dtype]
if lib == "orjson":
    loads = orjson.loads
    def dumps(arr):
        return orjson.dumps({"model_name": "m", "model_version": "1", "outputs": [
            {"name": "INPUT0", "datatype": dtype, "shape": list(arr.shape), "data": arr}]},
            option=orjson.OPT_SERIALIZE_NUMPY)
else:
    loads = json.loads
    def dumps(arr):
        return json.dumps({"model_name": "m", "model_version": "1", "outputs": [
            {"name": "INPUT0", "datatype": dtype, "shape": list(arr.shape), "data": arr.tolist()}]},
            separators=(",", ":")).encode()
def decode():
    d = loads(body)
    i = d["inputs"][0]
    return np.asarray(i["data"], dtype=npt).reshape(i["shape"])
def timed(fn):
    out, ts = None, []
    end = time.perf_counter() + seconds
    while len(ts) < 3 or time.perf_counter() < end:
        t = time.perf_counter_ns(); out = fn(); ts.append(time.perf_counter_ns() - t)
    return out, ts
arr, dec = timed(decode)
enc_out, enc = timed(lambda: dumps(arr))
open(check_out, "wb").write(enc_out)
print(json.dumps({"decode_ns": dec, "encode_ns": enc, "body_bytes": len(body),
                  "encoded_bytes": len(enc_out), "elements": int(arr.size)}))
'''

MAKE_BODY = r'''
import sys
import numpy as np, orjson
n, dtype, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rng = np.random.default_rng(0)
x = (rng.standard_normal(n).astype(np.float32) if dtype == "FP32"
     else rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64))
open(path, "wb").write(orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": dtype,
    "shape": [n], "data": x}]}, option=orjson.OPT_SERIALIZE_NUMPY))
np.save(path + ".npy", x)
'''

CHECK = r'''
import sys, numpy as np, orjson
ref = np.load(sys.argv[1])
for p in sys.argv[2:]:
    o = orjson.loads(open(p, "rb").read())["outputs"][0]
    got = np.asarray(o["data"], dtype=ref.dtype)
    if o["shape"] != [ref.size] or not np.array_equal(got, ref):
        print(f"MISMATCH {p}"); sys.exit(1)
print("ok")
'''


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round of 0.5 s (< 1 min)")
    ap.add_argument("--elements", type=int, default=1 << 20, help="tensor elements (1M)")
    ap.add_argument("--seconds", type=float, help="seconds per phase per run (default 1.5; quick 0.5)")
    ap.add_argument("--rounds", type=int, help="rounds (default 3; quick 1)")
    ap.add_argument("--cpu", default="0", help="taskset CPU for every run (0)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    a.seconds = a.seconds or (0.5 if a.quick else 1.5)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.out = a.out or (C.RAW_DIR if a.quick else C.RESULTS_DIR)
    return a


def build_driver(raw_dir: Path) -> tuple[Path, str]:
    exe = raw_dir / "json_codec_bench"
    cmd = ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Icsrc", str(DRIVER_SRC.relative_to(C.REPO_ROOT)),
           *CODEC_SOURCES, "-o", str(exe), "-lm"]
    r = subprocess.run(cmd, cwd=C.REPO_ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: building the codec driver failed:\n{r.stderr}")
    return exe, " ".join(cmd[:-3] + ["-o", "json_codec_bench", "-lm"])


def run_json(argv: list[str], cpu: str) -> tuple[dict, str]:
    r = subprocess.run(["taskset", "-c", cpu, *argv], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: rc={r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr.strip()


def main() -> int:
    args = parse_args()
    C.check_cpus(args.cpu)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = C.RAW_DIR / NAME / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), C.loadavg()
    tools = str(PEERS.tools_python())
    exe, build_cmd = build_driver(raw_dir)
    contenders = ["openinfer", "orjson", "json"]
    results: dict[tuple[str, str], list[dict]] = {}
    problems, notes = [], set()
    for dt in DTYPES:
        body = raw_dir / f"body_{dt}.json"
        subprocess.run([tools, "-c", MAKE_BODY, str(args.elements), dt, str(body)], check=True)
        for rnd in range(1, args.rounds + 1):
            for name in contenders:  # A B C
                enc_out = raw_dir / f"enc_{dt}_{name}.json"
                argv = ([str(exe), str(body), str(args.seconds), str(enc_out)] if name == "openinfer"
                        else [tools, "-c", PY_BENCH, name, str(body), dt, str(args.seconds), str(enc_out)])
                try:
                    res, err = run_json(argv, args.cpu)
                    if err:
                        notes.add(f"{name} {dt}: {err}")
                except (RuntimeError, json.JSONDecodeError) as e:
                    res = {"error": str(e)}
                    problems.append(f"{name} {dt} round {rnd}: {e}")
                results.setdefault((dt, name), []).append(res)
                if "error" not in res:
                    dm = C.summarize(res["decode_ns"]).median / 1e6
                    em = C.summarize(res["encode_ns"]).median / 1e6
                    print(f"[{T}] {dt} round {rnd}/{args.rounds} {name:<9} decode {dm:8.1f} ms "
                          f"({res['body_bytes'] / dm / 1e3:7.1f} MB/s)  encode {em:8.1f} ms "
                          f"({res['encoded_bytes'] / em / 1e3:7.1f} MB/s)", flush=True)
        chk = subprocess.run([tools, "-c", CHECK, str(body) + ".npy",
                              *[str(raw_dir / f"enc_{dt}_{n}.json") for n in contenders]],
                             capture_output=True, text=True)
        if chk.returncode != 0:
            problems.append(f"{dt}: an encoder's output does not read back equal to the input: "
                            f"{chk.stdout.strip()} {chk.stderr.strip()[-300:]}")
    elapsed = time.monotonic() - started

    rows, csv_rows, ratio_rows = [], [], []
    for dt in DTYPES:
        oi = results.get((dt, "openinfer"), [])
        for name in contenders:
            runs = [r for r in results.get((dt, name), []) if "error" not in r]
            if not runs:
                rows.append([dt, name, "FAILED", "", "", "", "", ""])
                continue
            cells = []
            for ph in ("decode", "encode"):
                ms = [C.summarize(r[f"{ph}_ns"]).median / 1e6 for r in runs]
                size_key = "body_bytes" if ph == "decode" else "encoded_bytes"
                mbs = [r[size_key] / m / 1e3 for r, m in zip(runs, ms)]
                if name == "openinfer":
                    ratio = "1"
                else:
                    oms = [C.summarize(r[f"{ph}_ns"]).median / 1e6 for r in oi if "error" not in r]
                    rs = C.paired_ratios([1 / m for m in oms], [1 / m for m in ms])
                    ratio = C.summarize(rs).fmt(".2f")
                    ratio_rows.append(C.ratio_row("S5", f"{ph} {dt} 1M", name + (" + numpy"),
                                                  "peer", "ops/s", rs))
                cells += [C.summarize(ms).fmt(",.1f"), C.summarize(mbs).fmt(",.0f"), ratio]
            rows.append([dt, name, *cells, f"{runs[0]['encoded_bytes']:,}"])
            for i, r in enumerate(runs, 1):
                csv_rows.append([dt, name, i, len(r["decode_ns"]),
                                 f"{C.summarize(r['decode_ns']).median / 1e6:.3f}",
                                 len(r["encode_ns"]),
                                 f"{C.summarize(r['encode_ns']).median / 1e6:.3f}",
                                 r["body_bytes"], r["encoded_bytes"]])
    out: Path = args.out
    C.write_csv(out / f"{NAME}.csv", ["dtype", "codec", "round", "decode_iters", "decode_ms_median",
                                       "encode_iters", "encode_ms_median", "body_bytes",
                                       "encoded_bytes"], csv_rows)
    C.write_ratios(out, NAME, ratio_rows)
    body_sizes = {dt: results[(dt, "openinfer")][0].get("body_bytes") for dt in DTYPES
                  if results.get((dt, "openinfer"))}
    lines = C.report_header("S5 — the V2 JSON codec alone", args.quick, elapsed) + [
        "**openinfer/X** = median of per-round ratios of operations per second (min–max); "
        "above 1, openinfer's C codec is faster. Times are the median of one operation within "
        "a round, then median (min–max) over rounds. Decode MB/s counts the request body; "
        "encode MB/s the response it writes (the encoders write different float text, so "
        "compare times, not MB/s, for encode).",
        "",
        C.markdown_table(["dtype", "codec", "decode ms", "decode MB/s", "openinfer/X",
                          "encode ms", "encode MB/s", "openinfer/X", "encoded bytes"], rows),
        "## Method",
        "",
        f"- Body: one input `INPUT0` of {args.elements:,} elements, JSON written by orjson "
        "(`OPT_SERIALIZE_NUMPY`): FP32 standard normal values (shortest float32 text), INT64 "
        f"uniform in ±2^62; {', '.join(f'{k} {v:,} bytes' for k, v in body_sizes.items())}.",
        f"- openinfer: `{build_cmd}` (same -O2 as the extension), run as `json_codec_bench "
        "BODY SECONDS OUT`; the decode loop copies a fresh body before each (untimed) call.",
        "- orjson + numpy and json + numpy: the tools venv's Python "
        f"({C.tool_version([tools, '--version'])}), see `PY_BENCH` in this script.",
        f"- Everything pinned with `taskset -c {args.cpu}`; {args.rounds} rounds, contenders in "
        f"turn, each phase ≥ {args.seconds:g} s and ≥ 3 operations. Each encoder's output is "
        "parsed back (orjson) and compared equal to the input array.",
        C.machine_line((load_before, C.loadavg())),
        f"- Per-run numbers: `{NAME}.csv`; bodies and outputs: `{C.rel(raw_dir)}/` (not committed).",
        "",
    ]
    lines += C.problems_section(problems + sorted(f"driver said: {n}" for n in notes))
    C.write_report(NAME, out, lines, T)
    print("\n" + C.markdown_table(["dtype", "codec", "dec ms", "dec MB/s", "oi/X", "enc ms",
                                   "enc MB/s", "oi/X", "bytes"], rows), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
