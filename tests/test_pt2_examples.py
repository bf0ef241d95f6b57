"""The PT2 examples of the bundled repository (examples/models/mlp_pt2 and cnn_pt2): their
packages are compiled on first use into the cache, in the background and at most once per
cache, and serve what the TorchScript examples they are exported from answer; where they
cannot be compiled they are left out with one log line and the rest of the repository serves."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer
from openinfer import _pt2_build

from conftest import Cli, concurrent

torch = pytest.importorskip("torch")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

EXAMPLES = openinfer.examples_path()
# How long a test waits for a compile that the session's servers started: a bound on a hang (a
# compile takes tens of seconds, minutes on a loaded machine), not a timing claim.
BUILD_BOUND = 900.0


def _can_compile() -> bool:
    from openinfer._torch_build import ShimBuildError, _compiler

    try:
        _compiler("c++")
        return True
    except ShimBuildError:
        return False


def wait_served(url: str, name: str) -> None:
    """Until the example `name` is ready; failing with why not (the cache's record or log)."""
    end = time.monotonic() + BUILD_BOUND
    while requests.get(f"{url}/v2/models/{name}/ready", timeout=30).status_code != 200:
        target = _pt2_build.package_path(EXAMPLES / name / "1")
        failed = target.with_name(target.name + ".failed")
        assert not failed.is_file(), failed.read_text()
        assert time.monotonic() < end, f"{name} not served after {BUILD_BOUND}s; the cache holds " + ", ".join(
            p.name for p in target.parent.glob("*")
        )
        time.sleep(0.5)


@pytest.fixture(scope="module")
def served(server: openinfer.Server) -> openinfer.Server:
    """The session server (it serves the examples), once both PT2 examples are ready."""
    if not _can_compile():
        pytest.skip("no C++ compiler: the PT2 examples cannot be compiled here")
    for name in ("mlp_pt2", "cnn_pt2"):
        wait_served(server.url, name)
    return server


def _clients(server: openinfer.Server) -> list[tuple[Any, Any]]:
    return [
        (httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")),
        (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")),
    ]


def _infer(mod: Any, client: Any, model: str, x: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
    given = mod.InferInput("INPUT__0", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer(model, [given], outputs=[mod.InferRequestedOutput(o) for o in outputs])
    return [result.as_numpy(o) for o in outputs]


def test_mlp_pt2_answers_as_the_torchscript_mlp(served: openinfer.Server) -> None:
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    for mod, client in _clients(served):
        (want,) = _infer(mod, client, "mlp", x, ["OUTPUT__0"])
        (got,) = _infer(mod, client, "mlp_pt2", x, ["OUTPUT__0"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        meta = client.get_model_metadata("mlp_pt2")
        platform = meta["platform"] if isinstance(meta, dict) else meta.platform
        assert platform == "torch_aoti"
        client.close()


def test_cnn_pt2_serves_its_dict_result_without_declared_tensors(served: openinfer.Server) -> None:
    """cnn_pt2's config.pbtxt names no tensors: they come from the package (the dict result as
    OUTPUT__0 and OUTPUT__1, its keys sorted), and equal the TorchScript cnn's."""
    image = np.random.default_rng(1).standard_normal((3, 1, 28, 28)).astype(np.float32)
    cnn = torch.jit.load(str(EXAMPLES / "cnn" / "1" / "model.pt"))
    with torch.inference_mode():
        want = cnn(torch.from_numpy(image))
    config = requests.get(f"{served.url}/v2/models/cnn_pt2/config", timeout=30).json()
    assert config["platform"] == "torch_aoti"
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT__0", [-1, 1, 28, 28])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT__0", [-1, 10]), ("OUTPUT__1", [-1, 10])]
    for mod, client in _clients(served):
        logits, probabilities = _infer(mod, client, "cnn_pt2", image, ["OUTPUT__0", "OUTPUT__1"])
        np.testing.assert_allclose(logits, want["logits"].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(probabilities, want["probabilities"].numpy(), rtol=1e-5, atol=1e-6)
        client.close()


def test_mlp_pt2_batches_rows_of_concurrent_requests(served: openinfer.Server) -> None:
    """mlp_pt2 batches dynamically (max_batch_size 64): each of 16 concurrent clients gets its
    own row, as the TorchScript mlp computes it."""
    rows = np.random.default_rng(2).standard_normal((16, 1, 16)).astype(np.float32)
    mlp = torch.jit.load(str(EXAMPLES / "mlp" / "1" / "model.pt"))
    with torch.inference_mode():
        want = [mlp(torch.from_numpy(r)).numpy() for r in rows]

    def one(i: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
        try:
            return _infer(httpclient, client, "mlp_pt2", rows[i], ["OUTPUT__0"])[0]
        finally:
            client.close()

    for got, w in zip(concurrent(16, one), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


# ---- compiling: once per cache, failures kept -------------------------------------------------

RECIPE = """
import os, sys, time
with open(os.environ["OI_TEST_RUNS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(1.0)
if os.environ.get("OI_TEST_FAIL"):
    raise ValueError("cannot export this model\\nsecond line")
with open(sys.argv[1], "wb") as f:
    f.write(b"a package")
"""


def _example(tmp_path: Path) -> Path:
    version_dir = tmp_path / "repo" / "fake_pt2" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "export.py").write_text(RECIPE)
    return version_dir


def test_a_package_is_compiled_once_per_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three servers' waits on one cache at once (as three processes' would: each takes the
    lock on a descriptor of its own, and the compile holds it in a process of its own) start
    one compile, announced in one line, and all get its package."""
    version_dir = _example(tmp_path)
    target = tmp_path / "cache" / "pt2" / "fake_pt2.pt2"
    runs = tmp_path / "runs"
    env = {**os.environ, "OI_TEST_RUNS": str(runs)}
    stop = threading.Event()
    with caplog.at_level("INFO", logger="openinfer"):
        got = concurrent(3, lambda _: _pt2_build.build(version_dir, target, env, stop))
        again = _pt2_build.build(version_dir, target, env, stop)
    assert got == [target] * 3 and again == target
    assert target.read_bytes() == b"a package"
    assert len(runs.read_text().split()) == 1, runs.read_text()
    said = [r.getMessage() for r in caplog.records if "compiling the PT2 package" in r.getMessage()]
    assert len(said) == 1 and "example fake_pt2" in said[0] and str(target) in said[0], said
    assert not list(target.parent.glob(".*tmp*")), "a temporary file stayed"


def test_a_failed_compile_is_kept_and_the_example_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe that fails is run once: its reason is kept beside the package's name, and the
    example is left out with it (and how to try again) until that record is removed."""
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path / "cache"))
    version_dir = _example(tmp_path)
    target = _pt2_build.package_path(version_dir)
    assert target.parent == tmp_path / "cache" / "pt2" and torch.__version__.split("+")[0] in target.name
    assert _pt2_build.pending(version_dir)
    runs = tmp_path / "runs"
    env = {**os.environ, "OI_TEST_RUNS": str(runs), "OI_TEST_FAIL": "1"}
    stop = threading.Event()
    with caplog.at_level("INFO", logger="openinfer"):
        assert _pt2_build.build(version_dir, target, env, stop) is None
        assert _pt2_build.build(version_dir, target, env, stop) is None
        with pytest.raises(_pt2_build.Skipped, match="ValueError: cannot export this model") as e:
            _pt2_build.package(version_dir)
    assert len(runs.read_text().split()) == 1, "the failed recipe ran again"
    assert "second line" not in str(e.value) and "to try again" in str(e.value)
    assert not target.exists() and not _pt2_build.pending(version_dir)
    said = [r.getMessage() for r in caplog.records if "fake_pt2 is not served" in r.getMessage()]
    assert len(said) == 3 and all("ValueError: cannot export this model" in s for s in said), said
    assert "Traceback" in target.with_name(target.name + ".log").read_text()


def test_a_changed_recipe_is_another_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path / "cache"))
    version_dir = _example(tmp_path)
    before = _pt2_build.package_path(version_dir)
    (version_dir / "export.py").write_text(RECIPE + "\n# changed\n")
    assert _pt2_build.package_path(version_dir) != before


def test_examples_left_out_with_one_line_each_where_they_cannot_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`openinfer serve` of the examples with no C++ compiler, and a kept failure for cnn_pt2:
    each PT2 example is left out with one line saying why, nothing is compiled, and the rest
    serves (the server is ready; the TorchScript mlp answers)."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(OPENINFER_CACHE_DIR=str(cache), CXX=str(tmp_path / "no-such-compiler"))
    with monkeypatch.context() as m:
        m.setenv("OPENINFER_CACHE_DIR", str(cache))
        cnn_target = _pt2_build.package_path(EXAMPLES / "cnn_pt2" / "1")
    cnn_target.parent.mkdir(parents=True)
    cnn_target.with_name(cnn_target.name + ".failed").write_text("RuntimeError: no export\n")
    cli = Cli(env=env)
    try:
        url = f"http://127.0.0.1:{cli.port}"
        assert requests.get(url + "/v2/health/ready", timeout=30).status_code == 200
        r = requests.post(url + "/v2/models/mlp/infer", timeout=30, json={
            "inputs": [{"name": "INPUT__0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]})
        assert r.status_code == 200, r.text
        index = {m["name"]: m for m in requests.post(url + "/v2/repository/index", timeout=30).json()}
        assert index["mlp_pt2"] == {"name": "mlp_pt2"} and index["cnn_pt2"] == {"name": "cnn_pt2"}
        assert requests.get(url + "/v2/models/mlp_pt2/ready", timeout=30).status_code != 200
        cli.proc.send_signal(signal.SIGINT)
        rc, out = cli.wait()
    finally:
        cli.kill()
    assert rc == 0, out
    lines = [line for line in out.splitlines() if "_pt2" in line]
    mlp = [line for line in lines if "mlp_pt2" in line]
    cnn = [line for line in lines if "cnn_pt2" in line]
    assert len(mlp) == 1 and "example mlp_pt2 is not served: no c++ compiler found" in mlp[0], lines
    assert "serving a PT2 example" in mlp[0]
    assert len(cnn) == 1 and "compiling its package failed: RuntimeError: no export" in cnn[0], lines
    assert "compiling the PT2" not in out
    assert not list(cache.glob("pt2/*.pt2")) and not list(cache.glob("pt2/*.lock"))


def test_a_moment_without_descriptors_delays_the_build_and_does_not_end_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The build thread looks again when starting the compile fails for a moment (a test in the
    same process lowered RLIMIT_NOFILE: EMFILE at the lock file), logging it once."""
    target = tmp_path / "cache" / "m.pt2"
    calls = []

    def start(version_dir: Path, tgt: Path, env: dict[str, str]) -> None:
        calls.append(tgt)
        if len(calls) < 3:
            raise OSError(24, "Too many open files")
        tgt.parent.mkdir(parents=True, exist_ok=True)
        tgt.write_bytes(b"built by another process")  # as if another server's compile finished
        return None

    monkeypatch.setattr(_pt2_build, "_start", start)
    with caplog.at_level("WARNING", logger="openinfer"):
        assert _pt2_build.build(tmp_path / "m" / "1", target, {}, threading.Event()) == target
    assert len(calls) == 3
    assert [r.getMessage() for r in caplog.records if "cannot start compiling" in r.getMessage()] == [
        "example m: cannot start compiling its package yet: [Errno 24] Too many open files"]
