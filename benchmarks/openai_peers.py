#!/usr/bin/env python3
"""OpenAI's API beside KServe's: openinfer and KServe's OpenAI-compatible server
(`kserve.protocol.rest.openai`, peers/kserve_openai_serve.py) serving the same deterministic toy
language model (examples/models/toy_llm): streamed chats and completions of a fixed number of
tokens (1 and 16), requests per second and server CPU per request at concurrency 1 and 16.

Both servers run at once, each pinned to CPU 0 (where there are two CPUs; one event-loop thread
for openinfer, one uvicorn worker for KServe), the readers on CPU 1: raw-socket keep-alive
connections, one thread each, sending the same streamed request over and over (the reader of
openai_frontend.py). Each round measures every server in every case, the order of the
servers alternating from round to round; the ratio openinfer / KServe is taken per round and
its median reported, with min and max. Before the load (and again after it) both servers must
answer the same text and finish reason for the same chat and completion, streamed and not, or
the peer is left out with the difference.

    .venv/bin/python benchmarks/openai_peers.py [--peers kserve] [--quick] [--rounds R]
        [--seconds S] [--tokens 1,16] [--concurrency 1,16] [--endpoints chat,completions]

KServe's venv (benchmarks/.venvs/kserve-openai) is made by peers.py on first use. Results:
benchmarks/results/openai_peers.md (raw/ with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402
import peers as P  # noqa: E402
from openai_frontend import streams_per_second  # noqa: E402
from s11_streaming import cpu_seconds  # noqa: E402

NAME = "openai_peers"
MODEL = "toy_llm"
PEER_OF = {"kserve": "kserve-openai"}  # --peers name -> peers.py's peer
GOAL = 3.0  # issue 42: openinfer >= 3x KServe's request throughput at concurrency 16


# The measured endpoints: path and request body for a user message, n tokens, streamed or not.
ENDPOINTS = {
    "chat": ("/v1/chat/completions", lambda content, n, stream: {
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": n, "stream": stream}),
    "completions": ("/v1/completions", lambda content, n, stream: {
        "model": MODEL, "prompt": content, "max_tokens": n, "stream": stream}),
}


def raw_request(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def answer(base: str, path: str, body: dict) -> tuple[str, str | None]:
    """(text, finish_reason) of one request, whole or streamed (the events' pieces joined)."""
    status, raw = C.http_request(base + path, json.dumps(body).encode(), "POST",
                                 {"Content-Type": "application/json"}, timeout=30)
    if status != 200:
        raise RuntimeError(f"{path} answered HTTP {status}: {raw[:300]!r}")
    chat = path.endswith("chat/completions")
    if not body.get("stream"):
        choice = json.loads(raw)["choices"][0]
        return (choice["message"]["content"] if chat else choice["text"]), choice["finish_reason"]
    text, finish = "", None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            text += (choice.get("delta", {}).get("content") if chat else choice.get("text")) or ""
            finish = choice.get("finish_reason") or finish
    return text, finish


def fixed_length_prompt(base: str, n: int) -> str:
    """A user message whose answer is n tokens long (finish_reason "length") as a chat and as a
    completion: the toy stops at the end of a sentence, so the message picks a place in its text
    with n tokens before one."""
    for i in range(200):
        content = f"question {i}"
        answers = [answer(base, path, body(content, n, False)) for path, body in ENDPOINTS.values()]
        if all(finish == "length" and len(text.encode()) == n for text, finish in answers):
            return content
    raise RuntimeError(f"no prompt gives {n} tokens without a sentence end")


def difference(ours: str, theirs: str, content: str, n: int) -> str | None:
    """None when both servers answer the same (text, finish reason) for a chat and a
    completion, streamed and not; else what differed."""
    for path, body in ENDPOINTS.values():
        for stream in (False, True):
            a, b = answer(ours, path, body(content, n, stream)), answer(theirs, path, body(content, n, stream))
            if a != b:
                return f"{path} stream={stream}: {b!r} where openinfer answers {a!r}"
    return None


def measure(port: int, pid: int, req: bytes, seconds: float, concurrency: int) -> tuple[float, float, float]:
    """(requests/s, server CPU ms per request, the readers' CPU share) of one run."""
    c0, r0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    rps = streams_per_second(port, req, seconds, concurrency)
    wall = time.perf_counter() - t0
    return rps, (cpu_seconds(pid) - c0) * 1e3 / (rps * wall), (time.process_time() - r0) / wall


def run(args, endpoints: list[str], levels: list[int], rounds: int, seconds: float,
        server_cpu: str | None, tmp: Path, problems: list[str]) -> dict:
    """Start openinfer and the peers, check their answers, measure. Returns what the report
    needs: the user message, the servers' commands and versions, and runs[(endpoint, server,
    concurrency)] = [(requests/s, server CPU ms per request, readers' CPU share), ...]."""
    shutil.copytree(P.TOY_LLM, tmp / "repo" / MODEL)
    port = C.free_port()
    server = C.openinfer_server(port, server_cpu, tmp / "openinfer.log", threads=1,
                                extra=[str(tmp / "repo")]).start()
    ours = f"http://127.0.0.1:{port}"
    started: dict[str, P.Peer] = {}
    try:
        C.wait_http_ready(f"{ours}/v2/models/{MODEL}/ready", timeout=120, proc=server)
        started = P.start_peers([PEER_OF[n] for n in args.peer_names], server_cpu, tmp, problems,
                                models=(MODEL,))
        contents = {n: fixed_length_prompt(ours, n) for n in args.tokens}
        for key, peer in list(started.items()):
            why = next(filter(None, (difference(ours, peer.http_url, contents[n], n) for n in args.tokens)), None)
            if why:
                problems.append(f"{peer.label} left out: its answers differ from openinfer's: {why}")
                peer.stop()
                del started[key]
        servers = {"openinfer": (port, server.pid)}
        servers.update({p.label: (p.http_port, p.proc.pid) for p in started.values()})
        cases = [(e, n) for e in endpoints for n in args.tokens]
        reqs = {(e, n): raw_request(ENDPOINTS[e][0], ENDPOINTS[e][1](contents[n], n, True)) for e, n in cases}
        for srv_port, _ in servers.values():  # warm-up
            for req in reqs.values():
                streams_per_second(srv_port, req, 0.5, max(levels))
        runs = {(*case, s, c): [] for case in cases for s in servers for c in levels}
        for r in range(rounds):  # every server in turn, the order alternating
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for case in cases:
                for c in levels:
                    for s in order:
                        runs[(*case, s, c)].append(measure(*servers[s], reqs[case], seconds, c))
        for peer in started.values():
            why = next(filter(None, (difference(ours, peer.http_url, contents[n], n) for n in args.tokens)), None)
            peer.notes.append("its answers equal openinfer's for the same chat and completion, streamed and "
                              f"not, before the load{'' if why else ' and after it'}")
            if why:
                problems.append(f"{peer.label} answered differently from openinfer after the load: {why}")
    finally:
        for peer in started.values():
            peer.stop()
        server.stop()
    return {"contents": contents, "runs": runs, "peers": list(started.values()), "command": server.command}


def report(args, result: dict, endpoints: list[str], levels: list[int], rounds: int, seconds: float,
           server_cpu: str | None, load: list[str], elapsed: float, problems: list[str]) -> list[str]:
    runs, peers = result["runs"], result["peers"]
    lines = C.report_header("OpenAI's API beside KServe's OpenAI server", args.quick, elapsed)
    prompts = ", ".join(f"{n}: {m!r}" for n, m in result["contents"].items())
    lines += [f"Streamed answers of a fixed number of tokens (`max_tokens`, finish_reason `length`; the user "
              f"message or prompt per count: {prompts}) of `{MODEL}`, the deterministic toy model: "
              f"{seconds:g} s per server, case, concurrency and round, {rounds} round(s); servers on CPU "
              f"{server_cpu or 'any'}, readers on CPU {'1' if server_cpu else 'any'}. Requests/s: the median "
              "(min–max) over the rounds; openinfer / peer: the median (min–max) of the per-round ratios.", ""]
    headers = ["endpoint", "tokens", "concurrency", "openinfer req/s", "openinfer server CPU ms/req"]
    for peer in peers:
        headers += [f"{peer.label} req/s", f"{peer.label} server CPU ms/req", f"openinfer / {peer.label}"]
    rows, goals = [], []
    for e, n, c in [(e, n, c) for e in endpoints for n in args.tokens for c in levels]:
        ours = [x[0] for x in runs[e, n, "openinfer", c]]
        row = [ENDPOINTS[e][0], n, c, C.summarize(ours).fmt(),
               C.summarize([x[1] for x in runs[e, n, "openinfer", c]]).fmt(".2f")]
        for peer in peers:
            theirs = runs[e, n, peer.label, c]
            ratio = C.summarize(C.paired_ratios(ours, [x[0] for x in theirs]))
            row += [C.summarize([x[0] for x in theirs]).fmt(), C.summarize([x[1] for x in theirs]).fmt(".2f"),
                    ratio.fmt(".2f", "x")]
            if (e, c) == ("chat", 16):
                goals.append(f"Goal (issue 42): openinfer ≥ {GOAL:g}x {peer.label}'s requests/s on streamed chat "
                             f"completions of {n} token(s) at concurrency 16: "
                             f"{'met' if ratio.median >= GOAL else 'not met'} ({ratio.median:.2f}x).")
        rows.append(row)
    reader = max((x[2] for v in runs.values() for x in v), default=float("nan"))
    lines += [C.markdown_table(headers, rows), "", *goals, "", "## Method", ""]
    lines += [f"- {p.label}: {p.version}, `{p.command}` (KSERVE_OPENAI_ROUTE_PREFIX=\"\"); "
              + "; ".join(p.notes) + "." for p in peers]
    lines += [f"- openinfer: `{result['command']}`.",
              "- Server CPU ms per request: the server process's user + system time over the run (/proc/PID/stat; "
              "each server is one process) divided by the requests it answered.",
              f"- The readers (one thread per connection, raw sockets) used at most {reader:.0%} of their CPU.",
              C.machine_line(tuple(load)), ""]
    return lines + C.problems_section(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="kserve", help="comma-separated: kserve")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0, help="per server, endpoint, concurrency and round")
    ap.add_argument("--tokens", default="1,16", help="tokens per answer, comma-separated")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--endpoints", default="chat,completions", help="comma-separated: chat, completions")
    ap.add_argument("--out", type=Path, default=None, help="where openai_peers.md goes (results/, raw/ when quick)")
    args = ap.parse_args()
    args.peer_names = C.peer_list(args.peers, ["kserve"])
    endpoints = [e for e in args.endpoints.split(",") if e]
    for what, given, known in (("--peers", args.peer_names, PEER_OF), ("--endpoints", endpoints, ENDPOINTS)):
        if not given or set(given) - set(known):
            ap.error(f"{what}: {','.join(given) or 'none'}; known: {','.join(known)}")
    args.tokens = C.parse_int_list(args.tokens)
    rounds, seconds = (1, 2.0) if args.quick else (args.rounds, args.seconds)
    levels = C.parse_int_list(args.concurrency)
    out = args.out or C.RESULTS_DIR / ("raw" if args.quick else "")
    cpus = os.sched_getaffinity(0)
    server_cpu = "0" if len(cpus) >= 2 else None
    load, problems, t0 = [C.loadavg()], [], time.monotonic()
    if server_cpu:  # the readers on the other CPU
        os.sched_setaffinity(0, {1})
    try:
        result = run(args, endpoints, levels, rounds, seconds, server_cpu, C.make_tmpdir("openai-peers-"), problems)
    finally:
        os.sched_setaffinity(0, cpus)  # the report's machine line counts the CPUs
    load.append(C.loadavg())
    lines = report(args, result, endpoints, levels, rounds, seconds, server_cpu, load, time.monotonic() - t0, problems)
    print("\n".join(lines))
    C.write_report(NAME, out, lines, "openai_peers")


if __name__ == "__main__":
    main()
