#!/usr/bin/env python3
"""The summary table: openinfer's ratio to each peer that ran and to each limit, for every
scenario, collected from the <scenario>.ratios.json files that one run of the suite wrote.

    .venv/bin/python benchmarks/summary.py [--out DIR] [--readme]

Writes DIR/summary.md (DIR: benchmarks/results by default); with --readme, also replaces the
"## Benchmarks" section of README.md with it (the rest of README.md is left as it is).
benchmarks/run.py calls this after a full run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

ORDER = ["s1_http_json", "s2_http_binary", "s3_grpc", "s4_http_tensors", "s5_json_codec",
         "s6_torchscript", "s7_client", "s8_startup"]
TITLES = {"S1": "HTTP JSON, `simple`", "S2": "HTTP binary tensors, `simple`",
          "S3": "gRPC, `simple`", "S4": "`identity_fp32` tensors", "S5": "JSON codec alone",
          "S6": "TorchScript", "S7": "client side", "S8": "start-up"}
LOWER = {"ready_ms", "rss_mb", "pss_mb", "import_ms", "cpu_us"}


def fmt(r: dict) -> str:
    if not r.get("n"):
        return "–"
    s = f"{r['median']:.2f}"
    if r["n"] > 1:
        s += f" ({r['lo']:.2f}–{r['hi']:.2f})"
    return s


def load(out: Path) -> list[tuple[str, dict]]:
    got = []
    for stem in ORDER:
        p = out / f"{stem}.ratios.json"
        if p.exists():
            got.append((stem, json.loads(p.read_text())))
    return got


def peer_notes(out: Path) -> list[str]:
    """The 'did not run' lines of every scenario page, deduplicated by their first words."""
    notes, seen = [], set()
    for stem in ORDER:
        p = out / f"{stem}.md"
        if not p.exists():
            continue
        text = p.read_text()
        m = re.search(r"## Peers (?:that did not run|or parts that did not run)\n\n(.*?)(?:\n## |\Z)",
                      text, re.S)
        if not m:
            continue
        for item in re.split(r"\n(?=- )", m.group(1).strip()):
            first = item.strip().splitlines()[0]
            key = first[:90]
            if key in seen or not first.startswith("- "):
                continue
            seen.add(key)
            short = first if len(first) < 400 else first[:400] + " …"
            notes.append(f"{short} ({stem.split('_')[0].upper()})")
    return notes


def build(out: Path) -> str:
    import peers as PEERS
    data = load(out)
    lines = ["## Benchmarks", "",
             "openinfer against the servers its users would pick instead (Triton run directly, "
             "Triton through PyTriton, MLServer, KServe) and against the physical limits, from one run of "
             "`benchmarks/run.py` on this machine (2 cores, shared: server pinned to CPU 0, "
             "load to CPU 1; contenders alternated round by round). Each cell is "
             "**openinfer/X**, the median of per-round ratios (min–max). For rates (req/s, "
             "msg/s, GB/s, rows/s, ops/s) above 1 means openinfer is ahead; for times and "
             "memory (marked ↓) below 1 means openinfer is ahead. Details, absolute numbers, "
             "p50/p99 and the exact commands: `benchmarks/results/<scenario>.md`.", ""]
    whens = sorted({d["when"] for _, d in data})
    commits = sorted({d["commit"] for _, d in data})
    if whens:
        lines += [f"Run {whens[0]} – {whens[-1]}, openinfer commit(s) "
                  f"{', '.join(f'`{c}`' for c in commits)}.", ""]
    rows = []
    for stem, d in data:
        for r in d["rows"]:
            metric = r["metric"] + (" ↓" if r["metric"] in LOWER else "")
            rows.append([r["scenario"], r["point"], r["against"], r["kind"], metric, fmt(r)])
    lines += [C.markdown_table(["scenario", "point", "X", "peer/limit", "metric", "openinfer/X"],
                               rows)]
    lines += ["Commands (each scenario page names its own, with its options):", ""]
    lines += [f"- {TITLES.get(stem.split('_')[0].upper(), stem)}: `{d['command']}` → "
              f"`benchmarks/results/{stem}.md`" for stem, d in data]
    lines += [""]
    _, pa_note = PEERS.perf_analyzer_status()
    notes = peer_notes(out)
    lines += ["What did not run, and why (the errors as given):", "",
              f"- Triton's perf_analyzer: {pa_note} wrk (HTTP) and h2load (gRPC) took its place.",
              "- Triton's server from PyPI's `tritonserver` package: `pip` resolves it to "
              "`tritonserver 0.0.1.dev0` here, an sdist placeholder with no server, so the "
              "binary inside `nvidia-pytriton` is the route used.",
              *notes, ""]
    return "\n".join(lines)


def update_readme(section: str) -> None:
    readme = C.REPO_ROOT / "README.md"
    text = readme.read_text()
    m = re.search(r"^## Benchmarks\n.*?(?=^## |\Z)", text, re.S | re.M)
    new = section.rstrip() + "\n\n"
    if m:
        text = text[:m.start()] + new + text[m.end():]
    else:
        text = text.rstrip() + "\n\n" + new
    readme.write_text(text.rstrip() + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=C.RESULTS_DIR)
    ap.add_argument("--readme", action="store_true", help="also update README.md's Benchmarks section")
    a = ap.parse_args()
    section = build(a.out)
    path = a.out / "summary.md"
    path.write_text("# Benchmark summary\n\n" + section.split("\n", 2)[2])
    print(f"[summary] wrote {C.rel(path)}")
    if a.readme:
        update_readme(section)
        print("[summary] updated README.md (## Benchmarks)")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
