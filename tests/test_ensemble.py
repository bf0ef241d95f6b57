"""Ensembles (platform "ensemble", ensemble_scheduling): through tritonclient HTTP (JSON and
binary) and gRPC, the answer is the composition of the steps, each step is a request counted in
its model's statistics, independent steps run at the same time, broken configurations leave the
ensemble UNAVAILABLE with a reason naming the field, and a failing step fails the request with
an error naming the step while the server stays up."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor
from conftest import triton_grpc, triton_http

BOUND = 30.0  # a bound for a hung test, not a measurement
VEC = [4]


def _f32(name: str) -> Tensor:
    return Tensor(name, "FP32", VEC)


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def _ensemble(repo: Path, name: str, steps: list[str], inputs: list[str] = ["IN"],
              outputs: list[str] = ["OUT"], extra: str = "") -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    io = " ".join(
        [f'input {{ name: "{t}" data_type: TYPE_FP32 dims: [ 4 ] }}' for t in inputs]
        + [f'output {{ name: "{t}" data_type: TYPE_FP32 dims: [ 4 ] }}' for t in outputs]
    )
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{io}\n{extra}\n'
        f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n'
    )


class Branches:
    """The two models of parallel branches meet at a barrier: a request gets through only when
    both branch steps run at the same time (a sequential run breaks the barrier after BOUND)."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=BOUND)
        self.parallel = threading.Event()  # set by the test that wants the branches to meet

    def wait(self) -> None:
        if self.parallel.is_set():
            self.barrier.wait()


class Held:
    """A step model that records its calls and runs until its request is cancelled (or BOUND)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.calls = 0
        self.saw_cancel = 0

    def fn(self, inputs: dict[str, np.ndarray], request: openinfer.Request) -> dict[str, np.ndarray]:
        with self.cond:
            self.calls += 1
            self.cond.notify_all()
        for _ in range(int(BOUND / 0.005)):
            if request.is_cancelled():
                with self.cond:
                    self.saw_cancel += 1
                    self.cond.notify_all()
                break
            threading.Event().wait(0.005)
        return {"Y": inputs["X"]}


def _fail(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if inputs["X"][0] < 0:
        raise ValueError("the step refuses negative numbers")
    return {"Y": inputs["X"]}


@pytest.fixture(scope="module")
def branches() -> Branches:
    return Branches()


@pytest.fixture(scope="module")
def held() -> Held:
    return Held()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, branches: Branches, held: Held) -> Iterator[openinfer.Server]:
    def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        branches.wait()
        return {"Y": inputs["X"] * 2}

    def incr(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        branches.wait()
        return {"Y": inputs["X"] + 1}

    models = [
        Model("double", double, inputs=[_f32("X")], outputs=[_f32("Y")]),
        Model("incr", incr, inputs=[_f32("X")], outputs=[_f32("Y")]),
        Model("add", lambda i: {"SUM": i["A"] + i["B"]}, inputs=[_f32("A"), _f32("B")], outputs=[_f32("SUM")]),
        Model("fail", _fail, inputs=[_f32("X")], outputs=[_f32("Y")]),
        Model("held", held.fn, inputs=[_f32("X")], outputs=[_f32("Y")]),
        Model("ints", lambda i: {"Y": i["X"]}, inputs=[Tensor("X", "INT32", VEC)], outputs=[Tensor("Y", "INT32", VEC)]),
    ]
    repo = tmp_path_factory.mktemp("ensembles")
    # IN -> double -> incr -> OUT: OUT = 2 IN + 1; MID (2 IN) is an output too.
    _ensemble(repo, "chain", [_step("double", {"X": "IN"}, {"Y": "MID"}), _step("incr", {"X": "MID"}, {"Y": "OUT"})],
              outputs=["OUT", "MID"])
    # Steps listed out of order: the graph, not the list, orders them.
    _ensemble(repo, "diamond", [
        _step("add", {"A": "d", "B": "i"}, {"SUM": "OUT"}),
        _step("double", {"X": "IN"}, {"Y": "d"}),
        _step("incr", {"X": "IN"}, {"Y": "i"}),
    ])
    # "a_nested" sorts before "chain", its step: start-up loads it after.
    _ensemble(repo, "a_nested", [_step("chain", {"IN": "IN"}, {"OUT": "c"}), _step("double", {"X": "c"}, {"Y": "OUT"})])
    _ensemble(repo, "held_chain", [_step("held", {"X": "IN"}, {"Y": "t"}), _step("incr", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(repo, "failing", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("fail", {"X": "t"}, {"Y": "OUT"})])
    # Broken ones.
    _ensemble(repo, "bad_cycle", [
        _step("add", {"A": "IN", "B": "c"}, {"SUM": "a"}),
        _step("double", {"X": "a"}, {"Y": "c"}),
        _step("incr", {"X": "a"}, {"Y": "OUT"}),
    ])
    _ensemble(repo, "bad_tensor", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("add", {"A": "t", "B": "nowhere"}, {"SUM": "OUT"})])
    _ensemble(repo, "bad_model", [_step("no_such_model", {"X": "IN"}, {"Y": "OUT"})])
    _ensemble(repo, "bad_output", [_step("double", {"X": "IN"}, {"Y": "OUT"})], outputs=["OUT", "OUT2"])
    _ensemble(repo, "bad_input_name", [_step("double", {"NOPE": "IN"}, {"Y": "OUT"})])
    _ensemble(repo, "bad_output_name", [_step("double", {"X": "IN"}, {"NOPE": "OUT"})])
    _ensemble(repo, "bad_unmapped", [_step("add", {"A": "IN"}, {"SUM": "OUT"})])
    _ensemble(repo, "bad_dtype", [_step("ints", {"X": "IN"}, {"Y": "OUT"})])
    _ensemble(repo, "bad_unused_input", [_step("double", {"X": "IN"}, {"Y": "OUT"})], inputs=["IN", "EXTRA"])
    _ensemble(repo, "bad_version", [_step("double", {"X": "IN"}, {"Y": "OUT"}, version=7)])
    _ensemble(repo, "bad_twice", [_step("double", {"X": "IN"}, {"Y": "OUT"}), _step("incr", {"X": "IN"}, {"Y": "OUT"})])
    _ensemble(repo, "bad_instances", [_step("double", {"X": "IN"}, {"Y": "OUT"})], extra="instance_group [ { count: 2 } ]")
    _ensemble(repo, "bad_no_steps", [])
    for name, text in (("bad_platform", 'backend: "python" ensemble_scheduling { step [ %s ] }'),
                       ("bad_no_scheduling", 'platform: "ensemble"')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text("def infer(inputs):\n    return {'OUT': inputs['IN']}\n")
        (repo / name / "config.pbtxt").write_text(
            'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } output { name: "OUT" data_type: TYPE_FP32 '
            'dims: [ 4 ] } ' + text.replace("%s", _step("double", {"X": "IN"}, {"Y": "OUT"})))
    s = openinfer.serve(repo, models=models, http_port=0, grpc_port=0, log=False, threads=2)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def http(srv: openinfer.Server) -> Iterator[thttp.InferenceServerClient]:
    c = thttp.InferenceServerClient(srv.url.split("//")[1], network_timeout=BOUND)
    yield c
    c.close()


@pytest.fixture
def grpc(srv: openinfer.Server) -> Iterator[tgrpc.InferenceServerClient]:
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    yield c
    c.close()


def _infer(client: Any, model: str, x: np.ndarray, binary: bool = True, outputs: list[str] | None = None,
           name: str = "IN") -> Any:
    mod = thttp if isinstance(client, thttp.InferenceServerClient) else tgrpc
    i = mod.InferInput(name, list(x.shape), "FP32")
    if mod is thttp:
        i.set_data_from_numpy(x, binary_data=binary)
        outs = [thttp.InferRequestedOutput(o, binary_data=binary) for o in outputs] if outputs else None
    else:
        i.set_data_from_numpy(x)
        outs = [tgrpc.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(model, [i], outputs=outs)


def _count(client: Any, model: str) -> int:
    if isinstance(client, thttp.InferenceServerClient):
        stats = client.get_inference_statistics(model)
    else:
        stats = client.get_inference_statistics(model, as_json=True)
    (entry,) = stats["model_stats"]
    return int(entry["inference_stats"]["success"].get("count", 0))  # gRPC JSON leaves out zeros


X = np.array([1.5, -2.0, 0.25, 10.0], dtype=np.float32)


@pytest.mark.parametrize("binary", [True, False])
def test_chain_http(http: thttp.InferenceServerClient, binary: bool) -> None:
    r = _infer(http, "chain", X, binary=binary)
    np.testing.assert_array_equal(r.as_numpy("OUT"), X * 2 + 1)
    np.testing.assert_array_equal(r.as_numpy("MID"), X * 2)
    # Only what was asked comes back.
    r = _infer(http, "chain", X, binary=binary, outputs=["MID"])
    np.testing.assert_array_equal(r.as_numpy("MID"), X * 2)
    assert r.as_numpy("OUT") is None


def test_chain_grpc(grpc: tgrpc.InferenceServerClient) -> None:
    r = _infer(grpc, "chain", X)
    np.testing.assert_array_equal(r.as_numpy("OUT"), X * 2 + 1)
    r = _infer(grpc, "chain", X, outputs=["OUT"])
    np.testing.assert_array_equal(r.as_numpy("OUT"), X * 2 + 1)
    assert r.as_numpy("MID") is None


def test_nested_ensemble(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient) -> None:
    for client in (http, grpc):
        np.testing.assert_array_equal(_infer(client, "a_nested", X).as_numpy("OUT"), (X * 2 + 1) * 2)


def test_statistics_count_each_step(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient) -> None:
    names = ("chain", "double", "incr", "add")
    before = {n: _count(http, n) for n in names}
    for i in range(3):
        _infer(http, "chain", X + i)
        _infer(grpc, "chain", X + i)
    after = {n: _count(grpc, n) for n in names}
    assert {n: after[n] - before[n] for n in names} == {"chain": 6, "double": 6, "incr": 6, "add": 0}
    stats = http.get_inference_statistics("chain")["model_stats"][0]
    assert stats["execution_count"] >= 6 and stats["inference_stats"]["fail"]["count"] == 0


def test_parallel_branches(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient,
                           branches: Branches) -> None:
    branches.parallel.set()  # double and incr now wait for each other: only a concurrent run passes
    try:
        for client in (http, grpc):
            r = _infer(client, "diamond", X)
            np.testing.assert_array_equal(r.as_numpy("OUT"), X * 2 + (X + 1))
    finally:
        branches.parallel.clear()
    assert not branches.barrier.broken


def _index(http: thttp.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {e["name"]: e for e in http.get_model_repository_index()}


@pytest.mark.parametrize(
    "model, reason",
    [
        ("bad_cycle", "ensemble_scheduling.step: the steps of ensemble 'bad_cycle' form a cycle: "
                      "step[0] ('add') -> step[1] ('double') -> step[0] ('add')"),
        ("bad_tensor", "ensemble_scheduling.step[1].input_map: ensemble tensor 'nowhere' (input 'B' of model "
                       "'add') is neither an ensemble input nor any step's output"),
        ("bad_model", "ensemble_scheduling.step[0].model_name: ensemble 'bad_model' depends on 'no_such_model' "
                      "which has no loaded version."),
        ("bad_output", "output: output 'OUT2' for ensemble 'bad_output' is not written"),
        ("bad_input_name", "ensemble_scheduling.step[0].input_map: in ensemble bad_input_name, ensemble tensor "
                           "IN is mapping to non-existing input NOPE in model double"),
        ("bad_output_name", "ensemble_scheduling.step[0].output_map: in ensemble bad_output_name, ensemble "
                            "tensor OUT is mapped from non-existing output NOPE in model double"),
        ("bad_unmapped", "ensemble_scheduling.step[0].input_map: in ensemble bad_unmapped, input B in model add "
                         "is not mapped to any ensemble tensors"),
        ("bad_dtype", "ensemble tensor IN: inconsistent data type: INT32 is inferred from model ints while FP32 "
                      "is inferred from ensemble 'bad_dtype'"),
        ("bad_unused_input", "input: ensemble input 'EXTRA' for ensemble 'bad_unused_input' is not used"),
        ("bad_version", "ensemble_scheduling.step[0].model_name: ensemble 'bad_version' depends on 'double' "
                        "whose required version 7 is not loaded."),
        ("bad_twice", "ensemble_scheduling.step[1].output_map: ensemble tensor 'OUT' can appear in an output "
                      "map only once for ensemble 'bad_twice' step 1"),
        ("bad_instances", "instance_group: instance group should not be specified for ensemble 'bad_instances'"),
        ("bad_no_steps", "ensemble_scheduling.step: must specify 'step' for ensemble 'bad_no_steps'"),
        ("bad_platform", "ensemble_scheduling: ensemble scheduling cannot be set for model 'bad_platform' whose "
                         "platform is not ensemble"),
        ("bad_no_scheduling", "ensemble_scheduling: ensemble scheduling must be set for ensemble "
                              "bad_no_scheduling whose platform is ensemble"),
    ],
)
def test_bad_config_unavailable(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient,
                                model: str, reason: str) -> None:
    entry = _index(http)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert reason in entry["reason"], entry["reason"]
    assert not http.is_model_ready(model) and not grpc.is_model_ready(model)
    with pytest.raises(InferenceServerException) as e:
        _infer(http, model, X)
    assert e.value.status() == "503" and "is not ready" in e.value.message(), e.value
    with pytest.raises(InferenceServerException) as e:
        _infer(grpc, model, X)
    assert e.value.status() == "StatusCode.UNAVAILABLE", e.value
    assert http.is_server_live()


def test_failing_step_names_the_step(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient) -> None:
    bad = np.array([-1, 2, 3, 4], dtype=np.float32)  # double gives -2: fail refuses it
    want = ("in ensemble 'failing', step 1 (model 'fail'): model 'fail' raised ValueError: the step refuses "
            "negative numbers")
    before = {n: _count(http, n) for n in ("double", "fail")}
    with pytest.raises(InferenceServerException) as e:
        _infer(http, "failing", bad)
    assert e.value.status() == "500" and e.value.message() == want, e.value
    with pytest.raises(InferenceServerException) as e:
        _infer(grpc, "failing", bad)
    assert e.value.status() == "StatusCode.INTERNAL" and e.value.message() == want, e.value
    # The failures count as the ensemble's and the failing model's; double succeeded both times.
    stats = {n: http.get_inference_statistics(n)["model_stats"][0]["inference_stats"] for n in ("failing", "fail")}
    assert stats["failing"]["fail"]["count"] == 2 and stats["fail"]["fail"]["count"] == 2
    assert _count(http, "double") == before["double"] + 2 and _count(http, "fail") == before["fail"]
    # The server, the connections and the ensemble go on.
    good = np.array([1, 2, 3, 4], dtype=np.float32)
    np.testing.assert_array_equal(_infer(http, "failing", good).as_numpy("OUT"), good * 2)
    np.testing.assert_array_equal(_infer(grpc, "failing", good).as_numpy("OUT"), good * 2)


def test_cancel_reaches_the_running_step(srv: openinfer.Server, http: thttp.InferenceServerClient,
                                         held: Held) -> None:
    """A gRPC deadline that passes while a step runs: the step's model sees its request
    cancelled, and the next step is never sent."""
    before = _count(http, "incr")
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        i = tgrpc.InferInput("IN", [4], "FP32")
        i.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException) as e:
            client.infer("held_chain", [i], client_timeout=5.0)  # far past the request's way to the held step
        assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value  # from the client or the server
    finally:
        client.close()
    with held.cond:
        assert held.cond.wait_for(lambda: held.saw_cancel == 1, BOUND), (held.calls, held.saw_cancel)
    fails = 0
    for _ in range(int(BOUND / 0.01)):  # until the ensemble's request is over
        fails = http.get_inference_statistics("held_chain")["model_stats"][0]["inference_stats"]["fail"]["count"]
        if fails == 1:
            break
        threading.Event().wait(0.01)
    assert fails == 1
    assert held.calls == 1 and _count(http, "incr") == before


def test_bad_request_to_ensemble(srv: openinfer.Server, http: thttp.InferenceServerClient,
                                 grpc: tgrpc.InferenceServerClient) -> None:
    # Checked against the ensemble's own declaration before any step runs.
    before = _count(http, "double")
    body = {"inputs": [{"name": "IN", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    r = requests.post(f"{srv.url}/v2/models/chain/infer", data=json.dumps(body), timeout=BOUND)
    assert r.status_code == 400 and "IN" in r.json()["error"] and "[4]" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as e:
        _infer(grpc, "chain", X, name="WRONG")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "WRONG" in e.value.message()
    assert _count(http, "double") == before
    np.testing.assert_array_equal(_infer(http, "chain", X).as_numpy("OUT"), X * 2 + 1)


def test_metadata_and_config(http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient) -> None:
    meta = http.get_model_metadata("chain")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["IN"]
    config = grpc.get_model_config("diamond", as_json=True)["config"]
    assert config["platform"] == "ensemble"
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["add", "double", "incr"]
    assert steps[0]["input_map"] == {"A": "d", "B": "i"}


def test_example_ensemble(server: openinfer.Server) -> None:
    """examples/models/mlp_ensemble: the Python preprocessing feeds the TorchScript mlp; the
    answer equals calling the two models one after the other."""
    if "mlp" not in server.models:
        pytest.skip("torch is not installed: the mlp example is left out")
    c = thttp.InferenceServerClient(server.url.split("//")[1])
    raw = np.arange(48, dtype=np.uint8).reshape(3, 16) * 5
    i = thttp.InferInput("RAW", [3, 16], "UINT8")
    i.set_data_from_numpy(raw)
    scores = c.infer("mlp_ensemble", [i]).as_numpy("SCORES")
    i = thttp.InferInput("RAW", [3, 16], "UINT8")
    i.set_data_from_numpy(raw)
    features = c.infer("mlp_preprocess", [i]).as_numpy("FEATURES")
    np.testing.assert_array_equal(features, raw.astype(np.float32) / np.float32(255))
    j = thttp.InferInput("INPUT__0", [3, 16], "FP32")
    j.set_data_from_numpy(features)
    np.testing.assert_array_equal(scores, c.infer("mlp", [j]).as_numpy("OUTPUT__0"))
    c.close()


def _step_models(repo: Path, **exprs: str) -> None:
    for name, expr in exprs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(f"def infer(inputs):\n    return {{'Y': {expr}}}\n")
        (repo / name / "config.pbtxt").write_text(
            'backend: "python" input { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } '
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }'
        )


def _ready(client: Any) -> set[str]:
    if isinstance(client, tgrpc.InferenceServerClient):
        index = client.get_model_repository_index(as_json=True).get("models", [])
    else:
        index = client.get_model_repository_index()
    return {m["name"] for m in index if m.get("state") == "READY"}


def test_model_control(tmp_path: Path) -> None:
    """Explicit model control: loading an ensemble loads the step models it needs, as Triton's
    model manager does; a step model unloaded under it fails its requests naming the step, and
    loading the step again brings the ensemble back."""
    _step_models(tmp_path, double="inputs['X'] * 2", incr="inputs['X'] + 1")
    _ensemble(tmp_path, "chain", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("incr", {"X": "t"}, {"Y": "OUT"})])
    with openinfer.serve(tmp_path, http_port=0, grpc_port=0, log=False, model_control_mode="explicit") as s:
        c = thttp.InferenceServerClient(s.url.split("//")[1])
        g = tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            assert _ready(c) == set()
            c.load_model("chain")
            assert _ready(c) == {"chain", "double", "incr"}
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 2 + 1)
            c.unload_model("incr")
            with pytest.raises(InferenceServerException) as e:
                _infer(g, "chain", X)
            assert e.value.message() == ("in ensemble 'chain', step 1 (model 'incr'): Request for unknown model: "
                                         "'incr' is not found"), e.value
            g.load_model("incr")
            np.testing.assert_array_equal(_infer(g, "chain", X).as_numpy("OUT"), X * 2 + 1)
        finally:
            c.close()
            g.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unload_dependents_takes_the_steps_loaded_only_with_the_ensemble(tmp_path: Path, protocol: str) -> None:
    """Triton's cascading unload: with unload_dependents an ensemble's unload also unloads the
    step models that were loaded along with it, but not one a client loaded itself nor one
    another loaded ensemble still runs; without it the steps stay. A step that fails to load
    fails the ensemble's load, naming it."""
    _step_models(tmp_path, double="inputs['X'] * 2", incr="inputs['X'] + 1", neg="-inputs['X']")
    _ensemble(tmp_path, "chain", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("incr", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(tmp_path, "other", [_step("incr", {"X": "IN"}, {"Y": "OUT"})])
    _ensemble(tmp_path, "nested", [_step("chain", {"IN": "IN"}, {"OUT": "t"}), _step("neg", {"X": "t"}, {"Y": "OUT"})])
    _ensemble(tmp_path, "broken", [_step("bad", {"X": "IN"}, {"Y": "OUT"})])
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "config.pbtxt").write_text('backend: "python" input { name: "X" data_type: TYPE_FP32 }')
    with openinfer.serve(tmp_path, http_port=0, grpc_port=0, log=False, model_control_mode="explicit") as s:
        c = (thttp.InferenceServerClient(s.url.split("//")[1]) if protocol == "http"
             else tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}"))
        try:
            c.load_model("chain")
            c.unload_model("chain")
            assert _ready(c) == {"double", "incr"}  # without unload_dependents the steps stay
            c.load_model("chain")
            c.unload_model("chain", unload_dependents=True)  # loaded with it, though at its first load
            assert _ready(c) == set()
            c.load_model("incr")  # a client's own
            c.load_model("nested")  # an ensemble of ensembles: chain, then its steps, with it
            assert _ready(c) == {"nested", "chain", "double", "incr", "neg"}
            np.testing.assert_array_equal(_infer(c, "nested", X).as_numpy("OUT"), -(X * 2 + 1))
            c.load_model("other")
            c.unload_model("nested", unload_dependents=True)
            assert _ready(c) == {"incr", "other"}
            c.unload_model("other", unload_dependents=True)
            assert _ready(c) == {"incr"}
            with pytest.raises(InferenceServerException) as e:
                c.load_model("broken")
            assert "ensemble 'broken' depends on 'bad'" in e.value.message(), e.value.message()
            assert _ready(c) == {"incr"}
            # A config sent with the load names the steps: those load, not the folder's config's.
            io = {"data_type": "TYPE_FP32", "dims": [4]}
            c.load_model("other", config=json.dumps({
                "platform": "ensemble", "max_batch_size": 0, "input": [{"name": "IN", **io}],
                "output": [{"name": "OUT", **io}],
                "ensemble_scheduling": {"step": [{"model_name": "neg", "model_version": -1,
                                                  "input_map": {"X": "IN"}, "output_map": {"Y": "OUT"}}]}}))
            assert _ready(c) == {"incr", "other", "neg"}
            np.testing.assert_array_equal(_infer(c, "other", X).as_numpy("OUT"), -X)
        finally:
            c.close()


def test_load_model_at_start_brings_the_ensembles_steps(tmp_path: Path) -> None:
    """--load-model of an ensemble in explicit mode loads its step models with it, as Triton's
    start-up does; they count as loaded along with it for unload_dependents."""
    _step_models(tmp_path, double="inputs['X'] * 2", incr="inputs['X'] + 1", unused="inputs['X']")
    _ensemble(tmp_path, "chain", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("incr", {"X": "t"}, {"Y": "OUT"})])
    with openinfer.serve(tmp_path, http_port=0, grpc_port=None, log=False, model_control_mode="explicit",
                         load_models=["chain"]) as s:
        c = thttp.InferenceServerClient(s.url.split("//")[1])
        try:
            assert _ready(c) == {"chain", "double", "incr"}
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 2 + 1)
            c.unload_model("chain", unload_dependents=True)
            assert _ready(c) == set()
        finally:
            c.close()


# A Triton Python step model whose initialize appends its name to the file `inits` (one line a
# load: it has one instance) and whose Y is `expr` of X.
COUNTED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {init}
        with open({inits!r}, "a") as f:
            f.write({name!r} + "\\n")

    def execute(self, requests):
        xs = (pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", ({expr}).astype(np.float32))]) for X in xs]
"""


def _counted(repo: Path, inits: Path, name: str, expr: str, init: str = "pass") -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(COUNTED.format(init=init, inits=str(inits), name=name, expr=expr))
    (repo / name / "config.pbtxt").write_text(
        'backend: "python" input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_load_reloads_the_steps_whose_files_changed(tmp_path: Path, protocol: str) -> None:
    """As Triton's model manager polls an ensemble's composing models with its load: a load of
    the ensemble reloads a step whose files changed since its last load (one a client loaded
    itself too, which stays its own), leaves an unchanged one as it is (not initialized again).
    A changed step that fails to initialize serves on with its old version and the ensemble's
    load succeeds (Triton reports only the requested model's load); one whose config cannot be
    read fails the load with Triton's poll failure, the old step serving on; fixed, the next
    load takes it. A step last loaded from files sent with a load is reloaded from the
    repository."""
    repo, inits = tmp_path / "repo", tmp_path / "inits"
    _counted(repo, inits, "double", "X * 2")
    _counted(repo, inits, "incr", "X + 1")
    _ensemble(repo, "chain", [_step("double", {"X": "IN"}, {"Y": "t"}), _step("incr", {"X": "t"}, {"Y": "OUT"})])

    def started() -> list[str]:
        return inits.read_text().split() if inits.exists() else []

    with openinfer.serve(repo, http_port=0, grpc_port=0, log=False, model_control_mode="explicit") as s:
        c = (thttp.InferenceServerClient(s.url.split("//")[1]) if protocol == "http"
             else tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}"))
        try:
            c.load_model("double")  # a client's own
            c.load_model("chain")
            assert sorted(started()) == ["double", "incr"]
            c.load_model("chain")  # nothing changed: no step loads again
            assert sorted(started()) == ["double", "incr"]
            _counted(repo, inits, "incr", "X + 10")
            c.load_model("chain")
            assert sorted(started()) == ["double", "incr", "incr"]  # double kept its instance
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 2 + 10)
            _counted(repo, inits, "double", "X * 3")  # the client's own step reloads as well
            c.load_model("chain")
            assert sorted(started()) == ["double", "double", "incr", "incr"]
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 3 + 10)

            _counted(repo, inits, "incr", "X + 100", init="raise RuntimeError('incr cannot start')")
            c.load_model("chain")  # Triton: the step's failure is logged, the ensemble loads
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 3 + 10)
            assert _ready(c) == {"chain", "double", "incr"}

            (repo / "incr" / "config.pbtxt").write_text("backend: [ not a config")
            with pytest.raises(InferenceServerException) as e:
                c.load_model("chain")
            assert e.value.message().startswith(  # Triton's words, then why
                "failed to load 'chain', failed to poll from model repository: load failed for model 'incr': "
                f"{repo / 'incr' / 'config.pbtxt'}"), e.value
            assert e.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 3 + 10)

            _counted(repo, inits, "incr", "X + 100")  # fixed: the next load takes it
            c.load_model("chain")
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 3 + 100)
            c.unload_model("chain", unload_dependents=True)  # incr came with it; double is the client's
            assert _ready(c) == {"double"}

            # A step loaded from files sent with a load is reloaded from the repository.
            c.load_model("chain")
            tensor = {"data_type": "TYPE_FP32", "dims": [4]}
            code = COUNTED.format(init="pass", inits=str(inits), name="incr", expr="X + 1000").encode()
            c.load_model("incr", config=json.dumps({"backend": "python", "input": [{"name": "X", **tensor}],
                                                    "output": [{"name": "Y", **tensor}]}),
                         files={"file:1/model.py": code})
            np.testing.assert_array_equal(_infer(c, "incr", X, name="X").as_numpy("Y"), X + 1000)
            c.load_model("chain")
            np.testing.assert_array_equal(_infer(c, "chain", X).as_numpy("OUT"), X * 3 + 100)
        finally:
            c.close()


# Triton's QA ensembles of identity steps: nop_TYPE_<T>_-1 batches (max_batch_size 1024, dims
# [-1]); the ensembles over it do not (max_batch_size 0).
NOP_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "STRING"]


def _nop_ensemble(repo: Path, name: str, dtype: str, dims: str) -> None:
    step = f"nop_TYPE_{dtype}_-1"
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}" platform: "ensemble" max_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_{dtype} dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_{dtype} dims: [ {dims} ] }} ]\n'
        f'ensemble_scheduling {{ step [ {_step(step, {"INPUT0": "INPUT0"}, {"OUTPUT0": "t"})}, '
        f'{_step(step, {"INPUT0": "t"}, {"OUTPUT0": "OUTPUT0"})} ] }}\n'
    )


@pytest.fixture(scope="module")
def nops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("nops")
    for dtype in NOP_TYPES:
        name = f"nop_TYPE_{dtype}_-1"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}" backend: "identity" max_batch_size: 1024\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_{dtype} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_{dtype} dims: [ -1 ] }} ]\n'
        )
        _nop_ensemble(repo, f"simple_nop_{dtype}", dtype, "-1")
    _nop_ensemble(repo, "simple_nop_2d_FP32", "FP32", "-1, -1")
    s = openinfer.serve(repo, http_port=0, grpc_port=0, log=False, threads=2)
    try:
        assert s.failed == {}, s.failed
        yield s
    finally:
        s.stop()


def _nop_data(dtype: str, shape: list[int]) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == "STRING":
        return np.array([f"s{i}".encode() for i in range(n)], dtype=np.object_).reshape(shape)
    if dtype == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dtype == "BF16":  # tritonclient sends float32 arrays as bfloat16 (exact for small integers)
        return np.arange(n, dtype=np.float32).reshape(shape)
    return np.arange(n).astype(np.dtype(dtype.lower().replace("fp", "float"))).reshape(shape)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("dtype", NOP_TYPES)
def test_nonbatching_ensemble_over_batching_steps(nops: openinfer.Server, protocol: str, dtype: str) -> None:
    """Triton's ensemble scheduler passes a tensor of the ensemble (max_batch_size 0) whose shape
    is the step's declared one to the batching step as a batch of one, and takes the batch
    dimension off again for the ensemble's answer; empty tensors pass the same way."""
    mod = thttp if protocol == "http" else tgrpc
    client = triton_http(nops) if protocol == "http" else triton_grpc(nops)
    wire = "BYTES" if dtype == "STRING" else dtype
    for n in (0, 3):
        x = _nop_data(dtype, [n])
        i = mod.InferInput("INPUT0", [n], wire)
        i.set_data_from_numpy(x)
        r = client.infer(f"simple_nop_{dtype}", [i])
        out = r.as_numpy("OUTPUT0")
        assert out.shape == (n,), (dtype, n, out.shape)
        np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_tensor_beyond_the_step_shape_is_its_batch(nops: openinfer.Server, protocol: str) -> None:
    """An ensemble tensor of more dimensions than the batching step declares goes to it as a
    batch of its first dimension, and comes back whole."""
    mod = thttp if protocol == "http" else tgrpc
    client = triton_http(nops) if protocol == "http" else triton_grpc(nops)
    for shape in ([2, 3], [2, 0]):
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        i = mod.InferInput("INPUT0", shape, "FP32")
        i.set_data_from_numpy(x)
        out = client.infer("simple_nop_2d_FP32", [i]).as_numpy("OUTPUT0")
        assert out.shape == tuple(shape)
        np.testing.assert_array_equal(out, x)
