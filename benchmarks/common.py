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


def ensure_debian_packages(requirements: Sequence[Sequence[str]]) -> None:
    """Each requirement is a list of alternatives, e.g. ["nginx-light", "nginx"].

    Missing ones are installed with apt-get when running as root (the first
    alternative is installed); otherwise exit with a clear message.
    """
    missing: list[Sequence[str]] = [
        alts for alts in requirements if not any(dpkg_installed(a) for a in alts)
    ]
    if not missing:
        return
    names = [alts[0] for alts in missing]
    desc = ", ".join(" or ".join(alts) for alts in missing)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(
            f"error: missing Debian packages: {desc}.\n"
            f"Install them first, e.g.: sudo apt-get install -y {' '.join(names)}"
        )
    print(f"[setup] installing Debian packages: {' '.join(names)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=False, env=env)
    r = subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *names],
        env=env,
    )
    still = [alts for alts in missing if not any(dpkg_installed(a) for a in alts)]
    if r.returncode != 0 or still:
        sys.exit(f"error: could not install Debian packages: {desc}")


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
                return
            last = f"HTTP {status}"
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s ({last})")


# --------------------------------------------------------------------------
# Pinned child processes
# --------------------------------------------------------------------------

_LIVE: list["ServerProcess"] = []


def _stop_all() -> None:
    for p in list(_LIVE):
        p.stop()


def _on_sigterm(signum, frame):  # turn SIGTERM/SIGHUP into a clean unwind
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
                     python: str | None = None) -> ServerProcess:
    """`python -m openinfer serve` on 127.0.0.1:port (bundled example repo)."""
    py = python or sys.executable
    argv = [py, "-m", "openinfer", "serve", "--host", "127.0.0.1",
            "--http-port", str(port), "--threads", str(threads),
            "--log-level", "warning", *extra]
    return ServerProcess("openinfer", argv, cpus, log_path, cwd=REPO_ROOT)


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
                     headers: dict[str, str]) -> Path:
    """Generate a wrk Lua script sending one fixed request (for scenarios
    whose body is built at run time); it loads wrk/report.lua."""
    lines = ["-- generated by benchmarks/common.py; do not edit by hand",
             f'wrk.method = "{method}"']
    for k, v in headers.items():
        lines.append(f"wrk.headers[{lua_quote(k)}] = {lua_quote(v)}")
    if body is not None:
        lines.append(f"wrk.body = {lua_quote(body)}")
    lines.append(f"dofile({lua_quote(str(WRK_REPORT_LUA))})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
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
               logx: bool = True) -> str | None:
    """series: label -> (x, median, lo, hi). Returns None on success, or a
    note explaining why no PNG was written."""
    if not have_matplotlib():
        return ("matplotlib is not importable in this Python, so no PNG was "
                "written (install it into the venv to get the plot).")
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
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
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


def git_describe() -> str:
    """Short commit of the repository, with '+dirty' for local changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short",
                               "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True,
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
