#!/usr/bin/env python3
"""S9 (processes): a CPU-bound Python model on every core. A Python model runs under its
process's GIL, so one process uses one core for it however many the machine has. Side by side,
round by round, the same model (`busy`, ~--work-ms of pure-Python arithmetic per request):

    openinfer, N instances     instance_group { count: N }: N worker processes (1: in-process)
    openinfer --workers N      N server processes on one port, one instance each
    Triton, N instances        tritonserver from the nvidia-pytriton wheel, Python backend,
                               instance_group { count: N kind: KIND_CPU } (a stub process each)
    MLServer, N workers        MLServer with parallel_workers N

    .venv/bin/python benchmarks/s9_workers.py [--instances 1,2] [--workers 2] [--peers triton,mlserver]
                                              [--seconds 5] [--rounds 5] [--concurrency 8] [--out DIR]

wrk drives each at --concurrency connections over HTTP JSON (the V2 infer path all of them
speak); the servers are not pinned (the point is to use every core), wrk is pinned to the last
CPU, and the configurations alternate round by round. Ratios divide each round's rate by the
same round's rate of openinfer with one instance, and (for each server) by its own one-instance
rate. Results: DIR/s9_workers.md (default benchmarks/results/raw/). A peer that cannot be
installed or started is reported with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers as P  # noqa: E402

SPIN = """\
def _spin(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1000003
    return acc
"""

OPENINFER_MODEL = SPIN + """
def infer(inputs):
    _spin({loops})
    return {{"Y": inputs["X"] + 1}}
"""

TRITON_MODEL = SPIN + """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            _spin({loops})
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

MLSERVER_MODEL = SPIN + """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceResponse


class Busy(MLModel):
    async def predict(self, payload):
        x = NumpyCodec.decode_input(payload.inputs[0])
        _spin({loops})
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("Y", x + 1)])
"""

CONFIG = """\
name: "busy"
backend: "python"
input [{{name: "X" data_type: TYPE_INT32 dims: [1]}}]
output [{{name: "Y" data_type: TYPE_INT32 dims: [1]}}]
instance_group [{{count: {count} kind: KIND_CPU}}]
"""


def calibrate(work_ms: float) -> int:
    """Loop count of _spin that takes about work_ms here."""
    import time

    ns: dict = {}
    exec(SPIN, ns)
    n = 20000
    t = time.perf_counter()
    ns["_spin"](n)
    per = (time.perf_counter() - t) / n
    return max(1000, int(work_ms / 1000 / per))


@dataclass
class Config:
    label: str
    server: str  # whose own one-instance row it is compared with
    instances: int
    start: Callable[[], tuple[C.ServerProcess, str]] | None = None  # a started server, its URL
    command: str = ""


def write_repo(root: Path, model: str, count: int, loops: int) -> Path:
    (root / "busy" / "1").mkdir(parents=True)
    (root / "busy" / "config.pbtxt").write_text(CONFIG.format(count=count))
    (root / "busy" / "1" / "model.py").write_text(model.format(loops=loops))
    return root


def openinfer_config(tmp: Path, loops: int, instances: int, workers: int) -> Config:
    repo = write_repo(tmp / f"oi-{instances}-{workers}", OPENINFER_MODEL, instances, loops)
    label = f"openinfer, {instances} instance{'s' * (instances > 1)}" if workers == 1 else f"openinfer --workers {workers}"
    cfg = Config(label, "openinfer", instances * workers)

    def start() -> tuple[C.ServerProcess, str]:
        port = C.free_port()
        extra = (["--workers", str(workers)] if workers > 1 else []) + [str(repo)]
        srv = C.openinfer_server(port, None, tmp / f"{label}.log", threads=1, extra=extra).start()
        cfg.command = srv.command.replace(str(tmp), "$REPO_DIR").replace(str(C.REPO_ROOT) + "/", "")
        url = f"http://127.0.0.1:{port}"
        C.wait_http_ready(url + "/v2/health/ready", timeout=120, proc=srv)
        return srv, url

    cfg.start = start
    return cfg


def triton_config(tmp: Path, loops: int, instances: int) -> Config:
    repo = write_repo(tmp / f"triton-{instances}", TRITON_MODEL, instances, loops)
    cfg = Config(f"Triton, {instances} instance{'s' * (instances > 1)}", "Triton", instances)

    def start() -> tuple[C.ServerProcess, str]:
        peer = P.start_triton(None, tmp / "logs", repo=repo, models=["busy"])
        cfg.command = peer.command.replace(str(repo), "$REPO_DIR")
        return peer.proc, peer.http_url

    cfg.start = start
    return cfg


def mlserver_config(tmp: Path, loops: int, workers: int) -> Config:
    py = P.ensure_venv("mlserver", P.REQUIREMENTS["mlserver"])
    root = tmp / f"mlserver-{workers}"
    (root / "busy").mkdir(parents=True)
    (root / "busy_model.py").write_text(MLSERVER_MODEL.format(loops=loops))
    (root / "busy" / "model-settings.json").write_text(json.dumps({"name": "busy", "implementation": "busy_model.Busy"}))
    cfg = Config(f"MLServer, parallel_workers {workers}", "MLServer", workers)

    def start() -> tuple[C.ServerProcess, str]:
        port = C.free_port()
        (root / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1", "http_port": port, "grpc_port": C.free_port(), "metrics_port": C.free_port(),
            "metrics_endpoint": None, "parallel_workers": workers, "debug": False}))
        env = {**os.environ, "PYTHONPATH": str(root)}
        argv = [str(py.parent / "mlserver"), "start", str(root)]
        srv = C.ServerProcess("mlserver", argv, None, tmp / "logs" / f"mlserver-{workers}.log", cwd=root, env=env,
                              stop_signal=2).start()
        cfg.command = f"PYTHONPATH=$REPO_DIR mlserver start $REPO_DIR  # settings.json parallel_workers={workers}"
        url = f"http://127.0.0.1:{port}"
        C.wait_http_ready(url + "/v2/models/busy/ready", timeout=240, proc=srv)
        return srv, url

    cfg.start = start
    return cfg


def plot(path: Path, configs: list[Config], rates: dict[str, list[float]], concurrency: int) -> str | None:
    """req/s against the number of instances (processes), one line per server."""
    series: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
    for c in configs:
        if c.label not in rates or "--workers" in c.label:
            continue
        s = C.summarize(rates[c.label])
        x, med, lo, hi = series.setdefault(c.server, ([], [], [], []))
        x.append(c.instances)
        med.append(s.median)
        lo.append(s.lo)
        hi.append(s.hi)
    return C.plot_lines(path, f"S9: CPU-bound Python model, c={concurrency}", "instances (processes)", "req/s",
                        series)


def claims(configs: list[Config], rates: dict[str, list[float]], concurrency: int) -> list[dict]:
    """For the summary: openinfer with N instances against one instance (its scaling) and
    against each peer with N."""
    rows = []
    mine = {c.instances: c.label for c in configs if c.server == "openinfer" and "--workers" not in c.label}
    base = mine.get(1)
    for c in configs:
        n = c.instances
        if c.server == "openinfer" or n not in mine or mine[n] not in rates or c.label not in rates:
            continue
        rows.append(C.ratio_row("S9", f"CPU-bound Python model, {n} instance{'s' * (n > 1)}, c={concurrency}", c.label,
                                "peer", "req/s", C.paired_ratios(rates[mine[n]], rates[c.label])))
    for n, label in mine.items():
        if n > 1 and base in rates and label in rates:
            rows.append(C.ratio_row("S9", f"CPU-bound Python model, {n} instances, c={concurrency}",
                                    f"{base} (scaling; ideal {n})", "limit", "req/s",
                                    C.paired_ratios(rates[label], rates[base])))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", default="1,2", help="instance counts (openinfer and Triton)")
    ap.add_argument("--workers", default="2", help="openinfer --workers counts ('' for none)")
    ap.add_argument("--peers", default="triton,mlserver")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--work-ms", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="one round of 2 s, results under raw/")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 2
    args.out = args.out or C.RESULTS_DIR / ("raw" if args.quick else "")
    counts = C.parse_int_list(args.instances)
    peers = [p for p in args.peers.split(",") if p]
    C.ensure_debian_packages([["wrk"]])
    loops = calibrate(args.work_ms)
    load_cpu = str(C.nproc() - 1)
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        configs = [openinfer_config(tmp, loops, n, 1) for n in counts]
        configs += [openinfer_config(tmp, loops, 1, int(w)) for w in args.workers.split(",") if w.strip() and int(w) > 1]
        for name in peers:
            try:
                if name == "triton":
                    P.triton_dist()
                    configs += [triton_config(tmp, loops, n) for n in counts]
                elif name == "mlserver":
                    configs += [mlserver_config(tmp, loops, n) for n in counts]
                else:
                    problems.append(f"unknown peer {name!r}")
            except P.PeerUnavailable as e:
                problems.append(f"{name}: {e}")
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
        script = C.write_wrk_script(tmp / "busy.lua", "POST", body, {"Content-Type": "application/json"})
        rates: dict[str, list[float]] = {c.label: [] for c in configs}
        for r in range(args.rounds):
            for cfg in configs:
                if cfg.label not in rates:
                    continue  # failed in an earlier round
                assert cfg.start is not None
                try:
                    srv, url = cfg.start()
                except (RuntimeError, P.PeerUnavailable) as e:
                    problems.append(f"{cfg.label}: {str(e)[-400:]}")
                    del rates[cfg.label]
                    continue
                with srv:
                    res = C.run_wrk(f"{url}/v2/models/busy/infer", script, args.concurrency, args.seconds, load_cpu,
                                    label=cfg.label, servers=[srv])
                if res.error or res.non2xx:
                    problems.append(f"round {r} {cfg.label}: {res.error or f'{res.non2xx} non-2xx answers'}")
                    del rates[cfg.label]
                    continue
                rates[cfg.label].append(res.rps)
                print(f"round {r} {cfg.label}: {res.rps:,.0f} req/s", file=sys.stderr)
    base = configs[0].label
    own_base = {c.server: c.label for c in reversed(configs) if c.instances == 1}
    rows = []
    for c in configs:
        if c.label not in rates:
            continue
        vs_base = C.summarize(C.paired_ratios(rates[c.label], rates[base])) if base in rates else None
        own = own_base.get(c.server)
        vs_own = (C.summarize(C.paired_ratios(rates[c.label], rates[own]))
                  if own in rates and own != c.label else None)
        rows.append([c.label, C.summarize(rates[c.label]).fmt(), vs_base.fmt(".2f") if vs_base else "",
                     vs_own.fmt(".2f") if vs_own else "", f"`{c.command}`"])
    text = (
        "# S9: a CPU-bound Python model on every core\n\n"
        + ", ".join(f"{k}: {v}" for k, v in C.machine_facts().items())
        + "\n\n"
        f"Model `busy`: ~{args.work_ms:g} ms of pure-Python work per request ({loops} loop iterations), "
        f"the same loop in each server's model API; wrk at c={args.concurrency} over HTTP JSON on CPU {load_cpu}, "
        f"servers unpinned; {args.rounds} rounds of {args.seconds:g} s, configurations alternated. "
        f"Median (min–max) over rounds; ratios are per-round rates divided by the same round's rate of "
        f"`{base}` and of the same server with one instance. `$REPO_DIR` is the temporary repository the "
        f"benchmark writes.\n\n"
        + C.markdown_table(["configuration", "req/s", f"vs {base}", "vs its own 1 instance", "command"], rows)
        + ("\n\n## Problems\n\n" + "\n".join(f"- {p}" for p in problems) if problems else "")
        + "\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    note = plot(args.out / "s9_workers.png", configs, rates, args.concurrency)
    if note:
        text += f"\nNo plot: {note}\n"
    (args.out / "s9_workers.md").write_text(text)
    C.write_ratios(args.out, "s9_workers", claims(configs, rates, args.concurrency))
    print(text)
    return 1 if problems and not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
