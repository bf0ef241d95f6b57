"""Reusable pieces for the openinfer benchmarks (see ../shared/BENCHMARKS.md).

Everything here is standard library only, so a scenario runs with the
project's virtualenv and nothing else; matplotlib is used when importable.

Pieces:
  * machine facts (nproc, CPU model, kernel) and tool versions
  * Debian packages: check with dpkg-query, install with apt-get when root
  * free_port(), wait_http_ready()
  * ServerProcess: a pinned child process (taskset), stopped on exit/Ctrl-C
  * nginx_static(): a minimal static HTTP/1.1 responder, the request-rate limit
  * run_wrk(): one bounded wrk run, parsed (req/s, p50/p99, errors)
  * median/min/max and ratio helpers, Markdown and CSV writers, optional plot
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
RAW_DIR = RESULTS_DIR / "raw"  # git-ignored: raw tool output, quick runs

# --------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    try:
        out = subprocess.run(["nproc"], capture_output=True, text=True, check=True)
        return int(out.stdout.strip())
    except (OSError, ValueError, subprocess.CalledProcessError):
        return os.cpu_count() or 1


def tool_version(cmd: Sequence[str]) -> str:
    """First line of a tool's version output (stdout or stderr)."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    text = (p.stdout or "") + (p.stderr or "")
    return text.strip().splitlines()[0] if text.strip() else "unknown"


def loadavg() -> str:
    """1-minute load average and running/total tasks (other work on a shared
    machine shows up here)."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            parts = f.read().split()
        return f"{parts[0]} (1 min), tasks {parts[3]}"
    except (OSError, IndexError):
        return "unknown"


def machine_facts() -> dict[str, str]:
    return {
        "nproc": str(nproc()),
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# --------------------------------------------------------------------------
# Debian packages
# --------------------------------------------------------------------------


def dpkg_installed(pkg: str) -> bool:
    try:
        p = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "install ok installed" in p.stdout


def ensure_debian_packages(requirements: Sequence[Sequence[str]],
                           optional: bool = False) -> bool:
    """Each requirement is a list of alternatives, e.g. ["nginx-light", "nginx"].

    Missing ones are installed with apt-get when running as root (the first
    alternative is installed); otherwise exit with a clear message, or, when
    `optional`, print why and return False. Returns True when all are there.
    """
    missing: list[Sequence[str]] = [
        alts for alts in requirements if not any(dpkg_installed(a) for a in alts)
    ]
    if not missing:
        return True
    names = [alts[0] for alts in missing]
    desc = ", ".join(" or ".join(alts) for alts in missing)

    def fail(msg: str) -> bool:
        if optional:
            print(f"[setup] {msg} (optional; going on without)", flush=True)
            return False
        sys.exit(f"error: {msg}")

    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return fail(f"missing Debian packages: {desc}.\n"
                    f"Install them first, e.g.: sudo apt-get install -y {' '.join(names)}")
    print(f"[setup] installing Debian packages: {' '.join(names)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, timeout=300)
        r = subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *names],
            env=env, timeout=600,
        )
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = -1
    still = [alts for alts in missing if not any(dpkg_installed(a) for a in alts)]
    if rc != 0 or still:
        return fail(f"could not install Debian packages: {desc}")
    return True


# --------------------------------------------------------------------------
# Ports, readiness
# --------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_request(url: str, body: bytes | None = None, method: str | None = None,
                 headers: dict[str, str] | None = None,
                 timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_request_full(url: str, body: bytes | None = None, method: str = "GET",
                      headers: dict[str, str] | None = None,
                      timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Like http_request, with the response headers (names lower-cased)."""
    import http.client
    from urllib.parse import urlsplit
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""),
                     body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def wait_http_ready(url: str, timeout: float = 30.0,
                    proc: "ServerProcess | None" = None) -> None:
    """Poll url until it answers 200, or raise."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited (rc={proc.returncode()}) before ready; "
                f"log: {proc.log_path}\n{proc.log_tail()}")
        try:
            status, _ = http_request(url, timeout=1.0)
            if status == 200:
                if url.endswith("/v2/health/ready"):
                    _wait_loaded(url.removesuffix("/health/ready") + "/repository/index", deadline)
                return
            last = f"HTTP {status}"
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s ({last})")


def _wait_loaded(index_url: str, deadline: float) -> None:
    """Waits while the repository index shows a model LOADING: openinfer is ready before the
    examples that import heavy modules (tiny_llama: torch and transformers) have loaded, and a
    measurement taken meanwhile measures their load too. A server without the index returns."""
    while time.monotonic() < deadline:
        try:
            status, body = http_request(index_url, body=b"{}", method="POST", timeout=2.0)
        except (OSError, urllib.error.URLError):
            return
        if status != 200 or not any(m.get("state") == "LOADING" for m in json.loads(body)):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{index_url}: a model still LOADING")


# --------------------------------------------------------------------------
# Pinned child processes
# --------------------------------------------------------------------------

_LIVE: list["ServerProcess"] = []


def _stop_all() -> None:
    for p in list(_LIVE):
        p.stop()


def _on_sigterm(signum, frame):  # turn SIGTERM/SIGHUP into a clean unwind
    # A second signal must not cut the clean-up short (stopping the peers): a `pkill`
    # repeated while the first unwinds left tritonserver, MLServer and KServe running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


atexit.register(_stop_all)
signal.signal(signal.SIGTERM, _on_sigterm)
signal.signal(signal.SIGHUP, _on_sigterm)


class ServerProcess:
    """A child process pinned with taskset; stopped by stop(), at exit, or on
    Ctrl-C (callers use it as a context manager or rely on atexit)."""

    def __init__(self, name: str, argv: Sequence[str], cpus: str | None,
                 log_path: Path, stop_signal: int = signal.SIGTERM,
                 cwd: Path | None = None, env: dict[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        if cpus is not None:
            self.argv = ["taskset", "-c", cpus, *self.argv]
        self.cpus = cpus
        self.log_path = log_path
        self.stop_signal = stop_signal
        self.cwd = cwd
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=self.cwd, env=self.env,
        )
        _LIVE.append(self)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(self.stop_signal)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> "ServerProcess":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def openinfer_server(port: int, cpus: str | None, log_path: Path,
                     threads: int = 1, extra: Sequence[str] = (),
                     python: str | None = None, env: dict[str, str] | None = None) -> ServerProcess:
    """`python -m openinfer serve` on 127.0.0.1:port (bundled example repo); `env`: its
    environment (None: this process's)."""
    py = python or sys.executable
    # A free gRPC port unless the caller names one: the default (8001) may be taken by
    # something else on a shared machine, and then serve refuses to start.
    grpc = [] if "--grpc-port" in extra else ["--grpc-port", str(free_port())]
    # Likewise the metrics port (default 8002, Triton's, which a Triton peer may hold).
    named = any(a.startswith(("--metrics-port", "--allow-metrics")) for a in extra)
    metrics = [] if named else ["--metrics-port", str(free_port())]
    # Client shared memory is off by default on the command line (as in tritonserver); the
    # scenarios that use it are loopback clients of this host.
    shm = [] if any(a.startswith(("--allow-client-shm", "--allow-shared-memory", "--no-allow-shared-memory"))
                    for a in extra) else ["--allow-shared-memory"]
    argv = [py, "-m", "openinfer", "serve", "--host", "127.0.0.1",
            "--http-port", str(port), *grpc, *metrics, "--threads", str(threads),
            "--log-level", "warning", *shm, *extra]
    return ServerProcess("openinfer", argv, cpus, log_path, cwd=REPO_ROOT, env=env)


NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user_line}
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_timeout 300s;
    keepalive_requests 1000000000;
    client_body_buffer_size 64k;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
"""


def find_nginx() -> str:
    for cand in ("nginx", "/usr/sbin/nginx"):
        path = shutil.which(cand)
        if path:
            return path
    sys.exit("error: nginx binary not found (Debian package nginx-light or nginx)")


def nginx_static(port: int, cpus: str | None, tmpdir: Path,
                 body: str = '{"ok":true}') -> ServerProcess:
    """A private nginx (never the system one): generated config in tmpdir,
    foreground (daemon off), 1 worker, `return 200 body` for every path."""
    tmpdir.mkdir(parents=True, exist_ok=True)
    # As root the worker would switch to 'nobody'; stay root so the private
    # temp dir is usable. Non-root nginx ignores the user directive anyway.
    user_line = "user root;" if os.geteuid() == 0 else ""
    conf = tmpdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmpdir, port=port, body=body,
                                      user_line=user_line))
    argv = [find_nginx(), "-p", str(tmpdir), "-c", str(conf),
            "-e", str(tmpdir / "error.log"), "-g", "daemon off;"]
    # SIGQUIT = graceful shutdown of master + worker.
    return ServerProcess("nginx", argv, cpus, tmpdir / "stdout.log",
                         stop_signal=signal.SIGQUIT)


# --------------------------------------------------------------------------
# wrk
# --------------------------------------------------------------------------

WRK_DIR = BENCH_DIR / "wrk"
# Every wrk script loads wrk/report.lua, which prints one "BENCH_RESULT ..."
# line with exact percentiles and error counters; parse_wrk() reads it.
WRK_REPORT_LUA = WRK_DIR / "report.lua"


def lua_quote(data: str | bytes) -> str:
    """A Lua string literal for arbitrary bytes (printable ASCII kept,
    everything else as \\ddd escapes)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    out = ['"']
    for b in data:
        ch = chr(b)
        if 32 <= b < 127 and ch not in '"\\':
            out.append(ch)
        else:
            out.append(f"\\{b:03d}")
    out.append('"')
    return "".join(out)


def write_wrk_script(path: Path, method: str, body: str | bytes | None,
                     headers: dict[str, str], comment: Sequence[str] = ()) -> Path:
    """Generate a wrk Lua script sending one fixed request (for scenarios
    whose body is built at run time); it loads wrk/report.lua. A script
    written into benchmarks/wrk/ finds report.lua next to itself (so the
    committed file works from any checkout); elsewhere by absolute path.
    The output is deterministic: regenerating leaves the file unchanged."""
    lines = ["-- generated by benchmarks/common.py; do not edit by hand"]
    lines += [f"-- {c}" for c in comment]
    lines.append(f'wrk.method = "{method}"')
    for k, v in headers.items():
        lines.append(f"wrk.headers[{lua_quote(k)}] = {lua_quote(v)}")
    if body is not None:
        lines.append(f"wrk.body = {lua_quote(body)}")
    if path.resolve().parent == WRK_DIR:
        lines.append('local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"')
        lines.append('dofile(here .. "report.lua")')
    else:
        lines.append(f"dofile({lua_quote(str(WRK_REPORT_LUA))})")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


@dataclasses.dataclass
class WrkResult:
    label: str
    connections: int
    duration_s: float
    requests: int = 0
    rps: float = 0.0
    p50_us: float = float("nan")
    p90_us: float = float("nan")
    p99_us: float = float("nan")
    p999_us: float = float("nan")
    max_us: float = float("nan")
    non2xx: int = 0
    socket_errors: int = 0
    error: str | None = None  # set when the run failed (wrk rc, errors, crash)
    raw: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


_RE_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
_RE_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_RE_SOCKERR = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_RE_RESULT = re.compile(r"BENCH_RESULT (.*)")


def parse_wrk(text: str, res: WrkResult) -> WrkResult:
    res.raw = text
    problems = []
    m = _RE_RESULT.search(text)
    if m:
        kv = dict(tok.split("=", 1) for tok in m.group(1).split())
        res.requests = int(kv["requests"])
        dur_us = int(kv["duration_us"])
        if dur_us > 0:
            res.rps = res.requests / (dur_us / 1e6)
        for key in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us"):
            setattr(res, key, float(kv[key]))
        res.non2xx = int(kv["status"])
        res.socket_errors = sum(int(kv[k]) for k in
                                ("connect", "read", "write", "timeout"))
    else:
        problems.append("no BENCH_RESULT line in wrk output")
    m = _RE_RPS.search(text)
    if m and not res.rps:
        res.rps = float(m.group(1))
    m = _RE_NON2XX.search(text)
    if m:
        res.non2xx = max(res.non2xx, int(m.group(1)))
    m = _RE_SOCKERR.search(text)
    if m:
        res.socket_errors = max(res.socket_errors,
                                sum(int(g) for g in m.groups()))
    if res.non2xx:
        problems.append(f"{res.non2xx} non-2xx/3xx responses")
    if res.socket_errors:
        problems.append(f"socket errors: {m.group(0) if m else res.socket_errors}")
    if res.requests == 0 and not problems:
        problems.append("no requests completed")
    if problems:
        res.error = "; ".join(problems)
    return res


def run_wrk(url: str, script: Path, connections: int, duration_s: float,
            cpus: str | None, label: str = "", threads: int = 1,
            timeout_s: float = 5.0,
            servers: Iterable[ServerProcess] = ()) -> WrkResult:
    """One wrk run, bounded in time. `servers` are checked to still be alive
    afterwards (a crash makes the run fail)."""
    threads = max(1, min(threads, connections))
    dur = max(1, int(round(duration_s)))
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{dur}s",
            "--timeout", f"{timeout_s:g}s", "--latency", "-s", str(script), url]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    res = WrkResult(label=label, connections=connections, duration_s=dur)
    try:
        p = subprocess.run(argv, capture_output=True, text=True,
                           timeout=dur + timeout_s + 30)
    except subprocess.TimeoutExpired as e:
        res.error = f"wrk did not finish in {dur + timeout_s + 30:.0f}s"
        res.raw = (e.stdout or b"").decode(errors="replace") if isinstance(
            e.stdout, bytes) else (e.stdout or "")
        return res
    parse_wrk(p.stdout + p.stderr, res)
    if p.returncode != 0:
        res.error = (res.error + "; " if res.error else "") + f"wrk rc={p.returncode}"
    for s in servers:
        if not s.alive():
            res.error = ((res.error + "; ") if res.error else "") + \
                f"{s.name} died (rc={s.returncode()})"
    return res


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Summary:
    median: float
    lo: float
    hi: float
    n: int

    def fmt(self, spec: str = ",.0f", unit: str = "") -> str:
        if self.n == 0:
            return "–"
        if self.n == 1:
            return f"{self.median:{spec}}{unit}"
        return (f"{self.median:{spec}}{unit} "
                f"({self.lo:{spec}}–{self.hi:{spec}})")


def summarize(values: Sequence[float]) -> Summary:
    vals = [v for v in values if v == v]  # drop NaN
    if not vals:
        return Summary(float("nan"), float("nan"), float("nan"), 0)
    return Summary(statistics.median(vals), min(vals), max(vals), len(vals))


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a[i]/b[i] (rounds are run side by side)."""
    return [x / y for x, y in zip(a, b) if y]


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   align: Sequence[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    sep = {"l": ":---", "r": "---:", "c": ":---:"}
    out = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join(sep[a] for a in align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out) + "\n"


def write_csv(path: Path, headers: Sequence[str],
              rows: Iterable[Sequence[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(headers)
        for r in rows:
            w.writerow(r)


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_lines(path: Path, title: str, xlabel: str, ylabel: str,
               series: dict[str, tuple[Sequence[float], Sequence[float],
                                       Sequence[float], Sequence[float]]],
               logx: bool = True, logy: bool = False) -> str | None:
    """series: label -> (x, median, lo, hi). Returns None on success, or a
    note explaining why no PNG was written. matplotlib is not a product
    requirement: when this Python lacks it, the plot is drawn by the benchmark
    tools venv (benchmarks/.venvs/tools, installed by venvs.py)."""
    if not have_matplotlib():
        import json
        try:
            import venvs
            py = venvs.tools_python()
        except Exception as e:  # noqa: BLE001 - explained in the report
            return f"matplotlib is not importable and the tools venv failed: {e}"
        spec = json.dumps({"path": str(path), "title": title, "xlabel": xlabel,
                           "ylabel": ylabel, "series": series, "logx": logx,
                           "logy": logy})
        r = subprocess.run([str(py), str(Path(__file__).resolve()), "--plot"],
                           input=spec, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return f"plotting in the tools venv failed: {r.stderr.strip()[-300:]}"
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (x, med, lo, hi) in series.items():
        pts = [(a, m, l, h) for a, m, l, h in zip(x, med, lo, hi) if m == m]
        if not pts:
            continue
        xs, ms, ls, hs = zip(*pts)
        yerr = [[m - l for m, l in zip(ms, ls)], [h - m for m, h in zip(ms, hs)]]
        ax.errorbar(xs, ms, yerr=yerr, marker="o", capsize=4, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if not logy:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def parse_int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: expected comma-separated integers, got {s!r}")
    if not vals or any(v < 1 for v in vals):
        raise SystemExit(f"error: expected positive integers, got {s!r}")
    return vals


def check_cpus(*cpus: str) -> None:
    """Fail early when a pinning target does not exist on this machine."""
    allowed = os.sched_getaffinity(0)
    for spec in cpus:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            for c in range(int(lo), int(hi or lo) + 1):
                if c not in allowed:
                    sys.exit(f"error: CPU {c} is not available "
                             f"(allowed: {sorted(allowed)}); use --server-cpu/--client-cpu")


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def make_tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def python_model_repo(tmp: Path, name: str, config: str, model_py: str) -> Path:
    """A repository under tmp/repo holding one Python model (version 1); returns its path."""
    d = tmp / "repo" / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    (d / "1" / "model.py").write_text(model_py)
    return tmp / "repo"


def git_describe() -> str:
    """Short commit of the repository, with '+dirty' for local changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short",
                               "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        # Results written by the run itself (benchmarks/results/) do not make the code dirty.
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/results"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def invocation() -> str:
    """The command line that ran this script, relative to the repository."""
    py = os.path.relpath(sys.executable, REPO_ROOT) if sys.executable.startswith(
        str(REPO_ROOT)) else sys.executable
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)
    return shlex.join([py, script, *sys.argv[1:]])


def report_header(title: str, quick: bool, elapsed: float) -> list[str]:
    """The first lines of every results page: title, when, which commit, the
    exact command."""
    return [f"# {title}{' (quick check)' if quick else ''}", "",
            f"Run {now_utc()}, openinfer commit `{git_describe()}`, "
            f"{elapsed:.0f} s wall.", "", "```", invocation(), "```", ""]


def machine_line(load: tuple[str, str], tools: Sequence[str] = ()) -> str:
    """One Method bullet: machine, tool versions, load average before/after."""
    f = machine_facts()
    extra = "".join(f"; {t}" for t in tools)
    return (f"- Machine: nproc {f['nproc']}, CPU {f['cpu']}, kernel {f['kernel']}, "
            f"Python {f['python']}{extra}; load average before {load[0]}, after "
            f"{load[1]} (the machine is shared: other work on it shows up as noise).")


def problems_section(problems: Sequence[str]) -> list[str]:
    if not problems:
        return []
    return ["## Problems", "", *[f"- {p}" for p in problems], ""]


def write_report(name: str, out: Path, lines: Sequence[str], tag: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    md.write_text("\n".join(lines))
    print(f"[{tag}] wrote {rel(md)}", flush=True)
    return md


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def fmt_size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------
# wrk against openinfer and the nginx limit (S1, S2): one driver
# --------------------------------------------------------------------------


@dataclasses.dataclass
class WrkScenario:
    """What differs between the wrk scenarios; wrk_vs_nginx.run_wrk_vs_nginx() does the rest."""
    name: str                 # results file stem, e.g. "s1_http_json"
    tag: str                  # log prefix, e.g. "s1"
    title: str                # Markdown title
    plot_title: str
    path: str                 # request path, e.g. /v2/models/simple/infer
    script: Path              # wrk Lua script
    check_openinfer: Callable[[str], None]  # base URL -> raise/exit when wrong (any V2 server)
    check_nginx: Callable[[str], None]
    work: Sequence[str]       # Method bullets describing the request
    peers: Sequence[str] = ()  # peers.py names run side by side (triton, mlserver, kserve)
    serve_args: Sequence[str] = ()  # more `openinfer serve` arguments (a repository: the examples')


def wrk_args(doc: str, argv: Sequence[str] | None = None) -> "argparse.Namespace":
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="check run: concurrency 1,64, 1 round of 1 s (< 1 min)")
    ap.add_argument("--concurrency", help="comma-separated wrk connection counts "
                    "(default 1,8,64; quick 1,64)")
    ap.add_argument("--duration", type=int, help="seconds per measured run "
                    "(default 3; quick 1)")
    ap.add_argument("--rounds", type=int, help="A/B rounds per point "
                    "(default 3; quick 1)")
    ap.add_argument("--warmup", type=int, help="seconds of discarded warm-up per "
                    "server and point (default 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="openinfer event-loop threads (1)")
    ap.add_argument("--peers", default=None, help="comma-separated peers to run side by "
                    "side (default: the scenario's; 'none' for none)")
    ap.add_argument("--server-cpu", default="0", help="taskset CPU list for every "
                    "server (0)")
    ap.add_argument("--client-cpu", default="1", help="taskset CPU list for wrk (1)")
    ap.add_argument("--out", type=Path, help="results directory (default "
                    "benchmarks/results; quick: benchmarks/results/raw)")
    a = ap.parse_args(argv)
    a.concurrency = parse_int_list(a.concurrency or ("1,64" if a.quick else "1,8,64"))
    a.duration = a.duration or (1 if a.quick else 3)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.warmup = a.warmup if a.warmup is not None else 1
    if a.duration < 1 or a.rounds < 1 or a.warmup < 0:
        ap.error("--duration and --rounds must be >= 1, --warmup >= 0")
    a.out = a.out or (RAW_DIR if a.quick else RESULTS_DIR)
    return a


def model_args(doc: str, extra: Callable[["argparse.ArgumentParser"], None] | None = None) -> "argparse.Namespace":
    """The options of the scenarios that serve a model against its in-process call (S6, S12,
    S14): rounds, duration, batching connections and size, pinning, output; `extra` adds a
    scenario's own. Checks the CPUs and that wrk is there."""
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s, no warm-up")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections for batching")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--out", type=Path, default=None)
    if extra is not None:
        extra(ap)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.duration = 1, 1.0
    check_cpus(a.server_cpu, a.client_cpu)
    if shutil.which("wrk") is None:
        ensure_debian_packages([["wrk"]])
    return a


def peer_list(arg: str | None, default: Sequence[str]) -> list[str]:
    if arg is None:
        return list(default)
    return [] if arg.strip().lower() in ("", "none") else [p for p in arg.split(",") if p]


def write_ratios(out: Path, name: str, rows: Sequence[dict]) -> Path:
    """<name>.ratios.json: the scenario's claims for benchmarks/summary.py — each row
    {scenario, point, against, kind ('peer'|'limit'), metric, median, lo, hi, n, command}."""
    import json
    path = out / f"{name}.ratios.json"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": invocation(), "when": now_utc(),
                                "commit": git_describe(), "rows": list(rows)}, indent=1))
    return path


def ratio_row(scenario: str, point: str, against: str, kind: str, metric: str,
              ratios: Sequence[float], note: str = "") -> dict:
    s = summarize(ratios)
    return {"scenario": scenario, "point": point, "against": against, "kind": kind,
            "metric": metric, "median": s.median, "lo": s.lo, "hi": s.hi, "n": s.n,
            "note": note}


# --------------------------------------------------------------------------
# Client-side load in pinned worker processes (S4, S7)
# --------------------------------------------------------------------------

LOADGEN = BENCH_DIR / "loadgen.py"


class WorkerError(RuntimeError):
    pass


class Worker(ServerProcess):
    """A long-lived pinned child (benchmarks/loadgen.py) that answers one JSON
    line per JSON-line command: the load generator of the Python-client
    scenarios. Keeping it in its own process keeps its CPU time (getrusage,
    all its threads) and its pinning apart from the driver's. stderr goes to
    log_path."""

    def __init__(self, name: str, kind: str, args: Sequence[str], cpus: str | None,
                 log_path: Path, python: str | None = None):
        argv = [python or sys.executable, str(LOADGEN), kind, *args]
        super().__init__(name, argv, cpus, log_path, cwd=REPO_ROOT)
        self._lines = None
        self.info: dict = {}

    def start(self) -> "Worker":
        import queue
        import threading
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, cwd=self.cwd, env=self.env, text=True, bufsize=1)
        _LIVE.append(self)
        self._lines = queue.Queue()
        out = self.proc.stdout

        def pump():
            for line in out:
                self._lines.put(line)
            self._lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        self.info = self._answer(60.0)
        return self

    def _answer(self, timeout: float) -> dict:
        import json
        import queue
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WorkerError(f"{self.name}: no answer in {timeout:.0f}s (killed)")
        if line is None:
            raise WorkerError(f"{self.name} exited (rc={self.proc.wait()}); "
                              f"log {self.log_path}:\n{self.log_tail()}")
        res = json.loads(line)
        if "error" in res:
            raise WorkerError(f"{self.name}: {res['error']}")
        return res

    def call(self, op: str, timeout: float = 120.0, **kw) -> dict:
        import json
        if not self.alive():
            raise WorkerError(f"{self.name} is not running (rc={self.returncode()})")
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the worker exits at end of input
                self.proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                pass
        super().stop(timeout)


@dataclasses.dataclass
class LoopResult:
    """One measured client loop, as loadgen.py reports it."""
    label: str
    n: int = 0
    elapsed: float = float("nan")
    cpu: float = float("nan")         # client process CPU seconds (user+sys)
    bytes_per_req: int = 0            # payload counted per request (both ways)
    p50_us: float = float("nan")
    p90_us: float = float("nan")
    p99_us: float = float("nan")
    max_us: float = float("nan")
    server_cpu: float = float("nan")  # server process CPU seconds over the call
    error: str | None = None

    @classmethod
    def from_answer(cls, label: str, a: dict) -> "LoopResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(label=label, **{k: v for k, v in a.items() if k in fields})

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rps(self) -> float:
        return self.n / self.elapsed if self.ok and self.elapsed else float("nan")

    @property
    def gbps(self) -> float:
        return (self.n * self.bytes_per_req / self.elapsed / 1e9
                if self.ok and self.elapsed else float("nan"))

    @property
    def cpu_us_per_req(self) -> float:
        return self.cpu / self.n * 1e6 if self.ok and self.n else float("nan")

    @property
    def server_cpu_pct(self) -> float:
        """Server CPU use over the loop, % of one core (includes the worker's
        own set-up and check around the measured loop, so a slight over-estimate)."""
        return (100 * self.server_cpu / self.elapsed if self.ok and self.elapsed
                else float("nan"))


def worker_loop(w: Worker, label: str, op: str, server: ServerProcess | None = None,
                **kw) -> LoopResult:
    """One measured loop on a worker; a failure (or the server dying) becomes a
    FAILED result. With `server`, its CPU seconds over the call are recorded."""
    cpu0 = proc_cpu_seconds(server.pid) if server else float("nan")
    try:
        r = LoopResult.from_answer(label, w.call(op, **kw))
    except WorkerError as e:
        r = LoopResult(label=label, error=str(e))
    if server is not None:
        r.server_cpu = proc_cpu_seconds(server.pid) - cpu0
        if not server.alive():
            r.error = ((r.error + "; ") if r.error else "") + \
                f"{server.name} died (rc={server.returncode()})"
    return r


def cell_of(runs: Sequence[LoopResult], attr: str, spec: str = ",.0f") -> str:
    bad = [r for r in runs if not r.ok]
    if bad:
        return f"FAILED ({len(bad)}/{len(runs)}: {bad[0].error})"
    return summarize([getattr(r, attr) for r in runs]).fmt(spec)


def ratio_of(a: Sequence[LoopResult], b: Sequence[LoopResult], attr: str,
             spec: str = ".2f") -> str:
    if not a or not b or any(not r.ok for r in list(a) + list(b)):
        return "FAILED" if a and b else "–"
    return summarize(paired_ratios([getattr(r, attr) for r in a],
                                   [getattr(r, attr) for r in b])).fmt(spec)


def rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def proc_cpu_seconds(pid: int | None) -> float:
    """user+system CPU seconds of a process (all its threads) from /proc."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def parse_size_list(s: str) -> list[int]:
    """'4K,1M,16M,64M' -> bytes (binary units; plain numbers are bytes)."""
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for tok in s.split(","):
        tok = tok.strip().upper().removesuffix("IB").removesuffix("B")
        if not tok:
            continue
        unit = tok[-1] if tok[-1] in mult else ""
        try:
            out.append(int(float(tok[:len(tok) - len(unit)]) * mult[unit]))
        except ValueError:
            raise SystemExit(f"error: bad size {tok!r} in {s!r}")
    if not out or any(v < 4 for v in out):
        raise SystemExit(f"error: expected sizes of at least 4 bytes, got {s!r}")
    return out


def alternate(tag: str, point: str,
              contenders: Sequence[tuple[str, Callable[[float], LoopResult]]],
              rounds: int, seconds: float, warmup: float,
              show: Callable[[LoopResult], str] | None = None
              ) -> dict[str, list[LoopResult]]:
    """Warm up each contender (discarded), then `rounds` rounds running them
    in turn (A B A B ...), `seconds` each. Returns name -> results per round."""
    show = show or (lambda r: f"{r.rps:>10,.0f} req/s  p50 {r.p50_us:>8.0f} us  "
                              f"p99 {r.p99_us:>8.0f} us")
    out: dict[str, list[LoopResult]] = {name: [] for name, _ in contenders}
    if warmup > 0:
        for name, fn in contenders:
            r = fn(warmup)
            if not r.ok:
                print(f"[{tag}] {point} {name} warm-up FAILED: {r.error}", flush=True)
    for rnd in range(1, rounds + 1):
        for name, fn in contenders:
            r = fn(seconds)
            out[name].append(r)
            print(f"[{tag}] {point:<24} round {rnd}/{rounds} {name:<13} "
                  + (show(r) if r.ok else f"FAILED: {r.error}"), flush=True)
    return out


if __name__ == "__main__" and sys.argv[1:] == ["--plot"]:
    # Used by plot_lines() from another Python: draws one PNG from a JSON spec on stdin.
    import json
    _spec = json.load(sys.stdin)
    _note = plot_lines(Path(_spec["path"]), _spec["title"], _spec["xlabel"], _spec["ylabel"],
                       {k: tuple(v) for k, v in _spec["series"].items()}, _spec["logx"],
                       _spec["logy"])
    sys.exit(1 if _note else 0)
