"""Thread counts follow the CPUs the process may use: its affinity mask and the cgroup CPU
quota (csrc/core/cpus.c), not the CPUs online."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Cli

ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("cc")
TASKSET = shutil.which("taskset")


@pytest.fixture(scope="module")
def cpus_bin(tmp_path_factory) -> Path:
    if CC is None:
        pytest.skip("no C compiler (cc) on PATH")
    out = tmp_path_factory.mktemp("cpus") / "test_cpus"
    cmd = [CC, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
           "-Icsrc", "tests/c/test_cpus.c", "csrc/core/cpus.c", "-o", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS")}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return out


def _run(binary: Path, *args: str, prefix: tuple[str, ...] = ()) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    r = subprocess.run([*prefix, str(binary), *args], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _limit(binary: Path, tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> int:
    root = tmp_path / "cg"
    root.mkdir()
    _tree(root, files)
    (tmp_path / "cgroup").write_text(proc_cgroup)
    return _run(binary, str(tmp_path / "cgroup"), str(root))


@pytest.mark.parametrize("proc_cgroup, files, want", [
    # cgroup v2: quota / period, rounded up; "max" means none.
    ("0::/\n", {"cpu.max": "150000 100000\n"}, 2),
    ("0::/\n", {"cpu.max": "100000 100000\n"}, 1),
    ("0::/\n", {"cpu.max": "max 100000\n"}, 0),
    ("0::/\n", {"cpu.max": "50000 100000\n"}, 1),
    # The process's own cgroup and its parents: the smallest quota binds.
    ("0::/a/b\n", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "300000 100000\n",
                   "cpu.max": "800000 100000\n"}, 3),
    ("0::/a/b\n", {"a/b/cpu.max": "200000 100000\n", "a/cpu.max": "max 100000\n"}, 2),
    # A path that does not exist under the mount (a container's namespace): its root counts.
    ("0::/docker/abc\n", {"cpu.max": "400000 100000\n"}, 4),
    # cgroup v1: cfs quota and period under the cpu controller's mount; -1 means none.
    ("4:memory:/x\n3:cpu,cpuacct:/x\n0::/\n",
     {"cpu,cpuacct/x/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/x/cpu.cfs_period_us": "100000\n"}, 3),
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0),
    ("2:cpuacct:/\n1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    # Only the cpu controller counts, and unreadable or malformed files mean no limit.
    ("2:cpuacct:/\n", {"cpuacct/cpu.cfs_quota_us": "100000\n", "cpuacct/cpu.cfs_period_us": "100000\n"}, 0),
    ("0::/\n", {"cpu.max": "garbage\n"}, 0),
    ("0::/\n", {"cpu.max": "0 100000\n"}, 0),
    ("0::/\n", {}, 0),
    ("", {"cpu.max": "100000 100000\n"}, 0),
])
def test_cgroup_quota_parsing(cpus_bin: Path, tmp_path: Path, proc_cgroup, files, want) -> None:
    assert _limit(cpus_bin, tmp_path, proc_cgroup, files) == want


def test_missing_proc_file_means_no_limit(cpus_bin: Path, tmp_path: Path) -> None:
    assert _run(cpus_bin, str(tmp_path / "absent"), str(tmp_path)) == 0


@pytest.mark.skipif(TASKSET is None, reason="no taskset")
def test_affinity_mask_is_counted(cpus_bin: Path) -> None:
    assert _run(cpus_bin, prefix=(TASKSET, "-c", "0")) == 1
    assert 1 <= _run(cpus_bin) <= (os.cpu_count() or 1)
    if len(os.sched_getaffinity(0)) >= 2:
        assert _run(cpus_bin, prefix=(TASKSET, "-c", "0,1")) == 2


def _thread_names_by_id(pid: int) -> dict[str, str]:
    names = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[task.name] = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            pass
    return names


def _thread_names(pid: int) -> list[str]:
    return list(_thread_names_by_id(pid).values())


@pytest.mark.skipif(TASKSET is None or not Path("/proc/self/task").exists(), reason="needs taskset and /proc")
def test_server_pinned_to_one_cpu_starts_one_loop(tmp_path: Path) -> None:
    proc = subprocess.Popen([TASKSET, "-c", "0", sys.executable, "-m", "openinfer", "serve", str(tmp_path),
                             "--http-port", "0"],  # gRPC and metrics on free ports
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
        assert "listening on" in "".join(lines), "".join(lines)
        deadline = time.monotonic() + 10
        names = _thread_names(proc.pid)
        while "oi-metrics" not in names and time.monotonic() < deadline:  # started after the API
            time.sleep(0.05)
            names = _thread_names(proc.pid)
        assert names.count("oi-loop") == 1, names
        assert names.count("oi-metrics") == 1, names
    finally:
        proc.kill()
        proc.wait(timeout=30)


THREAD_NAMES = """
import gzip, json, os, urllib.request, openinfer
body = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()
srv = openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=None, metrics_port=None,
                      threads=2, log=False)
for encoding in ("identity", "gzip"):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}/v2/models/simple/infer",
                                 data=body, headers={"Accept-Encoding": encoding})
    with urllib.request.urlopen(req, timeout=30) as r:
        gzipped = r.headers.get("Content-Encoding") == "gzip"
        out = json.loads(gzip.decompress(r.read()) if gzipped else r.read())
    assert gzipped == (encoding == "gzip") and out["outputs"][0]["data"] == [x + 1 for x in range(16)], out
names = []
for tid in os.listdir("/proc/self/task"):
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    except OSError:  # ended meanwhile
        pass
print(json.dumps(names))
srv.stop()
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_threads_a_loop_starts_are_not_named_as_loops() -> None:
    """A thread takes its creator's name unless given one: those that a loop starts on first
    need (libuv's pool, which compresses responses; the thread that releases Python objects)
    are named for what they do, and only the loops are `oi-loop`. In a process of its own:
    libuv's pool starts once a process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    r = subprocess.run([sys.executable, "-c", THREAD_NAMES], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    names = json.loads(r.stdout.strip().splitlines()[-1])
    assert names.count("oi-loop") == 2, names
    assert "oi-work" in names, names


# The policy and name of the thread that runs a Python model (its executor).
POLICY_MODEL = '''
import os
import threading

import numpy as np


def infer(inputs):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        name = f.read().strip()
    return {"POLICY": np.array([os.sched_getscheduler(0)], dtype=np.int32),
            "NAME": np.array([name.encode()], dtype=np.object_)}
'''
POLICY_CONFIG = '''
name: "policy"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "POLICY" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux's SCHED_BATCH")
@pytest.mark.parametrize("env", [None, "normal"])
def test_executors_are_named_and_batch_scheduled(tmp_path: Path, env: str | None) -> None:
    """Executors are `oi-exec` threads under SCHED_BATCH (a loop that wakes one on a shared CPU
    goes on reading instead of switching), unless OPENINFER_EXECUTOR_SCHED=normal."""
    import numpy as np

    import openinfer

    (tmp_path / "policy" / "1").mkdir(parents=True)
    (tmp_path / "policy" / "config.pbtxt").write_text(POLICY_CONFIG)
    (tmp_path / "policy" / "1" / "model.py").write_text(POLICY_MODEL)
    environ = {k: v for k, v in os.environ.items() if k != "OPENINFER_EXECUTOR_SCHED"}
    if env is not None:
        environ["OPENINFER_EXECUTOR_SCHED"] = env
    cli = Cli(str(tmp_path), env=environ)
    try:
        with openinfer.Client(f"http://127.0.0.1:{cli.port}", timeout=30) as c:
            out = c.infer("policy", {"X": np.zeros(1, np.int32)})
        assert out["NAME"][0] == b"oi-exec"
        assert out["POLICY"][0] == (os.SCHED_OTHER if env == "normal" else os.SCHED_BATCH)
    finally:
        cli.kill()
