"""Model warm-up (config.pbtxt's model_warmup): the samples run through the model's own
scheduler and backend before the version is served (at start-up and on a repository load),
the model sees zero, random and file data as specified, and a warm-up that cannot be built or
that the model fails makes the version UNAVAILABLE with the reason naming the sample and the
input. Python and TorchScript models alike."""

from __future__ import annotations

import importlib
import json
import os
import struct
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

import openinfer
from conftest import assert_alive

PROBE = """
import threading

calls = []                   # the inputs of every call, copied
entered = threading.Event()  # set by the first call
release = threading.Event()  # calls wait for it; open unless a test closes it
release.set()
fail = None                  # a message to raise with, for inputs that are not all zeros
"""

MODEL = """
import numpy as np

import {probe} as probe


def infer(inputs):
    probe.calls.append({{k: np.array(v, copy=True) for k, v in inputs.items()}})
    probe.entered.set()
    assert probe.release.wait(60), "the test never opened the gate"
    if probe.fail and inputs["X"].any():
        raise ValueError(probe.fail)
    return {{"Y": inputs["X"]}}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
{extra}
"""


def sample(name: str, batch_size: int = 1, count: int = 1, key: str = "X", data_type: str = "TYPE_FP32",
           dims: str = "[ 3 ]", data: str = "zero_data: true") -> str:
    return (f'{{ name: "{name}" batch_size: {batch_size} count: {count} inputs {{ key: "{key}" value {{ '
            f'data_type: {data_type} dims: {dims} {data} }} }} }}')


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[ModuleType]:
    """A module of the test's own that the repository's model.py imports: the test reads the
    calls the model saw and holds its calls at a gate."""
    name = f"warmup_probe_{uuid.uuid4().hex}"
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / f"{name}.py").write_text(PROBE)
    sys.path.insert(0, str(tmp_path / "probe"))
    module = importlib.import_module(name)
    try:
        yield module
    finally:
        module.release.set()
        sys.path.remove(str(tmp_path / "probe"))
        sys.modules.pop(name, None)


def write_model(repo: Path, probe: ModuleType, name: str, warmups: list[str], files: dict[str, bytes] | None = None,
                extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL.format(probe=probe.__name__))
    warm = f"model_warmup [ {', '.join(warmups)} ]" if warmups else ""
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=warm + "\n" + extra))
    for path, data in (files or {}).items():
        (repo / name / "warmup").mkdir(exist_ok=True)
        (repo / name / "warmup" / path).write_bytes(data)


def index_of(s: openinfer.Server, name: str) -> dict[str, Any]:
    entries = [e for e in requests.post(f"{s.url}/v2/repository/index", timeout=10).json() if e["name"] == name]
    assert len(entries) == 1, entries
    return entries[0]


def infer(s: openinfer.Server, name: str, x: list[float]) -> requests.Response:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 3], "data": x}]}
    return requests.post(f"{s.url}/v2/models/{name}/infer", json=body, timeout=30)


def test_warmup_runs_before_ready(tmp_path: Path, probe: ModuleType) -> None:
    """Loaded through the repository API: while the warm-up is held at the gate, the model is
    LOADING and not ready (HTTP and gRPC clients agree); once it finishes, it is ready and the
    model has seen count x batch_size calls, none counted in the statistics."""
    repo = tmp_path / "repo"
    write_model(repo, probe, "warm", [sample("w", batch_size=2, count=3)])
    with openinfer.serve(repo, http_port=0, log=False, model_control_mode="explicit") as s:
        h = thttp.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        g = tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        probe.release.clear()
        loaded: list[Any] = []
        loader = threading.Thread(target=lambda: loaded.append(
            requests.post(f"{s.url}/v2/repository/models/warm/load", timeout=120)))
        loader.start()
        try:
            assert probe.entered.wait(60), "the warm-up never reached the model"
            assert not h.is_model_ready("warm") and not g.is_model_ready("warm")
            assert index_of(s, "warm")["state"] == "LOADING"
            assert infer(s, "warm", [1, 2, 3]).status_code in (400, 404, 503)
        finally:
            probe.release.set()
        loader.join(120)
        assert loaded[0].status_code == 200, loaded[0].text
        assert h.is_model_ready("warm") and g.is_model_ready("warm")
        assert index_of(s, "warm")["state"] == "READY"
        assert len(probe.calls) == 6
        assert all(c["X"].shape == (1, 3) and not c["X"].any() for c in probe.calls)
        r = infer(s, "warm", [1, 2, 3])
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3]
        assert len(probe.calls) == 7
        stats = h.get_inference_statistics("warm")["model_stats"][0]
        assert stats["inference_count"] == 1 and stats["inference_stats"]["success"]["count"] == 1
        h.close()
        g.close()


def test_warmup_data_reaches_the_model_at_startup(tmp_path: Path, probe: ModuleType) -> None:
    """Zero, random and file data, in sample order and count; a sample of batch 0 is skipped;
    count 0 runs once; extra bytes in a file are not sent."""
    repo = tmp_path / "repo"
    floats = np.array([1.5, -2.0, 3.25], np.float32)
    write_model(repo, probe, "warm", [
        sample("zeros", count=2),
        sample("skipped", batch_size=0),
        sample("random", count=0, data="random_data: true"),
        sample("file", data='input_data_file: "x.bin"'),
    ], files={"x.bin": floats.tobytes() + b"\xff\xff\xff\xff"})
    with openinfer.serve(repo, http_port=0, log=False) as s:
        assert requests.get(f"{s.url}/v2/models/warm/ready", timeout=10).status_code == 200
        seen = [c["X"] for c in probe.calls]
        assert len(seen) == 4
        assert not seen[0].any() and not seen[1].any()
        assert seen[2].dtype == np.float32 and seen[2].shape == (1, 3) and seen[2].tobytes() != bytes(12)
        assert seen[3].tolist() == [floats.tolist()]


STRING_MODEL = """
import numpy as np

import {probe} as probe


def infer(inputs):
    probe.calls.append({{k: np.array(v, copy=True) for k, v in inputs.items()}})
    return {{"Y": inputs["S"]}}
"""


def test_bytes_warmup_from_a_file(tmp_path: Path, probe: ModuleType) -> None:
    """A BYTES input's file is its serialized elements (4-byte length, then the bytes), whole;
    zero and random BYTES data are empty strings, as in Triton."""
    repo = tmp_path / "repo"
    (repo / "strings" / "1").mkdir(parents=True)
    (repo / "strings" / "1" / "model.py").write_text(STRING_MODEL.format(probe=probe.__name__))
    (repo / "strings" / "warmup").mkdir()
    (repo / "strings" / "warmup" / "s.bin").write_bytes(
        b"".join(struct.pack("<I", len(x)) + x for x in (b"hello", b"w\xc3\xb6rld")))
    (repo / "strings" / "config.pbtxt").write_text(textwrap.dedent("""
        backend: "python"
        input [ { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
        output [ { name: "Y" data_type: TYPE_STRING dims: [ 2 ] } ]
        model_warmup [
          { name: "file" batch_size: 1 inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ]
                                                                  input_data_file: "s.bin" } } },
          { name: "random" batch_size: 1 inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ]
                                                                    random_data: true } } }
        ]
    """))
    with openinfer.serve(repo, http_port=0, log=False) as s:
        assert requests.get(f"{s.url}/v2/models/strings/ready", timeout=10).status_code == 200
    assert [list(c["S"]) for c in probe.calls] == [[b"hello", b"w\xc3\xb6rld"], [b"", b""]]


BAD = [
    (sample("w", key="Z"), "failed to run warmup sample 'w': unexpected input 'Z' for model 'warm'"),
    (sample("w", dims="[ 4 ]"), "failed to run warmup sample 'w': input 'X': expected shape [-1,3], got [1,4]"),
    (sample("w", data_type="TYPE_INT32"), "input 'X': expected datatype FP32, got INT32"),
    (sample("w", dims="[ -1 ]"), "model_warmup[0] 'w' input 'X': warmup setting expects all variable-size "
                                 "dimensions are specified"),
    (sample("w", data=""), "model_warmup[0] 'w' input 'X': warmup setting expects input 'X' to have "
                           "input_data_type set"),
    (sample("w", data='input_data_file: "missing.bin"'), "model_warmup[0] 'w' input 'X': cannot read "
                                                         "input_data_file"),
    (sample("w", data='input_data_file: "../../../../etc/passwd"'),
     "input_data_file '../../../../etc/passwd' must be a file name inside the model's warmup/ directory"),
    (sample("w", data='input_data_file: "/etc/passwd"'), "input_data_file '/etc/passwd' must be a file name inside"),
    (sample("w", data='input_data_file: "link.bin"'), "input_data_file 'link.bin' leads outside the model's warmup/ "
                                                      "directory (through a symbolic link)"),
    (sample("w", data='input_data_file: "short.bin"'), "warmup setting expects 12 bytes, but the data provided "
                                                       "from short.bin only has 5 bytes"),
    (sample("ok") + ", " + sample("second", data="random_data: true"), "failed to run warmup sample 'second': "
                                                                        "model 'warm' raised ValueError: the model refuses"),
]


@pytest.mark.parametrize("warmup,message", BAD)
def test_bad_warmup_makes_the_model_unavailable(tmp_path: Path, probe: ModuleType, warmup: str,
                                                message: str) -> None:
    repo = tmp_path / "repo"
    write_model(repo, probe, "warm", [warmup], files={"short.bin": b"12345"})
    os.symlink("/etc/passwd", repo / "warm" / "warmup" / "link.bin")
    write_model(repo, probe, "fine", [])
    # The model refuses data that is not all zeros: a sample of zeros passes, a random one
    # fails, and the reason names that sample.
    probe.fail = "the model refuses"
    with openinfer.serve(repo, http_port=0, log=False, model_control_mode="explicit",
                         load_models=["fine"]) as s:
        r = requests.post(f"{s.url}/v2/repository/models/warm/load", timeout=60)
        assert r.status_code == 400 and message in r.json()["error"], r.text
        entry = index_of(s, "warm")
        assert entry["state"] == "UNAVAILABLE" and message in entry["reason"]
        r = requests.get(f"{s.url}/v2/models/warm/ready", timeout=10)
        assert r.status_code == 400
        r = infer(s, "warm", [1, 2, 3])
        assert r.status_code == 503 and message in r.json()["error"]
        # The server and the other model are unaffected.
        probe.fail = None
        assert infer(s, "fine", [1, 2, 3]).status_code == 200
        assert_alive(s.http_port)


def test_bad_warmup_at_startup(tmp_path: Path, probe: ModuleType) -> None:
    repo = tmp_path / "repo"
    write_model(repo, probe, "warm", [sample("w", dims="[ 2 ]")])
    with openinfer.serve(repo, http_port=0, log=False) as s:
        entry = index_of(s, "warm")
        assert entry["state"] == "UNAVAILABLE"
        assert "failed to run warmup sample 'w': input 'X': expected shape [-1,3], got [1,2]" in entry["reason"]
        assert requests.get(f"{s.url}/v2/models/warm/ready", timeout=10).status_code == 400


def test_failed_warmup_keeps_the_served_version(tmp_path: Path, probe: ModuleType) -> None:
    """A reload whose warm-up fails leaves the ready version serving, as any failed reload."""
    repo = tmp_path / "repo"
    write_model(repo, probe, "warm", [sample("w")])
    with openinfer.serve(repo, http_port=0, log=False, model_control_mode="explicit", load_models=["warm"]) as s:
        config = {
            "backend": "python", "max_batch_size": 4,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}],
            "model_warmup": [{"name": "bad", "batch_size": 1,
                              "inputs": {"X": {"data_type": "TYPE_FP32", "dims": [5], "zero_data": True}}}],
        }
        body = {"parameters": {"config": json.dumps(config)}}
        r = requests.post(f"{s.url}/v2/repository/models/warm/load", json=body, timeout=60)
        assert r.status_code == 400 and "failed to run warmup sample 'bad'" in r.json()["error"]
        assert infer(s, "warm", [1, 2, 3]).status_code == 200


# ---- TorchScript ----------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


class Counter(torch.nn.Module):
    """Returns its input and how many times forward() has run (a buffer it increments)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.add_(1)
        return x, self.calls.expand(x.size(0), 1).clone()


TORCH_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 1 ] } ]
model_warmup [ { name: "w" batch_size: 1 count: 3
                 inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ DIMS ] zero_data: true } } } ]
"""


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_warmup(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name, dims in (("counted", 3), ("broken", 7)):
        (repo / name / "1").mkdir(parents=True)
        torch.jit.script(Counter()).save(str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(TORCH_CONFIG.replace("DIMS", str(dims)))
    with openinfer.serve(repo, http_port=0, log=False) as s:
        h = thttp.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        x = thttp.InferInput("INPUT__0", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32))
        # The module ran three warm-up calls before this, the first request.
        assert h.infer("counted", [x]).as_numpy("OUTPUT__1").tolist() == [[4]]
        assert not h.is_model_ready("broken")
        reason = index_of(s, "broken")["reason"]
        assert "failed to run warmup sample 'w': input 'INPUT__0': expected shape [-1,3], got [1,7]" in reason
        h.close()


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_warmup_of_a_model_sent_with_the_load(tmp_path: Path) -> None:
    """Files sent with a repository load (file:1/model.pt, file:warmup/x.bin) are the model's
    directory: its warm-up reads x.bin from there, through tritonclient's load_model."""
    path = tmp_path / "model.pt"
    torch.jit.script(Counter()).save(str(path))
    config = {
        "platform": "pytorch_libtorch", "max_batch_size": 4,
        "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [3]},
                   {"name": "OUTPUT__1", "data_type": "TYPE_INT64", "dims": [1]}],
        "model_warmup": [{"name": "file", "batch_size": 2, "count": 2, "inputs": {
            "INPUT__0": {"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "x.bin"}}}],
    }
    (tmp_path / "repo").mkdir()
    with openinfer.serve(tmp_path / "repo", http_port=0, log=False, model_control_mode="explicit") as s:
        h = thttp.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        files = {"file:1/model.pt": path.read_bytes(), "file:warmup/x.bin": np.ones(3, np.float32).tobytes()}
        h.load_model("sent", config=json.dumps(config), files=files)
        x = thttp.InferInput("INPUT__0", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32))
        # Two iterations of two requests: four calls (no dynamic batching), then this one.
        assert h.infer("sent", [x]).as_numpy("OUTPUT__1").tolist() == [[5]]
        # The same load without the data file: the warm-up cannot read it.
        del files["file:warmup/x.bin"]
        with pytest.raises(Exception) as e:
            h.load_model("sent2", config=json.dumps(config), files=files)
        assert "cannot read input_data_file" in str(e.value)
        h.close()


def test_warmup_of_a_sequence_model_is_refused(tmp_path: Path) -> None:
    """A sequence model needs its control inputs on every request; openinfer's warm-up does not
    give them (Triton's does): the model is UNAVAILABLE saying so, not served unwarmed."""
    import shutil

    from openinfer._repository.repository import examples_path

    shutil.copytree(examples_path() / "simple_sequence", tmp_path / "simple_sequence")
    with open(tmp_path / "simple_sequence" / "config.pbtxt", "a") as f:
        f.write('model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT" value { data_type: TYPE_INT32 '
                "dims: [ 1 ] zero_data: true } } } ]\n")
    with openinfer.serve(tmp_path, http_port=0, log=False) as s:
        entry = index_of(s, "simple_sequence")
        assert entry["state"] == "UNAVAILABLE"
        assert "model_warmup with sequence_batching is not supported" in entry["reason"]


def test_warmup_of_a_decoupled_model_is_refused(tmp_path: Path) -> None:
    """A decoupled model's responses go to a stream that warm-up does not open: UNAVAILABLE,
    saying so, rather than served unwarmed."""
    (tmp_path / "gen" / "1").mkdir(parents=True)
    (tmp_path / "gen" / "1" / "model.py").write_text(
        "def infer(inputs):\n    yield {'Y': inputs['X']}\n")
    (tmp_path / "gen" / "config.pbtxt").write_text(CONFIG.format(name="gen", extra=(
        "model_transaction_policy { decoupled: true }\n"
        f"model_warmup [ {sample('w')} ]")).replace("max_batch_size: 4", "max_batch_size: 0"))
    with openinfer.serve(tmp_path, http_port=0, log=False) as s:
        entry = index_of(s, "gen")
        assert entry["state"] == "UNAVAILABLE"
        assert "model_warmup of a decoupled model is not supported" in entry["reason"]
