"""Model namespacing (tritonserver's --model-namespacing, issue 41 point 8), as Triton's
qa/L0_model_namespacing checks it: two repositories holding models of the same names, each
repository a namespace; ensembles composing their own namespace's models; a request by a name
both hold refused with Triton's words; poll and explicit model control. Through tritonclient
HTTP and gRPC, and the metrics endpoint."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import Cli

# Triton's words (core src/model_repository_manager/model_repository_manager.cc, FindModelIdentifier).
AMBIGUOUS = ("There are 2 identifiers of model '{}' in global map, model namespace must be provided to "
             "resolve ambiguity.")

# A Triton Python model without config.pbtxt (its auto_complete_config declares the tensors), as
# L0_model_namespacing's composing models: OUTPUT0, OUTPUT1 = INPUT0 {0} INPUT1, INPUT0 {1} INPUT1.
COMPOSING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for kind, names in (("input", ("INPUT0", "INPUT1")), ("output", ("OUTPUT0", "OUTPUT1"))):
            for name in names:
                getattr(config, "add_" + kind)({{"name": name, "data_type": "TYPE_INT32", "dims": [16]}})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a {0} b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a {1} b).astype(np.int32)),
            ]))
        return responses
'''

ENSEMBLE = """platform: "ensemble"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
}} ] }}
"""

DATA = np.arange(16, dtype=np.int32)
ADDSUB, SUBADD = (DATA + DATA, DATA - DATA), (DATA - DATA, DATA + DATA)


def _composing(repo: Path, name: str, ops: tuple[str, str]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(COMPOSING.format(*ops))


def _ensemble(repo: Path, name: str, step: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(step=step))


def _repos(tmp_path: Path, layout: str) -> list[Path]:
    """addsub_repo and subadd_repo as L0_model_namespacing lays out its test `layout`."""
    repos = [tmp_path / "addsub_repo", tmp_path / "subadd_repo"]
    for repo, kind, ops in zip(repos, ("addsub", "subadd"), (("+", "-"), ("-", "+"))):
        if layout == "no_duplication":  # simple_<kind> runs composing_<kind>
            _composing(repo, f"composing_{kind}", ops)
            _ensemble(repo, f"simple_{kind}", f"composing_{kind}")
        elif layout == "duplication":  # simple_<kind> runs its own repository's composing_model
            _composing(repo, "composing_model", ops)
            _ensemble(repo, f"simple_{kind}", "composing_model")
        else:  # ensemble_duplication: each simple_ensemble runs its own composing_<kind>
            _composing(repo, f"composing_{kind}", ops)
            _ensemble(repo, "simple_ensemble", f"composing_{kind}")
    return repos


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Callable[..., openinfer.Server]]:
    servers: list[openinfer.Server] = []

    def start(layout: str, **options: object) -> openinfer.Server:
        server = openinfer.serve(_repos(tmp_path, layout), model_namespacing=True, http_port=0, grpc_port=0,
                                 metrics_port=None, log=False, **options)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _clients(server: openinfer.Server) -> list[httpclient.InferenceServerClient | grpcclient.InferenceServerClient]:
    return [httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}"),
            grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")]


def _infer(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, model: str) -> tuple:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = [module.InferInput(name, [16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(DATA)
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def _check(server: openinfer.Server, model: str, expected: tuple[np.ndarray, np.ndarray]) -> None:
    for client in _clients(server):
        np.testing.assert_array_equal(_infer(client, model), expected)


def _refused_as_ambiguous(server: openinfer.Server, model: str) -> None:
    http, grpc = _clients(server)
    with pytest.raises(InferenceServerException) as e:
        _infer(http, model)
    assert e.value.message() == AMBIGUOUS.format(model) and e.value.status() == "400"
    with pytest.raises(InferenceServerException) as e:
        _infer(grpc, model)
    assert e.value.message() == AMBIGUOUS.format(model) and e.value.status() == "StatusCode.INVALID_ARGUMENT"


def _index(server: openinfer.Server) -> list[tuple[str, str]]:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    return sorted((m["name"], m.get("state", "")) for m in http.get_model_repository_index())


def test_no_duplication_serves_every_model(serving: Callable[..., openinfer.Server]) -> None:
    """Repositories that share no name serve as without namespacing."""
    server = serving("no_duplication")
    for model in ("simple_addsub", "composing_addsub"):
        _check(server, model, ADDSUB)
    for model in ("simple_subadd", "composing_subadd"):
        _check(server, model, SUBADD)


def test_duplication_ensembles_run_their_own_namespace_and_the_shared_name_is_ambiguous(
        serving: Callable[..., openinfer.Server]) -> None:
    """Each repository's ensemble runs its own repository's composing_model; composing_model by
    name is refused, with Triton's words; the index lists it once per namespace."""
    server = serving("duplication")
    _check(server, "simple_addsub", ADDSUB)
    _check(server, "simple_subadd", SUBADD)
    _refused_as_ambiguous(server, "composing_model")
    assert _index(server) == [("composing_model", "READY"), ("composing_model", "READY"),
                              ("simple_addsub", "READY"), ("simple_subadd", "READY")]
    http, grpc = _clients(server)
    ready = requests.get(f"http://127.0.0.1:{server.http_port}/v2/models/composing_model/ready", timeout=10)
    assert ready.status_code == 400 and ready.json() == {"error": AMBIGUOUS.format("composing_model")}
    for ask in (grpc.is_model_ready, http.get_model_metadata, grpc.get_model_metadata, http.get_model_config,
                grpc.get_model_config):
        with pytest.raises(InferenceServerException, match="model namespace must be provided"):
            ask("composing_model")
    for ask in (http.get_inference_statistics, grpc.get_inference_statistics):  # Triton's words for it
        with pytest.raises(InferenceServerException, match="requested model 'composing_model' is not available"):
            ask("composing_model")
    stats = http.get_inference_statistics()["model_stats"]  # every namespace's, by name
    assert [m["name"] for m in stats].count("composing_model") == 2


def test_ensemble_duplication_each_ensemble_runs_its_own_steps(serving: Callable[..., openinfer.Server]) -> None:
    server = serving("ensemble_duplication")
    _check(server, "composing_addsub", ADDSUB)
    _check(server, "composing_subadd", SUBADD)
    _refused_as_ambiguous(server, "simple_ensemble")


def test_metrics_label_each_model_with_its_namespace(tmp_path: Path) -> None:
    """As Triton's: namespace="<repository>" on every model's series."""
    repos = _repos(tmp_path, "duplication")
    server = openinfer.serve(repos, model_namespacing=True, http_port=0, grpc_port=None, log=False)
    try:
        _infer(httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}"), "simple_addsub")
        text = requests.get(server.metrics_url, timeout=10).text
        for repo in repos:
            assert f'nv_inference_request_success{{model="composing_model",namespace="{repo}",version="1"}}' in text
        assert f'nv_inference_request_success{{model="simple_addsub",namespace="{repos[0]}",version="1"}} 1' in text
    finally:
        server.stop()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_poll_resolves_a_step_to_the_other_namespace_while_its_own_is_gone(
        tmp_path: Path, serving: Callable[..., openinfer.Server]) -> None:
    """L0_model_namespacing's test_dynamic_resolution: with addsub_repo's composing_model gone,
    both ensembles run subadd_repo's (the only one left) and the name is no longer ambiguous;
    once it is back, each runs its own again."""
    server = serving("duplication", model_control_mode="poll", repository_poll_secs=0.2)
    own, away = tmp_path / "addsub_repo" / "composing_model", tmp_path / "composing_model"
    shutil.move(own, away)
    _wait_for(lambda: _index(server).count(("composing_model", "READY")) == 1, "addsub's composing_model unloads")
    for model in ("simple_subadd", "simple_addsub", "composing_model"):
        _check(server, model, SUBADD)
    shutil.move(away, own)
    _wait_for(lambda: _index(server).count(("composing_model", "READY")) == 2, "addsub's composing_model loads")
    _check(server, "simple_addsub", ADDSUB)
    _check(server, "simple_subadd", SUBADD)
    _refused_as_ambiguous(server, "composing_model")


def test_explicit_load_and_unload_by_name_act_in_every_namespace(
        tmp_path: Path, serving: Callable[..., openinfer.Server]) -> None:
    """A load by a name two namespaces hold loads both (each ensemble then runs its own steps);
    an unload by that name unloads both."""
    server = serving("ensemble_duplication", model_control_mode="explicit")
    http, grpc = _clients(server)
    assert _index(server) == [("composing_addsub", ""), ("composing_subadd", ""),
                              ("simple_ensemble", ""), ("simple_ensemble", "")]
    http.load_model("composing_addsub")
    grpc.load_model("composing_subadd")
    http.load_model("simple_ensemble")
    assert _index(server).count(("simple_ensemble", "READY")) == 2
    _check(server, "composing_addsub", ADDSUB)
    _refused_as_ambiguous(server, "simple_ensemble")
    grpc.unload_model("simple_ensemble")
    assert _index(server).count(("simple_ensemble", "UNAVAILABLE")) == 2
    with pytest.raises(InferenceServerException) as e:
        http.load_model("not_in_either")
    repos = ", ".join(str(tmp_path / r) for r in ("addsub_repo", "subadd_repo"))
    assert e.value.message() == ("failed to load 'not_in_either', failed to poll from model repository: no model "
                                 f"directory 'not_in_either' in {repos}")


def test_explicit_load_resolves_a_step_missing_in_its_namespace_to_the_other(
        tmp_path: Path, serving: Callable[..., openinfer.Server]) -> None:
    """L0_model_namespacing's explicit test_dynamic_resolution: with addsub_repo's
    composing_model moved out, simple_addsub loads and runs subadd_repo's; once addsub's is back
    and loaded, simple_addsub runs its own again and the name is ambiguous."""
    server = serving("duplication", model_control_mode="explicit")
    http, _ = _clients(server)
    own, away = tmp_path / "addsub_repo" / "composing_model", tmp_path / "composing_model"
    shutil.move(own, away)
    for model in ("composing_model", "simple_addsub", "simple_subadd"):
        http.load_model(model)
    for model in ("simple_subadd", "simple_addsub", "composing_model"):
        _check(server, model, SUBADD)
    shutil.move(away, own)
    http.load_model("composing_model")
    _check(server, "simple_addsub", ADDSUB)
    _check(server, "simple_subadd", SUBADD)
    _refused_as_ambiguous(server, "composing_model")


# A Triton Python model of two instances (worker processes, or with KIND_MODEL threads of the
# server) whose initialize says it started (a line in the file `started`) and waits for `release`.
HELD = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open({started!r}, "a") as f:
            f.write(args["model_name"] + "\\n")
        deadline = time.monotonic() + 30  # a bound for a hung test
        while not os.path.exists({release!r}) and time.monotonic() < deadline:
            time.sleep(0.01)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
"""
HELD_CONFIG = """backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: {kind} }} ]
"""


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_MODEL"])
def test_loads_in_two_namespaces_at_once_stay_within_max_instances(tmp_path: Path, kind: str) -> None:
    """--max-instances bounds every namespace's instances together, those of loads under way
    included: while one namespace's model of 2 instances loads, the other's cannot take the
    server past 3, and none of its instances starts; once the first has loaded, its 2 count as
    loaded."""
    started, release = tmp_path / "started", tmp_path / "release"
    for repo, name in (("repo_a", "held_a"), ("repo_b", "held_b")):
        (tmp_path / repo / name / "1").mkdir(parents=True)
        (tmp_path / repo / name / "1" / "model.py").write_text(HELD.format(started=str(started), release=str(release)))
        (tmp_path / repo / name / "config.pbtxt").write_text(HELD_CONFIG.format(kind=kind))
    with openinfer.serve([tmp_path / "repo_a", tmp_path / "repo_b"], model_namespacing=True, max_instances=3,
                         model_control_mode="explicit", http_port=0, grpc_port=0, log=False) as server:
        http, grpc = _clients(server)
        loading = ThreadPoolExecutor(1).submit(grpc.load_model, "held_a")  # gRPC's client serves any thread
        deadline = time.monotonic() + 30  # a bound for a hung test
        while not started.exists() and time.monotonic() < deadline and not loading.done():
            time.sleep(0.01)
        assert started.exists(), loading.result()
        over = ("failed to load 'held_b': instance_group count 2 and the 2 instances of the models loaded or "
                "loading exceed the server's limit of 3 instances (--max-instances)")
        with pytest.raises(InferenceServerException) as e:
            http.load_model("held_b")
        assert e.value.message() == over and e.value.status() == "400"
        assert "held_b" not in started.read_text()
        release.touch()
        loading.result(timeout=30)
        with pytest.raises(InferenceServerException) as e:
            grpc.load_model("held_b")
        assert e.value.message() == over and e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert _index(server) == [("held_a", "READY"), ("held_b", "")]  # a refused load leaves no state


@pytest.mark.parametrize("namespacing", [False, True])
def test_pt2_example_built_after_start_up_is_served_as_without_namespacing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespacing: bool) -> None:
    """A PT2 example of the embedded repository whose package is not in the cache at start-up is
    loaded once it is built, under --model-namespacing as without it. The build is the package
    compiled once into the session's cache (compiled here if it is not there yet; test_pt2_examples
    checks the compile itself), copied into an empty cache once the server runs."""
    pytest.importorskip("torch")
    from openinfer import _pt2_build
    from openinfer._torch_build import child_environment

    version_dir = openinfer.examples_path() / "mlp_pt2" / "1"
    compiled = _pt2_build.package_path(version_dir)
    if _pt2_build.build(version_dir, compiled, child_environment(), threading.Event()) is None:
        pytest.skip("the PT2 example cannot be compiled here")
    build, copied = _pt2_build.build, []

    def copy_compiled(version_dir: Path, target: Path, env: dict[str, str], stop: threading.Event) -> Path | None:
        copied.append(version_dir.parent.name)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(compiled, target)
        return build(version_dir, target, env, stop)  # finds it built

    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path / "cache"))  # empty: left out at start-up
    monkeypatch.setattr(_pt2_build, "build", copy_compiled)
    with openinfer.serve(openinfer.examples_path(), model_namespacing=namespacing, model_control_mode="explicit",
                         load_models=["mlp_pt2"], http_port=0, grpc_port=0, log=False) as server:
        http, grpc = _clients(server)
        deadline = time.monotonic() + 60  # a bound for a hung test
        while not http.is_model_ready("mlp_pt2") and time.monotonic() < deadline:
            time.sleep(0.05)
        x = np.ones((2, 16), dtype=np.float32)
        for client in (http, grpc):
            module = httpclient if client is http else grpcclient
            given = module.InferInput("INPUT__0", [2, 16], "FP32")
            given.set_data_from_numpy(x)
            assert client.infer("mlp_pt2", [given]).as_numpy("OUTPUT__0").shape[0] == 2
        assert copied == ["mlp_pt2"]  # built after start-up, not found built at it


def test_heavy_examples_load_after_start_up_under_namespacing() -> None:
    """The embedded examples that import heavy modules (tiny_llama: torch, transformers) load
    after start-up on a thread of their own, under --model-namespacing as without it."""
    from openinfer.server import _heavy_examples

    heavy = _heavy_examples(openinfer.examples_path())
    if not heavy:
        pytest.skip("no example's heavy modules are installed here")
    with openinfer.serve(openinfer.examples_path(), model_namespacing=True, http_port=0, grpc_port=None,
                         log=False) as server:
        deadline = time.monotonic() + 120  # a bound for a hung test
        while (states := dict(_index(server))) and time.monotonic() < deadline:
            if all(states.get(name) == "READY" for name in heavy):
                break
            time.sleep(0.1)
        assert {name: states.get(name) for name in heavy} == dict.fromkeys(heavy, "READY")


def test_cli_model_namespacing_serves_a_name_both_repositories_hold(tmp_path: Path) -> None:
    """`openinfer serve --model-namespacing=true` with L0_model_namespacing's arguments."""
    a, b = _repos(tmp_path, "duplication")
    cli = Cli("--model-namespacing=true", f"--model-repository={a}", f"--model-repository={b}",
              "--model-control-mode=POLL", "--repository-poll-secs=2", "--grpc-port", "0", "--metrics-port", "0")
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{cli.port}")
        assert http.is_server_ready()
        np.testing.assert_array_equal(_infer(http, "simple_addsub"), ADDSUB)
        with pytest.raises(InferenceServerException, match="resolve ambiguity"):
            _infer(http, "composing_model")
    finally:
        cli.kill()


def test_load_model_at_start_names_every_repository_when_none_has_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no model directory 'absent' in .*addsub_repo, .*subadd_repo"):
        openinfer.serve(_repos(tmp_path, "duplication"), model_namespacing=True, model_control_mode="explicit",
                        load_models=["absent"], http_port=0, grpc_port=0, log=False)


def test_cli_model_namespacing_value_must_be_a_boolean() -> None:
    done = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--model-namespacing=maybe"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--model-namespacing: expected true or false, got 'maybe'" in done.stderr
