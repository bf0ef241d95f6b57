"""The model repository extension through the real transports, with tritonclient.http and
tritonclient.grpc as Triton users drive it: the index (states and reasons), load (plain, with a
JSON config override, with model files), unload, the control modes (none refuses, explicit
loads what it is told, poll follows the directory), a reload and an unload/load cycle under
concurrent inference with no failed request, and bad input refused with a clear status while
nothing else changes."""

from __future__ import annotations

import base64
import json
import shutil
import stat
import textwrap
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

from conftest import wait_for

# A Python model whose answer is the value in value.txt beside the repository's model
# directory, read at load time: each load can be told from the others. INPUT0 holds a delay in
# milliseconds, so that requests can be in flight while the model is swapped.
VALUE_MODEL = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import numpy as np

    from openinfer import Tensor

    INPUTS = [Tensor("INPUT0", "INT32", [1])]
    OUTPUTS = [Tensor("OUTPUT0", "INT32", [1])]
    VALUE = int((Path(__file__).parents[1] / "value.txt").read_text())


    def infer(inputs):
        delay = int(inputs["INPUT0"][0])
        if delay >= 1000:  # tell the test that this request is running
            (Path(__file__).parents[1] / "running").write_text(str(VALUE))
        time.sleep(delay / 1000.0)
        return {"OUTPUT0": np.array([VALUE], dtype=np.int32)}
    """
)

ADD_ONE = textwrap.dedent(
    """
    import numpy as np

    def infer(inputs):
        return {"OUTPUT0": inputs["INPUT0"] + 1}
    """
)

ADD_ONE_CONFIG = textwrap.dedent(
    """
    name: "add_one"
    backend: "python"
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """
)


def write_value_model(repo: Path, name: str, value: int, versions: tuple[int, ...] = (1,)) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "value.txt").write_text(str(value))
    for v in versions:
        (repo / name / str(v)).mkdir(exist_ok=True)
        (repo / name / str(v) / "model.py").write_text(VALUE_MODEL)


def write_add_one(repo: Path, versions: tuple[int, ...] = (1,)) -> None:
    (repo / "add_one").mkdir(parents=True, exist_ok=True)
    (repo / "add_one" / "config.pbtxt").write_text(ADD_ONE_CONFIG)
    for v in versions:
        (repo / "add_one" / str(v)).mkdir(exist_ok=True)
        (repo / "add_one" / str(v) / "model.py").write_text(ADD_ONE)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_value_model(root, "value", 10)
    write_add_one(root, versions=(1, 2))
    return root


@pytest.fixture
def explicit(repo: Path) -> Iterator[openinfer.Server]:
    with openinfer.serve(
        repo, http_port=0, model_control_mode="explicit", load_models=["value"], log=False
    ) as srv:
        yield srv


def clients(srv: openinfer.Server) -> tuple[thttp.InferenceServerClient, tgrpc.InferenceServerClient]:
    assert srv.grpc_url is not None
    return (
        thttp.InferenceServerClient(srv.url.removeprefix("http://")),
        tgrpc.InferenceServerClient(srv.grpc_url.removeprefix("grpc://")),
    )


def value_of(http: thttp.InferenceServerClient, model: str = "value", delay_ms: int = 0) -> int:
    inp = thttp.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
    return int(http.infer(model, [inp]).as_numpy("OUTPUT0")[0])


def add_one(http: thttp.InferenceServerClient, version: str = "") -> list[int]:
    inp = thttp.InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    return http.infer("add_one", [inp], model_version=version).as_numpy("OUTPUT0").tolist()


def grpc_index(g: tgrpc.InferenceServerClient, ready: bool = False) -> list[dict[str, str]]:
    """The index over gRPC; tritonclient's get_model_repository_index cannot ask for ready
    models only, so that goes through its stub."""
    if not ready:
        return list(g.get_model_repository_index(as_json=True).get("models", []))
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2

    response = g._client_stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    return [json_format.MessageToDict(m) for m in response.models]


# ---- index ------------------------------------------------------------------------------------


def test_index_lists_every_model_with_state_as_triton_does(explicit: openinfer.Server) -> None:
    http, grpc = clients(explicit)
    expected = [
        {"name": "add_one"},  # in the repository, never loaded: name only
        {"name": "value", "version": "1", "state": "READY"},
    ]
    assert http.get_model_repository_index() == expected
    assert grpc_index(grpc) == expected
    # The exact JSON body, as Triton writes it.
    r = requests.post(f"{explicit.url}/v2/repository/index", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    assert r.json() == expected
    # {"ready": true} keeps the ready versions only.
    r = requests.post(f"{explicit.url}/v2/repository/index", json={"ready": True}, timeout=10)
    assert r.json() == [{"name": "value", "version": "1", "state": "READY"}]
    assert grpc_index(grpc, ready=True) == [{"name": "value", "version": "1", "state": "READY"}]
    assert explicit.repository_index() == expected
    assert explicit.repository_index(ready=True) == expected[1:]
    assert "model_repository" in http.get_server_metadata()["extensions"]


def test_index_shows_failed_versions_with_their_reason(repo: Path) -> None:
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.py").write_text("raise RuntimeError('no GPU here')\n")
    (repo / "badconfig" / "1").mkdir(parents=True)
    (repo / "badconfig" / "config.pbtxt").write_text("max_batch_size: [\n")
    with openinfer.serve(repo, http_port=0, log=False) as srv:
        http, grpc = clients(srv)
        index = {(m["name"], m.get("version")): m for m in http.get_model_repository_index()}
        assert index["broken", "1"]["state"] == "UNAVAILABLE"
        assert "RuntimeError: no GPU here" in index["broken", "1"]["reason"]
        # A model that failed before a version could be chosen has no version.
        assert index["badconfig", None]["state"] == "UNAVAILABLE"
        assert "config.pbtxt" in index["badconfig", None]["reason"]
        assert index["add_one", "2"]["state"] == "READY"  # version_policy latest: 2 only
        assert ("add_one", "1") not in index
        assert grpc_index(grpc) == http.get_model_repository_index()


# ---- load and unload ----------------------------------------------------------------------


def test_load_and_unload_over_http_and_grpc(explicit: openinfer.Server) -> None:
    http, grpc = clients(explicit)
    with pytest.raises(InferenceServerException):
        add_one(http)
    http.load_model("add_one")
    assert add_one(http) == [2, 3, 4]
    assert http.is_model_ready("add_one", "2") and not http.is_model_ready("add_one", "1")
    grpc.unload_model("add_one")
    assert not http.is_model_ready("add_one")
    assert {"name": "add_one", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"} in (
        http.get_model_repository_index()
    )
    with pytest.raises(InferenceServerException):
        add_one(http)
    grpc.load_model("add_one")
    assert add_one(http) == [2, 3, 4]
    http.unload_model("add_one", unload_dependents=True)
    grpc.unload_model("add_one", unload_dependents=True)  # not loaded: nothing to do, as Triton
    assert not http.is_model_ready("add_one")
    assert value_of(http) == 10  # the other model never noticed


def test_load_with_a_config_override(explicit: openinfer.Server) -> None:
    http, grpc = clients(explicit)
    # The override replaces config.pbtxt: every version, and a different input name.
    config = {
        "name": "add_one",
        "backend": "python",
        "version_policy": {"all": {}},
        "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": ["-1"]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    }
    http.load_model("add_one", config=json.dumps(config))
    assert http.is_model_ready("add_one", "1") and http.is_model_ready("add_one", "2")
    assert http.get_model_metadata("add_one")["inputs"][0]["name"] == "X"
    # The configuration endpoints report the override, on both protocols.
    assert http.get_model_config("add_one")["input"][0]["name"] == "X"
    assert grpc.get_model_config("add_one").config.input[0].name == "X"
    # Loading again without the override goes back to config.pbtxt: version 2, INPUT0.
    grpc.load_model("add_one")
    assert not http.is_model_ready("add_one", "1")
    assert add_one(http) == [2, 3, 4]
    # Over gRPC too, and through the Python API with a dict.
    grpc.load_model("add_one", config=json.dumps(config))
    assert http.is_model_ready("add_one", "1")
    explicit.load_model("add_one", config={**config, "version_policy": {"specific": {"versions": [1]}}})
    assert http.is_model_ready("add_one", "1") and not http.is_model_ready("add_one", "2")
    assert explicit.models["add_one"] == (1,)



@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_override_sets_priority_queue_policies_keyed_as_triton_json_keys_them(
    explicit: openinfer.Server, protocol: str
) -> None:
    """priority_queue_policy is a map<uint64, ModelQueuePolicy>: protobuf's JSON keys it by
    the level as a decimal string. A key that is no level is refused, naming the field."""
    http, grpc = clients(explicit)
    client = http if protocol == "http" else grpc
    policy = {"maxQueueSize": 3, "timeoutAction": "DELAY", "defaultTimeoutMicroseconds": "5000"}
    config = {
        "name": "add_one", "backend": "python", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "dynamic_batching": {"priority_levels": 2, "default_priority_level": 1, "priority_queue_policy": {"2": policy}},
    }
    client.load_model("add_one", config=json.dumps(config))
    served = http.get_model_config("add_one")["dynamic_batching"]["priority_queue_policy"]
    assert served == {"2": {"max_queue_size": 3, "timeout_action": "DELAY", "default_timeout_microseconds": 5000,
                            "allow_timeout_override": False}}
    assert grpc.get_model_config("add_one").config.dynamic_batching.priority_queue_policy[2].max_queue_size == 3

    config["dynamic_batching"]["priority_queue_policy"] = {"two": policy}
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_one", config=json.dumps(config))
    assert "dynamic_batching.priority_queue_policy: key must be a single integer, got 'two'" in e.value.message()
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


torch = None
try:  # the TorchScript file test needs torch; everything else does not
    import torch  # type: ignore[no-redef]
except ImportError:
    pass


if torch is not None:

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + x


def scripted_double() -> bytes:
    import io

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Double()), buffer)  # type: ignore[union-attr]
    return buffer.getvalue()


DOUBLE_CONFIG = {
    "name": "double",
    "platform": "pytorch_libtorch",
    "max_batch_size": 0,
    "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [-1]}],
}


def infer_double(http: thttp.InferenceServerClient) -> list[float]:
    inp = thttp.InferInput("INPUT__0", [3], "FP32")
    inp.set_data_from_numpy(np.array([1.5, -2.0, 4.0], dtype=np.float32))
    return http.infer("double", [inp]).as_numpy("OUTPUT__0").tolist()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_overrides_as_tritons_examples_send_them(explicit: openinfer.Server) -> None:
    """Triton's simple_{http,grpc}_model_control.py send integers as strings
    ({"max_batch_size":"16"}: protobuf's JSON mapping allows it for every integer field), and a
    file name with a leading '/' is inside the model directory, as tritonserver joins it."""
    http, grpc = clients(explicit)
    model = scripted_double()
    config = {**DOUBLE_CONFIG, "max_batch_size": "0", "instance_group": [{"count": "2", "kind": "KIND_CPU"}]}
    http.load_model("double", config=json.dumps(config), files={"file:/1/model.pt": model})
    assert infer_double(http) == [3.0, -4.0, 8.0]
    assert http.get_model_config("double")["instance_group"][0]["count"] == 2
    config["max_batch_size"] = "16"
    config["input"] = [{**DOUBLE_CONFIG["input"][0], "dims": ["-1"]}]
    config["output"] = [{**DOUBLE_CONFIG["output"][0], "dims": ["-1"]}]
    grpc.load_model("double", config=json.dumps(config), files={"file:/2/model.pt": model})
    assert http.get_model_config("double")["max_batch_size"] == 16
    with pytest.raises(InferenceServerException, match="max_batch_size must be a single integer, got 'sixteen'"):
        grpc.load_model("double", config=json.dumps({**config, "max_batch_size": "sixteen"}))
    http.unload_model("double")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_load_torchscript_from_files_over_http_and_grpc(explicit: openinfer.Server) -> None:
    http, grpc = clients(explicit)
    model = scripted_double()
    # A model that exists nowhere in the repository: its files make up its whole directory.
    http.load_model("double", config=json.dumps(DOUBLE_CONFIG), files={"file:1/model.pt": model})
    assert infer_double(http) == [3.0, -4.0, 8.0]
    temp = explicit._control._temp_root
    assert temp is not None
    loads = list(temp.iterdir())
    assert len(loads) == 1
    for path in [temp, loads[0], *loads[0].rglob("*")]:  # private to the server's user
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert {"name": "double", "version": "1", "state": "READY"} in http.get_model_repository_index()
    # Over gRPC the files travel as bytes; the new directory replaces the old one.
    grpc.load_model("double", config=json.dumps(DOUBLE_CONFIG), files={"file:2/model.pt": model})
    assert http.is_model_ready("double", "2") and not http.is_model_ready("double", "1")
    assert list(temp.iterdir()) != loads and len(list(temp.iterdir())) == 1
    http.unload_model("double")
    assert list(temp.iterdir()) == []  # unload removes the files
    explicit.load_model("double", config=DOUBLE_CONFIG, files={"1/model.pt": model})
    assert infer_double(http) == [3.0, -4.0, 8.0]
    explicit.stop()
    assert not temp.exists()  # stop removes them all


# ---- reload and unload under load ---------------------------------------------------------


def grpc_value_of(client: tgrpc.InferenceServerClient, model: str, delay_ms: int) -> int:
    inp = tgrpc.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
    return int(client.infer(model, [inp]).as_numpy("OUTPUT0")[0])


def run_load(
    srv: openinfer.Server, models: list[str], stop: threading.Event
) -> tuple[list[tuple[str, int]], list[str], list[threading.Thread]]:
    """Starts three threads per model sending inferences until `stop`, two over HTTP and one
    over gRPC; returns the values seen and the failures, both filled as they come, and the
    threads."""
    values: list[tuple[str, int]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def worker(model: str, protocol: str) -> None:
        http, grpc = clients(srv)
        while not stop.is_set():
            try:
                if protocol == "grpc":
                    v = grpc_value_of(grpc, model, delay_ms=2)
                else:
                    v = value_of(http, model, delay_ms=2)
            except Exception as e:  # every failure counts, whatever it is
                with lock:
                    failures.append(f"{model}: {e}")
            else:
                with lock:
                    values.append((model, v))

    threads = [
        threading.Thread(target=worker, args=(m, p)) for m in models for p in ("http", "http", "grpc")
    ]
    for t in threads:
        t.start()
    return values, failures, threads


def test_reload_and_unload_cycle_under_load_lose_nothing(repo: Path) -> None:
    write_value_model(repo, "other", 7)
    write_value_model(repo, "keep", 3)
    with openinfer.serve(
        repo, http_port=0, model_control_mode="explicit", load_models=["*"], log=False
    ) as srv:
        http, grpc = clients(srv)
        stop = threading.Event()
        values, failures, threads = run_load(srv, ["value", "keep"], stop)
        try:
            for round_ in range(1, 6):
                (repo / "value" / "value.txt").write_text(str(10 + round_))
                (http if round_ % 2 else grpc).load_model("value")  # reload the loaded model
                # Once the load has returned, new requests reach the new version; the
                # threads get there too before the next round.
                assert value_of(http) == 10 + round_
                wait_for(lambda: ("value", 10 + round_) in values, f"the load threads to see round {round_}")
                # Another model goes and comes back meanwhile.
                grpc.unload_model("other")
                http.load_model("other")
                assert value_of(http, "other") == 7
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert failures == []
        seen = {v for m, v in values if m == "value"}
        assert {11, 12, 13, 14, 15} <= seen <= {10, 11, 12, 13, 14, 15}
        assert {v for m, v in values if m == "keep"} == {3}  # the model beside, untouched


def test_a_request_admitted_before_a_reload_finishes_on_the_old_version(explicit: openinfer.Server, repo: Path) -> None:
    http, _ = clients(explicit)
    url = explicit.url.removeprefix("http://")
    slow: list[int] = []
    t = threading.Thread(
        target=lambda: slow.append(value_of(thttp.InferenceServerClient(url), delay_ms=1500))
    )
    t.start()
    wait_for(lambda: (repo / "value" / "running").exists(), "the slow request to run")
    (repo / "value" / "value.txt").write_text("99")
    http.load_model("value")  # swaps, then waits for the slow request on the old version
    t.join(timeout=30)
    assert slow == [10]
    assert value_of(http) == 99


# A model whose import waits for a file the test creates: a load that takes as long as the
# test wants, without timing anything.
GATED_MODEL = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import numpy as np

    from openinfer import Tensor

    INPUTS = [Tensor("INPUT0", "INT32", [1])]
    OUTPUTS = [Tensor("OUTPUT0", "INT32", [1])]
    gate = Path(__file__).parents[1] / "go"
    for _ in range(3000):  # at most 30 s
        if gate.exists():
            break
        time.sleep(0.01)


    def infer(inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
    """
)


def test_a_slow_load_blocks_no_request_and_shows_loading(explicit: openinfer.Server, repo: Path) -> None:
    http, grpc = clients(explicit)
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL)
    errors: list[Exception] = []

    def load() -> None:
        try:
            thttp.InferenceServerClient(explicit.url.removeprefix("http://")).load_model("gated")
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=load)
    t.start()
    try:
        loading = {"name": "gated", "version": "1", "state": "LOADING"}
        wait_for(lambda: loading in http.get_model_repository_index(), "the LOADING state")
        # While it loads, the server answers everything else, on both protocols.
        assert loading in grpc_index(grpc)
        assert value_of(http) == 10
        assert http.is_server_live() and grpc.is_model_ready("value")
        assert not http.is_model_ready("gated")
    finally:
        (repo / "gated" / "go").write_text("")
        t.join(timeout=60)
    assert errors == []
    assert {"name": "gated", "version": "1", "state": "READY"} in http.get_model_repository_index()


def test_unload_drains_requests_in_flight_and_shows_unloading(explicit: openinfer.Server, repo: Path) -> None:
    http, grpc = clients(explicit)
    url = explicit.url.removeprefix("http://")
    slow: list[int] = []
    request = threading.Thread(
        target=lambda: slow.append(value_of(thttp.InferenceServerClient(url), delay_ms=2000))
    )
    request.start()
    wait_for(lambda: (repo / "value" / "running").exists(), "the slow request to run")
    unload = threading.Thread(target=lambda: grpc.unload_model("value"))
    unload.start()
    unloading = {"name": "value", "version": "1", "state": "UNLOADING"}
    wait_for(lambda: unloading in http.get_model_repository_index(), "the UNLOADING state")
    # New requests no longer reach the version that is going.
    with pytest.raises(InferenceServerException):
        value_of(http)
    request.join(timeout=30)
    unload.join(timeout=30)
    assert slow == [10]  # the request admitted before the unload was answered
    assert http.get_model_repository_index()[-1] == {
        "name": "value", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"
    }


# ---- control modes ------------------------------------------------------------------------


def test_mode_none_refuses_load_and_unload_as_triton(repo: Path) -> None:
    with openinfer.serve(repo, http_port=0, log=False) as srv:
        http, grpc = clients(srv)
        before = http.get_model_repository_index()
        message = "explicit model load / unload is not allowed if polling is enabled"
        for call in (lambda: http.load_model("value"), lambda: http.unload_model("value")):
            with pytest.raises(InferenceServerException, match=message):
                call()
        r = requests.post(f"{srv.url}/v2/repository/models/value/unload", timeout=10)
        assert r.status_code == 503 and r.json() == {"error": message}
        with pytest.raises(InferenceServerException, match=message) as e:
            grpc.load_model("value")
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        with pytest.raises(openinfer.InferenceServerError, match=message):
            srv.unload_model("value")
        assert http.get_model_repository_index() == before
        assert value_of(http) == 10


def test_explicit_mode_loads_only_what_it_is_told(repo: Path) -> None:
    with openinfer.serve(repo, http_port=0, model_control_mode="explicit", log=False) as srv:
        assert srv.models == {}
        assert srv.repository_index() == [{"name": "add_one"}, {"name": "value"}]
    with openinfer.serve(
        repo, http_port=0, model_control_mode="explicit", load_models=["*"], log=False
    ) as srv:
        assert srv.models == {"add_one": (2,), "value": (1,)}
    with pytest.raises(ValueError, match="no model directory 'nope'"):
        openinfer.serve(repo, http_port=0, model_control_mode="explicit", load_models=["nope"], log=False)
    with pytest.raises(ValueError, match="explicit"):
        openinfer.serve(repo, http_port=0, load_models=["value"], log=False)


def test_poll_mode_follows_new_versions_changes_and_removals(repo: Path) -> None:
    with openinfer.serve(
        repo, http_port=0, model_control_mode="poll", repository_poll_secs=0.1, log=False
    ) as srv:
        http, _ = clients(srv)
        assert srv.models == {"add_one": (2,), "value": (1,)}
        # A new version directory: latest policy serves it instead of version 2.
        (repo / "add_one" / "3").mkdir()
        (repo / "add_one" / "3" / "model.py").write_text(ADD_ONE.replace("+ 1", "+ 3"))
        wait_for(lambda: http.is_model_ready("add_one", "3"), "version 3")
        assert add_one(http) == [4, 5, 6]
        assert not http.is_model_ready("add_one", "2")
        # A changed file reloads the model.
        (repo / "value" / "value.txt").write_text("123")
        wait_for(lambda: value_of(http) == 123, "the changed value")
        # A new model loads; a removed one unloads.
        write_value_model(repo, "newcomer", 5)
        wait_for(lambda: http.is_model_ready("newcomer"), "the new model")
        shutil.rmtree(repo / "value")
        wait_for(
            lambda: all(m["name"] != "value" for m in http.get_model_repository_index()),
            "the removed model to leave the index",
        )
        assert not http.is_model_ready("value")
        index = http.get_model_repository_index()
        assert {"name": "newcomer", "version": "1", "state": "READY"} in index
        assert all(m["name"] != "value" for m in index)
        # A broken edit leaves the model serving as it was, once a poll has seen it.
        seen = srv._control._fingerprints["add_one"]
        (repo / "add_one" / "config.pbtxt").write_text("max_batch_size: [\n")
        wait_for(lambda: srv._control._fingerprints["add_one"] != seen, "a poll of the broken edit")
        assert add_one(http) == [4, 5, 6]
        assert {"name": "add_one", "version": "3", "state": "READY"} in http.get_model_repository_index()


# ---- bad input ----------------------------------------------------------------------------


def test_bad_load_requests_are_refused_and_change_nothing(explicit: openinfer.Server) -> None:
    http, grpc = clients(explicit)
    before = http.get_model_repository_index()
    url = explicit.url

    def post(path: str, body: Any = None, raw: bytes | None = None) -> requests.Response:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        return requests.post(f"{url}/v2/repository/{path}", data=data, timeout=10)

    cases: list[tuple[str, Any, int, str]] = [
        ("models/nope/load", None, 404, "failed to load 'nope', failed to poll from model repository"),
        ("models/value/load", {"parameters": {"config": "{not json"}}, 400,
         "failed to load 'value': Invalid config override: not valid JSON"),
        ("models/value/load", {"parameters": {"config": json.dumps({"name": "other"})}}, 400,
         "name 'other' differs from the model's name 'value'"),
        ("models/value/load", {"parameters": {"config": "{}", "file:1/model.pt": "@@not base64@@"}}, 400,
         "load parameter 'file:1/model.pt' is not valid base64"),
        ("models/value/load", {"parameters": {"config": "{}", "file:../../etc/x": "AAAA"}}, 400,
         "Invalid file parameter 'file:../../etc/x': the path must stay within the model directory"),
        ("models/value/load", {"parameters": {"config": "{}", "file://1/model.pt": "AAAA"}}, 400,
         "Invalid file parameter 'file://1/model.pt'"),
        ("models/value/load", {"parameters": {"file:1/model.pt": "AAAA"}}, 400,
         "Load parameter 'config' must be specified for model file override"),
        ("models/value/load", {"parameters": {"colour": "blue"}}, 400, "unrecognized load parameter 'colour'"),
        ("models/value/load", {"parameters": {"config": 5}}, 400, "load parameter 'config' must be a JSON string"),
        ("models/value/load", None, 400, "failed to parse the load model request JSON buffer"),
        ("models/%2E%2E/load", {}, 400, "invalid model name '..', model name must not contain path traversal"),
        ("models/value/unload", {"parameters": {"unload_dependents": "yes"}}, 400,
         "Unable to parse 'unload_dependents'"),
        ("index", {"ready": "yes"}, 400, "Invalid value for 'ready': expected a boolean"),
        ("index", None, 400, "failed to parse the registry index request JSON buffer"),
        ("myrepo/index", None, 501, "'repository_name' specification is not supported"),
    ]
    for path, body, status, message in cases:
        raw = b"[1, 2" if body is None and status == 400 else None
        r = post(path, body, raw)
        assert r.status_code == status, (path, body, r.text)
        assert message in r.json()["error"], (path, body, r.json())
    r = requests.get(f"{url}/v2/repository/index", timeout=10)
    assert r.status_code == 405
    # The same mistakes over gRPC, as Triton words them there.
    from tritonclient.grpc import service_pb2

    stub = grpc._client_stub
    for params, message in [
        ({"config": service_pb2.ModelRepositoryParameter(bytes_param=b"{}")},
         "invalid value type for load parameter 'config', expected string_param."),
        ({"config": service_pb2.ModelRepositoryParameter(string_param="{}"),
          "file:1/model.pt": service_pb2.ModelRepositoryParameter(string_param="x")},
         "invalid value type for load parameter 'file:1/model.pt', expected bytes_param."),
        ({"config": service_pb2.ModelRepositoryParameter(string_param="{}"),
          "file:1/../../x": service_pb2.ModelRepositoryParameter(bytes_param=b"x")},
         "Invalid file parameter 'file:1/../../x'"),
        ({"config": service_pb2.ModelRepositoryParameter(string_param="[]")},
         "Invalid config override: expected a JSON object"),
    ]:
        with pytest.raises(Exception) as e:
            stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="value", parameters=params))
        assert e.value.code().name == "INVALID_ARGUMENT" and message in e.value.details(), e.value.details()
    with pytest.raises(Exception) as e:
        stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(
            model_name="value", parameters={"unload_dependents": service_pb2.ModelRepositoryParameter(int64_param=1)}))
    assert e.value.code().name == "INVALID_ARGUMENT"
    assert "expected bool_param" in e.value.details()
    with pytest.raises(Exception) as e:
        stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(repository_name="other"))
    assert e.value.code().name == "UNIMPLEMENTED"
    with pytest.raises(InferenceServerException, match="failed to poll from model repository") as ee:
        grpc.load_model("nope")
    assert ee.value.status() == "StatusCode.NOT_FOUND"
    # Nothing changed: the same index, the model still serves, no file was written.
    assert http.get_model_repository_index() == before
    assert grpc_index(grpc) == before
    assert value_of(http) == 10
    temp = explicit._control._temp_root
    assert temp is None or list(temp.iterdir()) == []


def test_a_failed_reload_keeps_the_ready_version(explicit: openinfer.Server, repo: Path) -> None:
    http, grpc = clients(explicit)
    before = http.get_model_repository_index()
    (repo / "value" / "1" / "model.py").write_text("def infer(:\n")
    with pytest.raises(InferenceServerException, match=r"load failed for model 'value': version 1 is at "
                                                       r"UNAVAILABLE state: .*SyntaxError"):
        http.load_model("value")
    with pytest.raises(InferenceServerException, match="load failed for model 'value'") as e:
        grpc.load_model("value")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert http.get_model_repository_index() == before
    assert value_of(http) == 10


def test_bad_files_are_refused_over_the_python_api(explicit: openinfer.Server) -> None:
    with pytest.raises(openinfer.InferenceServerError) as e:
        explicit.load_model("value", config={}, files={"file:a/../../b": b"x"})
    assert e.value.status == 400
    with pytest.raises(openinfer.InferenceServerError) as e:
        explicit.load_model("x/y")
    assert e.value.status == 400 and "path traversal" in e.value.message
    garbage = base64.b64encode(b"not a TorchScript archive").decode()
    r = requests.post(
        f"{explicit.url}/v2/repository/models/junk/load",
        json={"parameters": {"config": json.dumps({"name": "junk", "platform": "pytorch_libtorch"}),
                             "file:1/model.pt": garbage}},
        timeout=30,
    )
    assert r.status_code == 400 and "load failed for model 'junk'" in r.json()["error"]
    temp = explicit._control._temp_root
    assert temp is not None and list(temp.iterdir()) == []  # nothing stays of a failed load


def test_a_compressed_load_body_is_inflated_off_the_loop(explicit: openinfer.Server) -> None:
    """A gzip request body (a config override) is inflated on the control thread; a corrupt one
    is a 400 and changes nothing."""
    import gzip

    config = {"name": "add_one", "backend": "python", "version_policy": {"all": {}},
              "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}]}
    body = gzip.compress(json.dumps({"parameters": {"config": json.dumps(config)}}).encode())
    url = explicit.url + "/v2/repository/models/add_one/load"
    r = requests.post(url, data=body, headers={"Content-Encoding": "gzip"}, timeout=60)
    assert r.status_code == 200, r.text
    http, _ = clients(explicit)
    assert http.get_model_metadata("add_one")["inputs"][0]["name"] == "X"
    r = requests.post(url, data=body[:-8], headers={"Content-Encoding": "gzip"}, timeout=60)
    assert r.status_code == 400 and "error" in r.json(), r.text
    assert http.get_model_metadata("add_one")["inputs"][0]["name"] == "X"


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/add_one/load",
                                  "/v2/logging", "/v2/trace/setting"])
def test_control_bodies_in_an_unknown_encoding_are_refused(explicit: openinfer.Server, path: str) -> None:
    """A control request compressed with an encoding the server cannot inflate gets 415 naming
    it, before anything runs; the server goes on."""
    r = requests.post(explicit.url + path, data=b"\x00\x01", headers={"Content-Encoding": "br"}, timeout=60)
    assert r.status_code == 415 and "'br'" in r.json()["error"], r.text
    assert requests.post(explicit.url + "/v2/repository/index", timeout=60).status_code == 200
