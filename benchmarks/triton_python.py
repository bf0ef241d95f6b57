#!/usr/bin/env python3
"""Triton Python-backend models: python_backend's `add_sub` example (TritonPythonModel, unchanged,
tests/triton_python_examples/add_sub) served by openinfer and by native tritonserver (the binary and
Python backend stub of the nvidia-pytriton wheel, benchmarks/peers.py), side by side; and, on
openinfer, the same computation written as an `infer()` model (`add_sub_infer`), which measures
what the pb_utils adapter costs.

    .venv/bin/python benchmarks/triton_python.py [--quick] [--concurrency 1,8,64]
                                                 [--duration S] [--rounds N] [--bls]
                                                 [--baseline PYTHONPATH]

--bls: python_backend's `bls_sync` example (a BLS model calling add_sub, both unchanged) in place
of add_sub on both servers; the `infer()` column is then add_sub_infer called directly, which
shows what the BLS hop costs. Results go to results/triton_python_bls.md.

--baseline DIR: a second openinfer server whose package comes from DIR (another checkout's
`python/`, its extension built), measured in turn with the others: a change's before and after
from the same run (the column "openinfer / baseline").

At c=1 it also times `GET /v2/health/live` on both servers (wrk, one connection): the round trip
that every request at one connection pays, whatever the model.

S1-style: HTTP JSON by wrk (one connection per concurrent request) and gRPC ModelInfer by h2load
(one connection, c streams); servers pinned to CPU 0, the load to CPU 1. Each concurrency point:
a warm-up run per server, then rounds with the servers in turn (A B C A B C); the claims are
medians of per-round ratios. Every server's answer is checked before the load. Results go to
benchmarks/results/triton_python.md (--quick: results/raw/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers  # noqa: E402
import s3_grpc  # noqa: E402

NAME = "triton_python"
BASELINE = "openinfer baseline TritonPythonModel"
EXAMPLE = C.REPO_ROOT / "tests" / "triton_python_examples" / "add_sub"
BLS_EXAMPLE = C.REPO_ROOT / "tests" / "triton_python_examples" / "bls"
A = [0.5, 1.5, 2.5, 3.5]
B = [1.0, 1.0, 1.0, 1.0]
INFER_MODEL = '''import numpy as np

def infer(inputs):
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": (a + b).astype(np.float32), "OUTPUT1": (a - b).astype(np.float32)}
'''


def repository(root: Path, with_infer: bool) -> Path:
    """add_sub laid out as its README says (and add_sub_infer beside it for openinfer)."""
    (root / "add_sub" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLE / "model.py", root / "add_sub" / "1" / "model.py")
    config = (EXAMPLE / "config.pbtxt").read_text()
    (root / "add_sub" / "config.pbtxt").write_text(config)
    (root / "bls_sync" / "1").mkdir(parents=True)
    shutil.copy(BLS_EXAMPLE / "sync_model.py", root / "bls_sync" / "1" / "model.py")
    shutil.copy(BLS_EXAMPLE / "sync_config.pbtxt", root / "bls_sync" / "config.pbtxt")
    if with_infer:
        (root / "add_sub_infer" / "1").mkdir(parents=True)
        (root / "add_sub_infer" / "1" / "model.py").write_text(INFER_MODEL)
        (root / "add_sub_infer" / "config.pbtxt").write_text(config.replace('"add_sub"', '"add_sub_infer"'))
    return root


def json_body(model: str) -> str:
    inputs = [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": A},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": B},
    ]
    if model == "bls_sync":  # the BLS example calls the model its MODEL_NAME input names
        inputs.append({"name": "MODEL_NAME", "datatype": "BYTES", "shape": [1], "data": ["add_sub"]})
    return json.dumps({"inputs": inputs}, separators=(",", ":"))


def grpc_body(pb, model: str) -> bytes:
    req = pb.ModelInferRequest(model_name=model)
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        req.inputs.add(name=name, datatype="FP32", shape=[4])
        req.raw_input_contents.append(np.array(values, np.float32).tobytes())
    if model == "bls_sync":
        req.inputs.add(name="MODEL_NAME", datatype="BYTES", shape=[1])
        req.raw_input_contents.append(len(b"add_sub").to_bytes(4, "little") + b"add_sub")
    return s3_grpc.framed(req.SerializeToString())


def check(http_port: int, model: str) -> None:
    status, raw = C.http_request(f"http://127.0.0.1:{http_port}/v2/models/{model}/infer",
                                 json_body(model).encode(), "POST", {"Content-Type": "application/json"})
    if status != 200:
        raise SystemExit(f"error: {model} on port {http_port}: HTTP {status} {raw[:300]!r}")
    outs = {o["name"]: o["data"] for o in json.loads(raw)["outputs"]}
    if outs["OUTPUT0"] != [a + b for a, b in zip(A, B)] or outs["OUTPUT1"] != [a - b for a, b in zip(A, B)]:
        raise SystemExit(f"error: {model} on port {http_port} answered {outs}")


def grpc_answer_len(pb, port: int, model: str) -> int:
    import grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(s3_grpc.SERVICE + "ModelInfer", request_serializer=lambda b: b[5:],
                              response_deserializer=lambda b: b)
        answer = call(grpc_body(pb, model), timeout=30)
    return 5 + len(answer)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--bls", action="store_true", help="the bls_sync example calling add_sub, on both servers")
    ap.add_argument("--baseline", type=Path, help="another checkout's python/ directory, served beside this one")
    args = ap.parse_args()
    model = "bls_sync" if args.bls else "add_sub"
    if args.quick:
        args.duration, args.rounds = min(args.duration, 2.0), min(args.rounds, 2)
    conc = C.parse_int_list(args.concurrency)
    C.ensure_debian_packages([["nghttp2-client"]])
    started = time.monotonic()
    load_before = C.loadavg()
    tmp = C.make_tmpdir("oi-triton-python-")
    (tmp / "stubs").mkdir()
    pb = s3_grpc.stubs(tmp / "stubs")
    oi_repo = repository(tmp / "oi_repo", with_infer=True)
    tr_repo = repository(tmp / "triton_repo", with_infer=False)
    oi_port, oi_grpc = C.free_port(), C.free_port()
    oi = C.openinfer_server(oi_port, args.server_cpu, tmp / "openinfer.log",
                            extra=[str(oi_repo), "--grpc-port", str(oi_grpc)]).start()
    base = base_port = base_grpc = None
    if args.baseline:
        base_port, base_grpc = C.free_port(), C.free_port()
        env = dict(os.environ, PYTHONPATH=str(args.baseline.resolve()))
        base = C.openinfer_server(base_port, args.server_cpu, tmp / "baseline.log",
                                  extra=[str(oi_repo), "--grpc-port", str(base_grpc)], env=env).start()
    problems: list[str] = []
    try:
        C.wait_http_ready(f"http://127.0.0.1:{oi_port}/v2/health/ready", 120)
        if base is not None:
            C.wait_http_ready(f"http://127.0.0.1:{base_port}/v2/health/ready", 120)
        triton = peers.start_triton(args.server_cpu, tmp, repo=tr_repo, models=["add_sub", "bls_sync"])
        try:
            servers = {  # label -> (http port, grpc port, model)
                "openinfer TritonPythonModel": (oi_port, oi_grpc, model),
                "tritonserver TritonPythonModel": (triton.http_port, triton.grpc_port, model),
                "openinfer infer()": (oi_port, oi_grpc, "add_sub_infer"),
            }
            if base is not None:
                servers[BASELINE] = (base_port, base_grpc, model)
            for http_port, _, model in servers.values():
                check(http_port, model)
            lens = {k: grpc_answer_len(pb, g, m) for k, (_, g, m) in servers.items()}
            rows = run(args, servers, conc, tmp, pb, lens, oi, triton, problems)
            floor = round_trip_floor(args, servers, tmp, oi, triton, problems) if 1 in conc and not args.bls else {}
            version = triton.version
        finally:
            triton.stop()
    finally:
        oi.stop()
        if base is not None:
            base.stop()
    lines = report(args, rows, conc, version, load_before, time.monotonic() - started, problems, floor)
    out = args.out or (C.RESULTS_DIR / ("raw" if args.quick else ""))
    path = C.write_report(NAME + ("_bls" if args.bls else ""), out, lines, "quick" if args.quick else "full")
    print("\n".join(lines))
    print(f"written {path}")
    return 0


def run(args, servers, conc, tmp, pb, lens, oi, triton, problems) -> dict:
    """{(protocol, c, label): [req/s per round]}."""
    rows: dict = {}
    for proto in ("http", "grpc"):
        for c in conc:
            bodies = {}
            for label, (http_port, grpc_port, model) in servers.items():
                if proto == "http":
                    script = tmp / f"{model}.lua"
                    C.write_wrk_script(script, "POST", json_body(model), {"Content-Type": "application/json"})
                    bodies[label] = script
                else:
                    body = tmp / f"{model}.grpc"
                    body.write_bytes(grpc_body(pb, model))
                    bodies[label] = body

            def once(label: str, seconds: float) -> float:
                """One run; a failed run is tried once more, then noted and counted as NaN."""
                try:
                    return attempt(label, seconds)
                except RuntimeError as first:
                    try:
                        return attempt(label, seconds)
                    except RuntimeError as again:
                        problems.append(f"{label} {proto} c={c}: {first}; again: {again}")
                        return float("nan")

            def attempt(label: str, seconds: float) -> float:
                http_port, grpc_port, model = servers[label]
                if proto == "http":
                    r = C.run_wrk(f"http://127.0.0.1:{http_port}/v2/models/{model}/infer", bodies[label], c,
                                  seconds, args.client_cpu, label, servers=(oi, triton.proc))
                    if r.error:
                        raise RuntimeError(r.error)
                    return r.rps
                r = s3_grpc.run_h2load(grpc_port, "ModelInfer", bodies[label], c, int(max(1, seconds)),
                                       args.client_cpu, tmp / "h2load.log", lens[label], 1)
                if r["error"]:
                    raise RuntimeError(r["error"])
                return r["rps"]

            for label in servers:
                once(label, 1)
            for _ in range(args.rounds):
                for label in servers:
                    rows.setdefault((proto, c, label), []).append(once(label, args.duration))
    return rows


def round_trip_floor(args, servers, tmp, oi, triton, problems) -> dict:
    """{label: [µs per request per round]} of `GET /v2/health/live` at one connection, which
    each server answers without a model: the round trip every request at c=1 pays."""
    script = C.write_wrk_script(tmp / "health.lua", "GET", None, {})
    ports = {"openinfer": servers["openinfer TritonPythonModel"][0],
             "tritonserver": servers["tritonserver TritonPythonModel"][0]}
    floor: dict = {}
    for _ in range(args.rounds):
        for label, port in ports.items():
            r = C.run_wrk(f"http://127.0.0.1:{port}/v2/health/live", script, 1, args.duration, args.client_cpu, label,
                          servers=(oi, triton.proc))
            if r.error or not r.rps:
                problems.append(f"health {label} c=1: {r.error}")
                continue
            floor.setdefault(label, []).append(1e6 / r.rps)
    return floor


def floor_lines(rows, floor) -> list[str]:
    """What a c=1 HTTP request costs each server over its own health round trip."""
    if len(floor) < 2:
        return []
    per_request = {"openinfer": rows[("http", 1, "openinfer TritonPythonModel")],
                   "tritonserver": rows[("http", 1, "tritonserver TritonPythonModel")],
                   "openinfer infer()": rows[("http", 1, "openinfer infer()")]}
    us = {k: 1e6 / float(np.nanmedian(v)) for k, v in per_request.items()}
    health = {k: float(np.median(v)) for k, v in floor.items()}
    return [
        "",
        "The c=1 floor: `GET /v2/health/live` at one connection (wrk, as above), which each server answers "
        f"without a model: openinfer {health['openinfer']:.0f} µs, tritonserver {health['tritonserver']:.0f} µs "
        f"per request (medians of {len(floor['openinfer'])} rounds). Over it, add_sub over HTTP at c=1 costs "
        f"openinfer {us['openinfer'] - health['openinfer']:.0f} µs (the infer() model "
        f"{us['openinfer infer()'] - health['openinfer']:.0f}) and tritonserver "
        f"{us['tritonserver'] - health['tritonserver']:.0f} µs; a server whose model request cost nothing over "
        f"its health round trip would reach {us['tritonserver'] / health['openinfer']:.2f}x tritonserver here.",
    ]


def report(args, rows, conc, version, load_before, elapsed, problems, floor=None) -> list[str]:
    if args.bls:
        lines = C.report_header("BLS: bls_sync calling add_sub on openinfer vs tritonserver", args.quick, elapsed)
        lines += [
            "python_backend's `bls_sync` example calling its `add_sub` example (both unchanged) through BLS, "
            f"served by openinfer and by native {version}; the `infer()` column is `add_sub_infer` called "
            f"directly. Servers on CPU {args.server_cpu}, load on CPU {args.client_cpu}; {args.rounds} rounds "
            f"of {args.duration:g} s per point, servers in turn; medians of per-round ratios (min-max).",
            "",
        ]
    else:
        lines = C.report_header("Triton Python-backend model: add_sub on openinfer vs tritonserver", args.quick,
                                elapsed)
    lines += [] if args.bls else [
        "python_backend's `add_sub` example (model.py and config.pbtxt unchanged) served by openinfer and by "
        f"native {version}; `add_sub_infer` is the same computation as an openinfer `infer()` model. Servers on "
        f"CPU {args.server_cpu}, load on CPU {args.client_cpu}; {args.rounds} rounds of {args.duration:g} s per "
        "point, servers in turn; medians of per-round ratios (min-max).",
        "",
    ]
    headers = ["protocol", "c", "openinfer req/s", "tritonserver req/s", "openinfer / triton",
               "infer() req/s", "TritonPythonModel / infer()"]
    baseline = args.baseline is not None
    if baseline:
        headers += ["baseline req/s", "baseline / triton", "openinfer / baseline"]
        lines += [f"The baseline is openinfer served from `{args.baseline}`, in turn with the others.", ""]
    table = []
    for proto in ("http", "grpc"):
        for c in conc:
            oi = rows[(proto, c, "openinfer TritonPythonModel")]
            tr = rows[(proto, c, "tritonserver TritonPythonModel")]
            inf = rows[(proto, c, "openinfer infer()")]
            vs = C.summarize([r for r in C.paired_ratios(oi, tr) if r == r])  # NaN: a failed run
            own = C.summarize([r for r in C.paired_ratios(oi, inf) if r == r])
            table.append([proto, c, f"{np.nanmedian(oi):.0f}", f"{np.nanmedian(tr):.0f}",
                          f"{vs.median:.2f}x ({vs.lo:.2f}-{vs.hi:.2f})", f"{np.nanmedian(inf):.0f}",
                          f"{own.median:.2f} ({own.lo:.2f}-{own.hi:.2f})"])
            if baseline:
                bs = rows[(proto, c, BASELINE)]
                b_tr = C.summarize([r for r in C.paired_ratios(bs, tr) if r == r])
                gain = C.summarize([r for r in C.paired_ratios(oi, bs) if r == r])
                table[-1] += [f"{np.nanmedian(bs):.0f}", f"{b_tr.median:.2f}x ({b_tr.lo:.2f}-{b_tr.hi:.2f})",
                              f"{gain.median:.2f}x ({gain.lo:.2f}-{gain.hi:.2f})"]
    lines.append(C.markdown_table(headers, table))
    lines += floor_lines(rows, floor or {})
    lines += ["", f"Load average before {load_before}, after {C.loadavg()}.", *C.problems_section(problems)]
    return lines


if __name__ == "__main__":
    sys.exit(main())
