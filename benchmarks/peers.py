"""The peers: other inference servers serving openinfer's example model semantics, each
installed by this module into its own virtual environment under benchmarks/.venvs/<peer>
(git-ignored; pip from PyPI), started pinned on 127.0.0.1 and stopped with the run.

    triton    Triton Inference Server: the `tritonserver` binary that the nvidia-pytriton wheel
              ships, serving Python functions through PyTriton (HTTP + gRPC); with torch in the
              same venv for S6 (peers/pytriton_serve.py)
    mlserver  MLServer with custom runtimes (HTTP JSON + gRPC; peers/mlserver_models.py)
    kserve    KServe's Python model server with custom Models (HTTP JSON/binary + gRPC;
              peers/kserve_serve.py)
    tools     not a server: matplotlib (the plots), orjson and numpy (S5's Python codecs)

`python benchmarks/peers.py [setup|status] [peer ...]` installs / reports them. A peer that
cannot be installed or started is reported with the exact error (PeerUnavailable), never
replaced by a number from elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

VENVS = C.BENCH_DIR / ".venvs"
PEER_DIR = C.BENCH_DIR / "peers"
TORCH = "torch==2.13.0"  # the same pin as requirements-test.txt (a local CPU wheel here)

# Pinned so that a rerun measures the same peer; bump deliberately.
REQUIREMENTS = {
    "triton": ["nvidia-pytriton==0.7.0"],
    "triton-torch": [TORCH],  # added to the triton venv only for S6
    "mlserver": ["mlserver==1.7.1"],
    "kserve": ["kserve==0.21.0"],
    "tools": ["matplotlib", "orjson", "numpy"],
}
LABELS = {"triton": "Triton (PyTriton)", "mlserver": "MLServer", "kserve": "KServe"}


class PeerUnavailable(RuntimeError):
    """A peer that could not be installed or started; str() is the exact reason."""


def _base_python() -> str:
    """The interpreter to build peer venvs from: the one under the project's .venv."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if os.path.exists(base) else shutil.which("python3") or sys.executable


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venv(name: str, packages: list[str], log: Path | None = None,
                timeout: float = 1800) -> Path:
    """Create benchmarks/.venvs/<name> and pip-install `packages` (from PyPI) unless a stamp
    says they already are. Returns the venv's python; raises PeerUnavailable with pip's
    own last lines on failure."""
    d = VENVS / name
    stamp = d / ".installed"
    want = hashlib.sha256("\n".join(packages).encode()).hexdigest()
    have = stamp.read_text().split() if stamp.exists() else []
    if want in have:
        return venv_python(name)
    log = log or (VENVS / f"{name}.pip.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[peers] installing {' '.join(packages)} into {C.rel(d)} (log {C.rel(log)})",
          flush=True)
    if not venv_python(name).exists():
        r = subprocess.run([_base_python(), "-m", "venv", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise PeerUnavailable(f"python -m venv {d} failed: {r.stderr.strip()[-500:]}")
    with open(log, "a") as f:
        try:
            r = subprocess.run([str(venv_python(name)), "-m", "pip", "install",
                                "--disable-pip-version-check", *packages],
                               stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines()
                if ln.strip() and not ln.startswith("WARNING: Location")][-6:]
        raise PeerUnavailable(f"pip install {' '.join(packages)} failed (rc={rc}): "
                              + " | ".join(tail))
    stamp.write_text(" ".join(have + [want]))
    return venv_python(name)


def tools_python() -> Path:
    """The benchmark tools venv (matplotlib, orjson, numpy) — never the product's .venv."""
    return ensure_venv("tools", REQUIREMENTS["tools"])


# --------------------------------------------------------------------------
# perf_analyzer: can it run here?
# --------------------------------------------------------------------------


def perf_analyzer_status() -> tuple[str | None, str]:
    """(path to a working perf_analyzer or None, what happened). Installs PyPI
    `perf-analyzer` into .venvs/perf; when pip only finds a placeholder without the binary,
    fetches the newest real wheel for another platform tag with pip download and runs its
    binary to record the loader's own error."""
    note_file = VENVS / "perf" / "STATUS"
    if note_file.exists():
        path, _, note = note_file.read_text().partition("\n")
        if path == "-" or Path(path).exists():
            return (None if path == "-" else path), note
    try:
        py = ensure_venv("perf", ["perf-analyzer"])
    except PeerUnavailable as e:
        return None, str(e)
    binary = VENVS / "perf" / "bin" / "perf_analyzer"
    ver = subprocess.run([str(py), "-m", "pip", "show", "perf-analyzer"], capture_output=True,
                         text=True).stdout
    version = next((ln.split(":", 1)[1].strip() for ln in ver.splitlines()
                    if ln.startswith("Version:")), "?")
    note = ""
    path = None
    if binary.exists():
        r = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        if r.returncode == 0:
            path, note = str(binary), f"perf-analyzer {version}: {r.stdout.strip()[:100]}"
        else:
            note = f"perf_analyzer from perf-analyzer {version} fails: {r.stderr.strip()[:400]}"
    else:
        note = (f"`pip install perf-analyzer` resolves to perf-analyzer {version} on this "
                "machine, a placeholder wheel with no perf_analyzer binary.")
        dl = VENVS / "perf" / "download"
        shutil.rmtree(dl, ignore_errors=True)
        r = subprocess.run([str(py), "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--platform", "manylinux_2_38_x86_64", "--python-version", "3.11",
                            "-d", str(dl), "perf-analyzer"], capture_output=True, text=True,
                           timeout=600)
        wheels = list(dl.glob("perf_analyzer-*.whl"))
        if r.returncode == 0 and wheels:
            import zipfile
            with zipfile.ZipFile(wheels[0]) as z:
                z.extractall(dl / "x")
            exe = next(iter((dl / "x").rglob("bin/perf_analyzer")), None)
            if exe is not None:
                exe.chmod(0o755)
                rr = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
                msg = (rr.stderr or rr.stdout).replace(str(exe), "perf_analyzer").strip().splitlines()
                note += (f" The real wheel, {wheels[0].name}, needs a newer C library than "
                         f"this Debian's ({os.confstr('CS_GNU_LIBC_VERSION')}); its "
                         f"binary, run here, says: `{' / '.join(m.split(': ', 1)[-1] for m in msg[:3])}`"
                         if rr.returncode != 0 else "")
                if rr.returncode == 0:
                    path = str(exe)
        else:
            note += f" pip download of the real wheel failed: {r.stderr.strip()[-300:]}"
    note_file.parent.mkdir(parents=True, exist_ok=True)
    note_file.write_text(f"{path or '-'}\n{note}")
    return path, note


# --------------------------------------------------------------------------
# Starting peers
# --------------------------------------------------------------------------


@dataclass
class Peer:
    name: str
    label: str
    proc: C.ServerProcess
    http_port: int
    grpc_port: int
    http_url: str
    version: str = ""
    command: str = ""
    started_s: float = float("nan")  # spawn -> all models ready
    notes: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop(timeout=30)


def _pkg_version(py: Path, dist: str) -> str:
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m;print(m.version({dist!r}))"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


def peer_argv(name: str, http_port: int, grpc_port: int, workdir: Path,
              torch_repo: Path | None = None) -> tuple[list[str], dict[str, str], Path, Path]:
    """(argv, env, cwd, python) to start peer `name` (installing it first)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if name == "triton":
        py = ensure_venv("triton", REQUIREMENTS["triton"])
        if torch_repo is not None:
            ensure_venv("triton", REQUIREMENTS["triton"] + REQUIREMENTS["triton-torch"])
        # The wheel's Python backend stub links libpython3.11.so.1.0 and the loader finds
        # Debian's (3.11.2) first, which then runs this interpreter's 3.11.7 standard library
        # and fails (`'_thread.RLock' object has no attribute '_recursion_count'`): point the
        # loader at the libpython of the interpreter that runs PyTriton.
        libdir = subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True).stdout.strip()
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"]
                                           if env.get("LD_LIBRARY_PATH") else "")
        # PyTriton's workspace holds AF_UNIX sockets: keep its path short (108-byte limit).
        env["PYTRITON_HOME"] = str(C.make_tmpdir("pyt-"))
        argv = [str(py), str(PEER_DIR / "pytriton_serve.py"), "--http-port", str(http_port),
                "--grpc-port", str(grpc_port), "--metrics-port", str(C.free_port())]
        if torch_repo is not None:
            argv += ["--torch", str(torch_repo)]
        return argv, env, C.REPO_ROOT, py
    if name == "mlserver":
        py = ensure_venv("mlserver", REQUIREMENTS["mlserver"])
        repo = workdir / "mlserver-repo"
        shutil.rmtree(repo, ignore_errors=True)
        (repo / "simple").mkdir(parents=True)
        (repo / "identity_fp32").mkdir()
        (repo / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
            "metrics_port": C.free_port(), "metrics_endpoint": None, "parallel_workers": 0,
            "debug": False, "grpc_max_message_length": 1 << 30,
            "model_repository_root": str(repo)}))
        (repo / "simple" / "model-settings.json").write_text(json.dumps(
            {"name": "simple", "implementation": "mlserver_models.Simple"}))
        (repo / "identity_fp32" / "model-settings.json").write_text(json.dumps(
            {"name": "identity_fp32", "implementation": "mlserver_models.Identity"}))
        env["PYTHONPATH"] = str(PEER_DIR)
        return [str(py.parent / "mlserver"), "start", str(repo)], env, repo, py
    if name == "kserve":
        py = ensure_venv("kserve", REQUIREMENTS["kserve"])
        return ([str(py), str(PEER_DIR / "kserve_serve.py"), "--http-port", str(http_port),
                 "--grpc-port", str(grpc_port),
                 # KServe's own flags (read from sys.argv when kserve is imported): its
                 # default 8 MiB gRPC message limit refuses S4's 16 MiB tensors.
                 "--grpc_max_send_message_length", str(1 << 30),
                 "--grpc_max_receive_message_length", str(1 << 30)], env, C.REPO_ROOT, py)
    raise ValueError(f"unknown peer {name!r}")


def start_peer(name: str, cpus: str | None, log_dir: Path, timeout: float = 240,
               torch_repo: Path | None = None, models=("simple", "identity_fp32")) -> Peer:
    """Install (first time), start pinned, wait until every model is ready. Raises
    PeerUnavailable with the exact error (pip's, or the server log's last lines)."""
    http_port, grpc_port = C.free_port(), C.free_port()
    workdir = log_dir / f"{name}-work"
    workdir.mkdir(parents=True, exist_ok=True)
    argv, env, cwd, py = peer_argv(name, http_port, grpc_port, workdir, torch_repo)
    proc = C.ServerProcess(name, argv, cpus, log_dir / f"{name}.log", cwd=cwd, env=env,
                           stop_signal=2)
    url = f"http://127.0.0.1:{http_port}"
    t0 = time.monotonic()
    proc.start()
    try:
        C.wait_http_ready(url + "/v2/health/ready", timeout=timeout, proc=proc)
        for m in models:
            C.wait_http_ready(f"{url}/v2/models/{m}/ready", timeout=timeout, proc=proc)
    except RuntimeError as e:
        tail = proc.log_tail(15)
        proc.stop(timeout=30)
        raise PeerUnavailable(f"{name} did not become ready: {str(e).splitlines()[0]}; "
                              f"log tail:\n{tail}") from None
    dist = {"triton": "nvidia-pytriton", "mlserver": "mlserver", "kserve": "kserve"}[name]
    peer = Peer(name, LABELS[name], proc, http_port, grpc_port, url,
                version=f"{dist} {_pkg_version(py, dist)}", started_s=time.monotonic() - t0)
    peer.command = " ".join(os.path.relpath(a, C.REPO_ROOT) if a.startswith(str(C.REPO_ROOT))
                            else a for a in argv)
    return peer


def start_peers(names, cpus: str | None, log_dir: Path, problems: list[str],
                **kw) -> dict[str, Peer]:
    """Start each peer in turn; one that cannot run is left out with its error appended to
    `problems` (the results say exactly why)."""
    out: dict[str, Peer] = {}
    for n in names:
        try:
            p = start_peer(n, cpus, log_dir, **kw)
            out[n] = p
            print(f"[peers] {p.label} ({p.version}) pid {p.proc.pid}: HTTP :{p.http_port}, "
                  f"gRPC :{p.grpc_port}, ready in {p.started_s:.1f}s", flush=True)
        except PeerUnavailable as e:
            msg = f"{LABELS.get(n, n)} cannot run here: {e}"
            problems.append(msg)
            print(f"[peers] {msg}", flush=True)
    return out


def libdir() -> str:
    return sysconfig.get_config_var("LIBDIR") or ""


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "status"
    names = argv[1:] or ["triton", "mlserver", "kserve", "tools"]
    if what == "setup":
        for n in names:
            try:
                ensure_venv(n, REQUIREMENTS[n])
            except PeerUnavailable as e:
                print(f"{n}: {e}")
        path, note = perf_analyzer_status()
        print(f"perf_analyzer: {path or 'not usable'} — {note}")
        return 0
    for n in names:
        print(f"{n}: {'installed' if (VENVS / n / '.installed').exists() else 'not installed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
