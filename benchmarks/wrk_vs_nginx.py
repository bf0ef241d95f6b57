"""The wrk scenarios' runner (S1, S2, S13): openinfer, each peer and nginx in turn under the same
wrk command, then the report. Apart from common.py because it starts the peers (peers.py),
which build on common.py: common <- peers <- wrk_vs_nginx, with no circle."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import peers as PEERS
from common import (
    RAW_DIR,
    REPO_ROOT,
    WrkResult,
    WrkScenario,
    check_cpus,
    ensure_debian_packages,
    find_nginx,
    free_port,
    loadavg,
    machine_line,
    make_tmpdir,
    markdown_table,
    nginx_static,
    openinfer_server,
    paired_ratios,
    peer_list,
    plot_lines,
    ratio_row,
    rel,
    report_header,
    run_wrk,
    summarize,
    tool_version,
    wait_http_ready,
    write_csv,
    write_ratios,
)


def run_wrk_vs_nginx(sc: WrkScenario, args) -> int:
    """Per concurrency point: warm every server, then rounds of openinfer, each peer and
    nginx in turn (A B C ... A B C) under the same wrk command; write the report.
    Returns the process exit status (1 when any run failed)."""
    ensure_debian_packages([["wrk"], ["nginx-light", "nginx"]])
    check_cpus(args.server_cpu, args.client_cpu)
    T = sc.tag
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_dir = RAW_DIR / sc.name / stamp
    raw_dir.mkdir(parents=True, exist_ok=True)
    tmp = make_tmpdir(f"openinfer-{T}-nginx-")
    oi_port, ng_port = free_port(), free_port()
    started = time.monotonic()
    load_before = loadavg()
    results: dict[tuple[int, str], list[WrkResult]] = {}
    warm_errors: list[str] = []
    notes: list[str] = []
    fatal: list[str] = []
    peer_problems: list[str] = []

    oi = openinfer_server(oi_port, args.server_cpu, raw_dir / "openinfer.log",
                          threads=args.threads, extra=sc.serve_args)
    ng = nginx_static(ng_port, args.server_cpu, tmp)
    urls = {"openinfer": f"http://127.0.0.1:{oi_port}",
            "nginx": f"http://127.0.0.1:{ng_port}"}
    procs = {"openinfer": oi, "nginx": ng}
    names = ["openinfer"]
    peers: dict = {}
    try:
        with oi, ng:
            wait_http_ready(urls["openinfer"] + "/v2/health/ready", proc=oi)
            wait_http_ready(urls["nginx"] + "/", proc=ng)
            sc.check_openinfer(urls["openinfer"])
            sc.check_nginx(urls["nginx"])
            peers = PEERS.start_peers(peer_list(args.peers, sc.peers), args.server_cpu,
                                      raw_dir, peer_problems)
            PEERS.check_same_answers(peers, urls["openinfer"], peer_problems)
            for n, p in list(peers.items()):
                try:
                    sc.check_openinfer(p.http_url)
                except (SystemExit, Exception) as e:  # noqa: BLE001 - reported
                    peer_problems.append(f"{p.label} gives a wrong answer or error to this "
                                         f"request, so it is left out: {e}")
                    p.stop()
                    del peers[n]
                    continue
                urls[n], procs[n] = p.http_url, p.proc
                names.append(n)
            names.append("nginx")
            print(f"[{T}] servers {', '.join(f'{n} pid {procs[n].pid}' for n in names)}, all "
                  f"pinned to CPU {args.server_cpu}; wrk on CPU {args.client_cpu}", flush=True)
            print(f"[{T}] answers verified; concurrency {args.concurrency}, "
                  f"{args.rounds} rounds x {args.duration}s, warm-up {args.warmup}s",
                  flush=True)

            def one(server: str, c: int, dur: int, tag: str) -> WrkResult:
                r = run_wrk(urls[server] + sc.path, sc.script, c, dur,
                            args.client_cpu, label=server, servers=[procs[server]])
                (raw_dir / f"c{c}_{tag}_{server}.txt").write_text(r.raw)
                return r

            for c in args.concurrency:
                live = [s for s in names if procs[s].alive()]
                if args.warmup:
                    for s in live:
                        w = one(s, c, args.warmup, "warmup")
                        if not w.ok:
                            warm_errors.append(f"c={c} {s} warm-up: {w.error}")
                            print(f"[{T}] c={c} {s} warm-up FAILED: {w.error}",
                                  flush=True)
                for rnd in range(1, args.rounds + 1):
                    for s in live:  # A B C A B C ...
                        if not procs[s].alive():
                            continue
                        r = one(s, c, args.duration, f"r{rnd}")
                        results.setdefault((c, s), []).append(r)
                        state = "ok" if r.ok else f"FAILED: {r.error}"
                        print(f"[{T}] c={c:<3} round {rnd}/{args.rounds} {s:<9} "
                              f"{r.rps:>10,.0f} req/s  p50 {r.p50_us:>7.0f} us  "
                              f"p99 {r.p99_us:>7.0f} us  {state}", flush=True)
                if not oi.alive() or not ng.alive():
                    fatal.append("a server died during the run; later points skipped")
                    break

            # After load: still healthy and still correct?
            if oi.alive():
                try:
                    wait_http_ready(urls["openinfer"] + "/v2/health/ready",
                                    timeout=5, proc=oi)
                    sc.check_openinfer(urls["openinfer"])
                except (RuntimeError, SystemExit) as e:
                    fatal.append(f"openinfer failed the check after load: {e}")
                PEERS.check_same_answers(peers, urls["openinfer"], notes, after_load=True)
            for n, p in peers.items():
                if not p.alive():
                    notes.append(f"{p.label} exited during the run (rc={p.proc.returncode()}); "
                                 f"log tail:\n\n```\n{p.proc.log_tail(10)}\n```")
    finally:
        for p in peers.values():
            p.stop()
        err_log = tmp / "error.log"
        if err_log.exists() and err_log.stat().st_size:
            shutil.copy(err_log, raw_dir / "nginx-error.log")
        shutil.rmtree(tmp, ignore_errors=True)

    oi_log = oi.log_tail(40).strip()
    if oi_log:
        notes.append("openinfer log (level warning) was not empty:\n\n```\n"
                     + oi_log + "\n```")
    elapsed = time.monotonic() - started
    load = (load_before, loadavg())
    failed = _wrk_report(sc, args, names, peers, results, warm_errors + fatal,
                         peer_problems, notes, raw_dir, elapsed, load)
    print(f"[{T}] done in {elapsed:.0f}s; raw wrk output in "
          f"{raw_dir.relative_to(REPO_ROOT)}", flush=True)
    return 1 if failed else 0


def _label(name: str, peers: dict) -> str:
    if name in peers:
        return peers[name].label
    return {"nginx": "nginx return 200 (limit)"}.get(name, name)


def _wrk_report(sc: WrkScenario, args, names, peers, results, warm_errors, peer_problems,
                notes, raw_dir: Path, elapsed: float, load: tuple[str, str]) -> bool:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    md_path, csv_path, png_path = (out / f"{sc.name}.md", out / f"{sc.name}.csv",
                                   out / f"{sc.name}.png")
    any_failed = bool(warm_errors)

    rows = []
    for (c, s), runs in sorted(results.items()):
        for i, r in enumerate(runs, 1):
            rows.append([c, i, s, f"{r.rps:.1f}", r.requests, r.duration_s,
                         r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us,
                         r.non2xx, r.socket_errors, r.error or ""])
    write_csv(csv_path, ["concurrency", "round", "server", "rps", "requests",
                         "duration_s", "p50_us", "p90_us", "p99_us", "p999_us",
                         "max_us", "non2xx", "socket_errors", "error"], rows)

    def cell(runs, attr, spec=",.0f"):
        bad = [r for r in runs if not r.ok]
        if bad:
            return f"FAILED ({len(bad)}/{len(runs)} runs: {bad[0].error})"
        return summarize([getattr(r, attr) for r in runs]).fmt(spec)

    table, plot, ratio_rows = [], {s: ([], [], [], []) for s in names}, []
    for c in args.concurrency:
        a = results.get((c, "openinfer"), [])
        for s in names:
            b = results.get((c, s), [])
            if not b:
                continue
            if s == "openinfer":
                ratio = "1"
            elif any(not r.ok for r in a + b) or not a:
                any_failed = any_failed or s == "nginx"
                ratio = "FAILED"
            else:
                rs = paired_ratios([r.rps for r in a], [r.rps for r in b])
                ratio = summarize(rs).fmt(".2f")
                ratio_rows.append(ratio_row(sc.tag.upper(), f"c={c}", _label(s, peers),
                                            "limit" if s == "nginx" else "peer", "req/s", rs))
            table.append([c, _label(s, peers), cell(b, "rps"), ratio, cell(b, "p50_us"),
                          cell(b, "p99_us"), cell(b, "p999_us"), cell(b, "max_us")])
            if all(r.ok for r in b):
                sm = summarize([r.rps for r in b])
                for lst, v in zip(plot[s], (c, sm.median, sm.lo, sm.hi)):
                    lst.append(v)
    write_ratios(out, sc.name, ratio_rows)

    plot_note = None
    if table:
        plot_note = plot_lines(
            png_path, sc.plot_title, "concurrency (wrk connections)", "requests/s",
            {_label(s, peers): plot[s] for s in names})
        if plot_note:
            print(f"[{sc.tag}] note: {plot_note}", flush=True)

    peer_lines = [f"- {p.label}: {p.version}, `{p.command}` (ready {p.started_s:.1f} s after "
                  f"start); access/latency logging off. {' '.join(p.notes)}".rstrip()
                  for p in peers.values()]
    lines = report_header(sc.title, args.quick, elapsed) + [
        "**Claim: openinfer/X** = median of per-round ratios of req/s (min–max), X being "
        "each peer and the nginx limit; other cells are median (min–max) over rounds. "
        "Latency in µs as measured by wrk (closed loop, so latency ≈ concurrency / rate).",
        "",
        markdown_table(
            ["concurrency", "server", "req/s", "openinfer/X", "p50 µs", "p99 µs",
             "p99.9 µs", "max µs"], table),
        "## Method",
        "",
        *sc.work,
        f"- openinfer: `python -m openinfer serve --threads {args.threads} "
        "--log-level warning` (bundled example repository).",
        *peer_lines,
        "- Physical limit: nginx (Debian), private generated config, "
        "`worker_processes 1`, `access_log off`, keep-alive with "
        "`keepalive_requests 1000000000`, `return 200 '{\"ok\":true}'` "
        "(`default_type application/json`) for the same POST with the same bytes.",
        f"- Load: `taskset -c {args.client_cpu} wrk -t 1 -c <concurrency> "
        f"-d {args.duration}s --timeout 5s --latency -s {rel(sc.script)}`; every server "
        f"pinned with `taskset -c {args.server_cpu}` (all started at once and left idle "
        f"while another is measured); wrk pinned to CPU {args.client_cpu}. Triton's "
        "perf_analyzer was not used here (see summary.md: it cannot run on this machine).",
        f"- Per concurrency point: {args.warmup} s warm-up of each server "
        f"(discarded), then {args.rounds} rounds of the servers in turn "
        f"(A B C … A B C), {args.duration} s each. Any non-2xx answer, socket error or "
        "server exit marks the run FAILED instead of giving a number.",
        machine_line(load, [tool_version(['wrk', '-v']),
                            tool_version([find_nginx(), '-v'])]),
        f"- Per-run numbers: `{csv_path.name}`; raw wrk output and server logs: "
        f"`{raw_dir.relative_to(REPO_ROOT)}/` (not committed).",
        "",
    ]
    if plot_note:
        lines += [f"No plot: {plot_note}", ""]
    else:
        lines += [f"![{sc.tag.upper()} req/s vs concurrency]({png_path.name})", ""]
    if peer_problems:
        lines += ["## Peers that did not run", "", *[f"- {p}" for p in peer_problems], ""]
    if warm_errors or notes or any_failed:
        lines += ["## Problems", ""]
        lines += [f"- {e}" for e in warm_errors]
        lines += [f"- {n}" for n in notes]
        if any_failed and not warm_errors:
            lines += ["- Some measured runs failed (see table and CSV)."]
        lines += [""]
    md_path.write_text("\n".join(lines))
    print(f"[{sc.tag}] wrote {rel(md_path)}, "
          f"{rel(csv_path)}"
          + ("" if plot_note else f", {rel(png_path)}"),
          flush=True)
    print("\n" + markdown_table(
        ["c", "server", "req/s", "oi/X", "p50", "p99", "p99.9", "max"], table), flush=True)
    return any_failed
