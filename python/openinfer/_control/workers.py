"""`openinfer serve --workers N`: N server processes on the same ports, for hosts where one
process's C core (its event loops, or the GIL of its Python models) is the bottleneck.

The parent binds the ports: for each of HTTP and gRPC one listening socket per worker, all in
one SO_REUSEPORT group, and hands each worker its own, which it serves through
`serve(sockets=...)`. The kernel spreads new connections over the group by their addresses (a
shared accept queue would not: libuv accepts every pending connection at once, so the worker
that woke first took whole bursts). The parent keeps every socket open, so while a worker
restarts the connections sent its way wait in its queue instead of being refused. Any process
of the same user could join the group by binding the port with SO_REUSEPORT too: give the
server a user of its own where that matters. Each worker loads the repository itself and has its own registry, statistics and settings.
The parent only supervises: it restarts a worker that dies, forwards SIGTERM and SIGINT (so
a drain happens in every worker at once) and serves ``/metrics``, the workers' own metrics
merged, every sample labelled ``worker="i"``. Worker logs go to the parent's stdout/stderr,
each line naming its worker.
"""

from __future__ import annotations

import http.server
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence

from .._spawn import environment, python_module

logger = logging.getLogger("openinfer")

# Sample names that belong to the family named before them (histograms, summaries, counters).
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")

# A worker that keeps dying is restarted after a growing pause, up to this many seconds.
_MAX_BACKOFF = 5.0


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on host:port (0: a free port), as the core would bind it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024, reuse_port=reuse_port)


def listen_group(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` listening sockets on host:port (0: a free port) in one SO_REUSEPORT group."""
    group = [listen(host, port, reuse_port=True)]
    try:
        group += [listen(host, group[0].getsockname()[1], reuse_port=True) for _ in range(n - 1)]
    except OSError:
        for s in group:
            s.close()
        raise
    return group


def merge_metrics(texts: Sequence[tuple[int, str]]) -> str:
    """Prometheus text expositions of several workers as one: each family's HELP and TYPE once,
    then the samples of every worker, each with a ``worker`` label first."""
    families: dict[str, list[str]] = {}  # name -> [help, type, samples...]
    for worker, text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                head = families.setdefault(family, ["", ""])
                head[0 if line.startswith("# HELP ") else 1] = line
            elif line and not line.startswith("#"):
                name, brace, rest = line.partition("{")
                if not brace:  # "name value": as "name{} value"
                    name, _, value = line.partition(" ")
                    rest = "} " + value
                sep = "" if rest.startswith("}") else ","
                owner = family if name == family or name.removeprefix(family) in _SUFFIXES else name
                families.setdefault(owner, ["", ""]).append(f'{name}{{worker="{worker}"{sep}{rest}')
    out = []
    for lines in families.values():
        out += [line for line in lines if line]
    return "\n".join(out) + "\n"


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    server: _MetricsServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        # As tritonserver's metrics listener (and each worker's): another path answers 200 empty.
        if self.path.split("?", 1)[0] not in ("/metrics", "/metrics/"):
            self._send(200, "text/plain; charset=utf-8", b"")
            return
        body = merge_metrics(self.server.supervisor.scrape()).encode()
        self._send(200, "text/plain; version=0.0.4; charset=utf-8", body)

    def _refuse(self) -> None:
        self._send(405, "application/json", b'{"error":"Method Not Allowed"}', allow=True)

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _send(self, status: int, content_type: str, body: bytes, allow: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if allow:
            self.send_header("Allow", "GET")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not worth a line
        pass


class _MetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, supervisor: Supervisor) -> None:
        super().__init__(sock.getsockname()[:2], _MetricsHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.supervisor = supervisor


class Supervisor:
    """Runs `n` workers of `openinfer serve` (`argv`: this command's own arguments, after
    ``serve``) on the sockets given, until stopped by a signal; `run` returns the exit status."""

    def __init__(self, argv: Sequence[str], n: int, sockets: dict[str, list[socket.socket]],
                 metrics: socket.socket | None) -> None:
        self.argv = list(argv)
        self.sockets = sockets
        self.metrics = metrics
        # Each worker's own /metrics listener, on loopback: the parent scrapes it.
        self.worker_metrics = [listen("127.0.0.1", 0) for _ in range(n)] if metrics else []
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.started = [0.0] * n
        self.backoff = [0.1] * n
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def spawn(self, i: int) -> None:
        socks = {name: group[i] for name, group in self.sockets.items()}
        if self.metrics:
            socks["metrics"] = self.worker_metrics[i]
        inherit = ",".join(f"{name}={s.fileno()}" for name, s in socks.items())
        argv = python_module("openinfer", "serve", *self.argv,
                             "--workers", "1", "--worker-index", str(i), "--inherit-sockets", inherit)
        # Its own session (so its own process group, and no controlling terminal): a terminal's
        # Ctrl-C, hang-up or job control reaches the parent only, which forwards the signals.
        # (Popen's process_group, which would keep the terminal, needs Python 3.11.)
        self.procs[i] = subprocess.Popen(argv, pass_fds=[s.fileno() for s in socks.values()], start_new_session=True,
                                         env=environment())
        self.started[i] = time.monotonic()
        logger.info("worker %d started (pid %d)", i, self.procs[i].pid)

    def scrape(self) -> list[tuple[int, str]]:
        texts = []
        for i, s in enumerate(self.worker_metrics):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{s.getsockname()[1]}/metrics", timeout=5) as r:
                    texts.append((i, r.read().decode()))
            except OSError:  # restarting: its samples are missing from this scrape
                pass
        return texts

    def signal(self, signum: int) -> None:
        """A stop signal for every worker (a second one cuts their drain short)."""
        self.stopping.set()
        with self.lock:
            for p in self.procs:
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)

    def forward(self, signum: int) -> None:
        """Passes a signal that is not a stop (SIGHUP: reload the TLS certificates) to every
        live worker."""
        with self.lock:
            for p in self.procs:
                if p is not None and p.poll() is None:
                    p.send_signal(signum)

    def run(self) -> int:
        metrics_server = None
        if self.metrics:
            metrics_server = _MetricsServer(self.metrics, self)
            threading.Thread(target=metrics_server.serve_forever, name="openinfer-metrics", daemon=True).start()
        with self.lock:
            for i in range(len(self.procs)):
                self.spawn(i)
        status = 0
        while True:
            time.sleep(0.05)
            with self.lock:
                for i, p in enumerate(self.procs):
                    if p is None or p.poll() is None:
                        continue
                    if self.stopping.is_set():
                        status = status or (p.returncode != 0)
                        self.procs[i] = None
                        continue
                    lived = time.monotonic() - self.started[i]
                    self.backoff[i] = 0.1 if lived > 10 else min(self.backoff[i] * 2, _MAX_BACKOFF)
                    logger.warning("worker %d (pid %d) exited with %s; restarting in %.1fs", i, p.pid,
                                   f"signal {-p.returncode}" if p.returncode < 0 else f"status {p.returncode}",
                                   self.backoff[i])
                    self.procs[i] = None
                    threading.Timer(self.backoff[i], self._respawn, args=(i,)).start()
                if self.stopping.is_set() and all(p is None for p in self.procs):
                    break
        if metrics_server:
            metrics_server.shutdown()
        for s in [*(s for group in self.sockets.values() for s in group), *self.worker_metrics,
                  *([self.metrics] if self.metrics else [])]:
            s.close()
        return int(status)

    def _respawn(self, i: int) -> None:
        with self.lock:
            if not self.stopping.is_set() and self.procs[i] is None:
                self.spawn(i)


def watch_parent() -> None:
    """In a worker: stops it (SIGTERM to itself) when the supervisor is gone, so that a killed
    parent leaves no workers serving its ports."""
    parent = os.getppid()

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=poll, name="openinfer-parent-watch", daemon=True).start()
