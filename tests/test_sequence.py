"""Sequence batching (issue 12 item 1): Triton's sequence_id / sequence_start / sequence_end
over HTTP JSON, HTTP binary and gRPC (unary and streaming), control inputs, implicit state,
the Direct and Oldest strategies, the backlog, idle release and the errors Triton gives, all
through tritonclient against a repository of Python sequence models. Plus Triton's sequence
client examples' expectations against the example models simple_sequence,
simple_dyna_sequence and simple_string_dyna_sequence."""

from __future__ import annotations

import json
import queue
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import save_torchscript
from conftest import triton_grpc as _grpc
from conftest import triton_http as _http
from openinfer._repository.repository import scan_model

BOUND = 30.0  # no wait here lasts longer: a bound for a hung test, not a measurement

# A running sum kept as implicit state; BATCH tells how many rows the call that served the
# request had (the proof that requests of different sequences were batched).
ACC_MODEL = '''
import numpy as np

def infer(inputs):
    start = inputs["START"] != 0
    total = np.where(start, inputs["INPUT"], inputs["SUM_IN"] + inputs["INPUT"])
    rows = inputs["INPUT"].shape[0]
    return {"OUTPUT": total, "SUM_OUT": total, "BATCH": np.full((rows, 1), rows, dtype=np.int32)}
'''

ACC_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
sequence_batching {{
  {strategy}
  {idle}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [
    {{
      input_name: "SUM_IN"
      output_name: "SUM_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      {initial}
    }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
'''

# Every control kind, in each of the value types, on a model without a batch dimension.
CONTROLS_MODEL = '''
import numpy as np

def infer(inputs):
    return {"S": inputs["S_IN"], "E": inputs["E_IN"], "R": inputs["R_IN"], "C": inputs["C_IN"],
            "OUTPUT": inputs["INPUT"]}
'''

CONTROLS_CONFIG = '''
name: "controls"
backend: "python"
sequence_batching {
  control_input [
    { name: "S_IN" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0.5, 2.5 ] } ] },
    { name: "E_IN" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "R_IN" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 7, 9 ] } ] },
    { name: "C_IN" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "S" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "E" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "R" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "C" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }
]
'''

ONE_SLOT = "oldest { max_candidate_sequences: 1 }"


def _write(repo: Path, name: str, config: str, model: str, files: dict[str, bytes] | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(model)
    for rel, data in (files or {}).items():
        (repo / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / name / rel).write_bytes(data)


def _acc(name: str, *, strategy: str = "", idle: str = "", max_batch: int = 8, instances: int = 1,
         initial: str = "") -> str:  # fmt: skip
    return ACC_CONFIG.format(name=name, strategy=strategy, idle=idle, max_batch=max_batch,
                             instances=instances, initial=initial)  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("seqrepo")
    _write(repo, "acc", _acc("acc", instances=2), ACC_MODEL)
    # Oldest: a batch is formed once 4 sequences have a request ready (the delay only bounds
    # a test that went wrong).
    _write(repo, "acc_oldest", _acc("acc_oldest", max_batch=4, strategy=(
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] "
        "max_queue_delay_microseconds: 20000000 }")), ACC_MODEL)  # fmt: skip
    _write(repo, "acc_idle", _acc("acc_idle", idle="max_sequence_idle_microseconds: 100000"), ACC_MODEL)
    _write(repo, "acc_one_slot", _acc("acc_one_slot", strategy=ONE_SLOT), ACC_MODEL)
    _write(repo, "acc_nobatch", _acc("acc_nobatch", max_batch=0), ACC_MODEL.replace("inputs[\"INPUT\"].shape[0]", "1").replace("(rows, 1)", "(1,)"))  # fmt: skip
    _write(repo, "acc_file", _acc("acc_file", initial=(
        'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "h" }')),
        ACC_MODEL.replace('np.where(start, inputs["INPUT"]', 'np.where(start, inputs["SUM_IN"] + inputs["INPUT"]'),
        {"initial_state/hundred": np.array([100], dtype=np.int32).tobytes()})  # fmt: skip
    _write(repo, "controls", CONTROLS_CONFIG, CONTROLS_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[openinfer.Server]:
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def examples() -> Iterator[openinfer.Server]:
    srv = openinfer.serve(openinfer.examples_path(), http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def _int_input(module: Any, value: int, shape: tuple[int, ...] = (1, 1), name: str = "INPUT") -> Any:
    data = np.full(shape, value, dtype=np.int32)
    t = module.InferInput(name, list(data.shape), "INT32")
    t.set_data_from_numpy(data)
    return t


def _step(client: Any, module: Any, model: str, value: int, seq: int | str, *, start: bool = False,
          end: bool = False, shape: tuple[int, ...] = (1, 1), **kw: Any) -> Any:  # fmt: skip
    return client.infer(model, [_int_input(module, value, shape)], sequence_id=seq, sequence_start=start,
                        sequence_end=end, **kw)  # fmt: skip


# ---- Triton's sequence client examples -------------------------------------------------------

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _expected(dyna: bool, results: dict[str, list[int]], ids: dict[str, int | str]) -> dict[str, list[int]]:
    """What Triton's simple_*_sequence_*_client.py examples check, for the three sequences
    they send: int0 ([0] + VALUES), int1 ([100] - VALUES) and str0 ([20] - VALUES)."""
    exp: dict[str, list[int]] = {"int0": [], "int1": [], "str0": []}
    for i in range(len(VALUES) + 1):
        int0 = 1 if i == 0 else VALUES[i - 1]
        int1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            str0 = 20 if dyna else 21
        elif dyna:
            str0 = -VALUES[i - 1] + results["str0"][i - 1]
        else:
            str0 = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:  # the last request gets the id added
            int0 += int(ids["int0"])
            int1 += int(ids["int1"])
            str0 += int(ids["str0"])
        exp["int0"].append(int0)
        exp["int1"].append(int1)
        exp["str0"].append(str0)
    return exp


def _example_sequences(dyna: bool) -> tuple[dict[str, tuple[str, int | str, list[int]]], dict[str, int | str]]:
    ids: dict[str, int | str] = {"int0": 1000, "int1": 1001, "str0": "1002" if dyna else str(uuid.uuid4())}
    model = "simple_dyna_sequence" if dyna else "simple_sequence"
    smodel = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    seqs = {
        "int0": (model, ids["int0"], [0] + VALUES),
        "int1": (model, ids["int1"], [100] + [-v for v in VALUES]),
        "str0": (smodel, ids["str0"], [20] + [-v for v in VALUES]),
    }
    return seqs, ids


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_client_example(examples: openinfer.Server, protocol: str, dyna: bool) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = _http(examples) if protocol == "http" else _grpc(examples)
    seqs, ids = _example_sequences(dyna)
    results: dict[str, list[int]] = {}
    for key, (model, seq, values) in seqs.items():
        out = results[key] = []
        for n, v in enumerate(values):
            r = _step(client, module, model, v, seq, start=n == 0, end=n == len(values) - 1)
            out.append(int(r.as_numpy("OUTPUT")[0][0]))
    assert results == _expected(dyna, results, ids)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_stream_client_example(examples: openinfer.Server, dyna: bool) -> None:
    """simple_grpc_sequence_stream_infer_client.py: the three sequences sent on one stream
    before any answer is read; answers matched to sequences by request id."""
    seqs, ids = _example_sequences(dyna)
    answers: queue.Queue[Any] = queue.Queue()
    with _grpc(examples) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for key, (model, seq, values) in seqs.items():
            for n, v in enumerate(values):
                client.async_stream_infer(
                    model, [_int_input(grpcclient, v)], outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{key}_{n}", sequence_id=seq, sequence_start=n == 0,
                    sequence_end=n == len(values) - 1,
                )  # fmt: skip
        results: dict[str, list[int]] = {k: [] for k in seqs}
        for _ in range(sum(len(v) for _, _, v in seqs.values())):
            item = answers.get(timeout=BOUND)
            assert not isinstance(item, InferenceServerException), item
            key, n = item.get_response().id.split("_")
            assert int(n) == len(results[key])  # each sequence's answers come in order
            results[key].append(int(item.as_numpy("OUTPUT")[0][0]))
        client.stop_stream()
    assert results == _expected(dyna, results, ids)


# ---- state, interleaving, strategies ---------------------------------------------------------


def test_implicit_state_accumulates(server: openinfer.Server) -> None:
    client = _http(server)
    sums = [int(_step(client, httpclient, "acc", v, 77, start=i == 0).as_numpy("OUTPUT")[0][0])
            for i, v in enumerate([5, 3, -2, 10])]  # fmt: skip
    assert sums == [5, 8, 6, 16]
    # A START for a sequence already running starts it again, as in Triton: the state too.
    assert _step(client, httpclient, "acc", 4, 77, start=True).as_numpy("OUTPUT")[0][0] == 4
    r = _step(client, httpclient, "acc", 1, 77, end=True, outputs=[httpclient.InferRequestedOutput("SUM_OUT")])
    assert r.as_numpy("SUM_OUT")[0][0] == 5  # the state output, asked for by the client
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(client, httpclient, "acc", 1, 77)  # ended: the id is free again


def test_initial_state_from_file_and_no_batch_dimension(server: openinfer.Server) -> None:
    client = _grpc(server)
    # acc_file adds the initial state (100, from initial_state/hundred) at START.
    assert _step(client, grpcclient, "acc_file", 5, 3, start=True).as_numpy("OUTPUT")[0][0] == 105
    assert _step(client, grpcclient, "acc_file", 5, 3, end=True).as_numpy("OUTPUT")[0][0] == 110
    outs = [int(_step(client, grpcclient, "acc_nobatch", v, 9, start=i == 0, end=i == 2, shape=(1,))
                .as_numpy("OUTPUT")[0]) for i, v in enumerate([2, 3, 4])]  # fmt: skip
    assert outs == [2, 5, 9]


def _run_sequence(make: Any, module: Any, model: str, seq: int | str, values: list[int],
                  barrier: threading.Barrier) -> list[int]:  # fmt: skip
    client = make()
    out = []
    for i, v in enumerate(values):
        barrier.wait(BOUND)  # every sequence sends its i-th request at the same moment
        r = _step(client, module, model, v, seq, start=i == 0, end=i == len(values) - 1)
        out.append(int(r.as_numpy("OUTPUT")[0][0]))
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_on_many_connections(server: openinfer.Server, protocol: str) -> None:
    """Six sequences (numeric and string ids), each on its own connection, step by step in
    lockstep: each gets its own running sum."""
    module = httpclient if protocol == "http" else grpcclient
    make = partial(_http if protocol == "http" else _grpc, server)
    big = 2**64 - 1 if protocol == "http" else 2**63 - 1  # tritonclient.grpc sends an int64_param
    ids: list[int | str] = [11, 12, big, "alpha", "beta", str(uuid.uuid4())]
    values = {seq: [(k + 1) * (j + 1) for j in range(6)] for k, seq in enumerate(ids)}
    barrier = threading.Barrier(len(ids))
    results: dict[int | str, list[int]] = {}
    threads = [threading.Thread(target=lambda s=seq: results.__setitem__(
        s, _run_sequence(make, module, "acc", s, values[s], barrier))) for seq in ids]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 2)
    assert results == {seq: list(np.cumsum(values[seq])) for seq in ids}


def test_oldest_batches_requests_of_different_sequences(server: openinfer.Server) -> None:
    """acc_oldest forms batches of 4 rows: four sequences sent together are served by one call
    (BATCH = 4), each still getting its own state."""
    ids = [101, 102, 103, 104]
    answers: dict[int, list[tuple[int, int]]] = {seq: [] for seq in ids}

    def run(seq: int) -> None:
        client = _http(server)
        for i in range(3):
            r = _step(client, httpclient, "acc_oldest", seq, seq, start=i == 0, end=i == 2)
            answers[seq].append((int(r.as_numpy("OUTPUT")[0][0]), int(r.as_numpy("BATCH")[0][0])))

    threads = [threading.Thread(target=run, args=(seq,)) for seq in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert answers == {seq: [(seq, 4), (2 * seq, 4), (3 * seq, 4)] for seq in ids}
    stats = _http(server).get_inference_statistics("acc_oldest")["model_stats"][0]
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {4: 3}


def test_backlog_waits_for_a_free_slot(server: openinfer.Server) -> None:
    """acc_one_slot serves one sequence at a time: a second sequence's START waits in the
    backlog until the first one ends, then runs."""
    client = _grpc(server)
    _step(client, grpcclient, "acc_one_slot", 1, 501, start=True)
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("acc_one_slot", [_int_input(grpcclient, 40)], lambda result, error: done.put(error or result),
                       sequence_id=502, sequence_start=True)  # fmt: skip
    # While 501 holds the slot, 502 cannot have run: 501 goes on undisturbed.
    assert _step(client, grpcclient, "acc_one_slot", 2, 501).as_numpy("OUTPUT")[0][0] == 3
    assert done.empty()
    _step(client, grpcclient, "acc_one_slot", 3, 501, end=True)
    first = done.get(timeout=BOUND)
    assert first.as_numpy("OUTPUT")[0][0] == 40
    assert _step(client, grpcclient, "acc_one_slot", 2, 502, end=True).as_numpy("OUTPUT")[0][0] == 42


def test_idle_sequence_is_released(server: openinfer.Server) -> None:
    """acc_idle releases a sequence idle for 100 ms: after a pause a continuing request is
    refused as one for an unknown sequence, while a START begins afresh."""
    client = _http(server)
    assert _step(client, httpclient, "acc_idle", 6, 808, start=True).as_numpy("OUTPUT")[0][0] == 6
    time.sleep(1.0)  # ten times the idle limit: a wait, not a measurement
    with pytest.raises(InferenceServerException) as e:
        _step(client, httpclient, "acc_idle", 1, 808)
    assert e.value.status() == "400"
    assert "inference request for sequence 808 to model 'acc_idle' must specify the START flag on the first " \
           "request of the sequence" in e.value.message()  # fmt: skip
    assert _step(client, httpclient, "acc_idle", 2, 808, start=True, end=True).as_numpy("OUTPUT")[0][0] == 2


def test_control_inputs_of_every_type(server: openinfer.Server) -> None:
    """START as FP32, END as BOOL, READY as INT32 with the config's false/true values, and a
    string CORRID, on a model without a batch dimension; over HTTP binary and JSON."""
    client = _http(server)
    seen = []
    for i, binary in enumerate([True, False, True]):
        r = client.infer("controls", [_int_input(httpclient, i, (1,))], sequence_id="seq-\u00e9", sequence_start=i == 0,
                         sequence_end=i == 2,
                         outputs=[httpclient.InferRequestedOutput(n, binary_data=binary) for n in "SERC"])  # fmt: skip
        corrid = r.as_numpy("C")[0]  # tritonclient gives BYTES sent as JSON text as str
        seen.append((float(r.as_numpy("S")[0]), bool(r.as_numpy("E")[0]), int(r.as_numpy("R")[0]),
                     corrid.encode() if isinstance(corrid, str) else corrid))  # fmt: skip
    corr = "seq-\u00e9".encode()
    assert seen == [(2.5, False, 9, corr), (0.5, False, 9, corr), (0.5, True, 9, corr)]


def test_sequence_parameters_are_not_model_parameters(server: openinfer.Server) -> None:
    """The controls carry the sequence; the model's `parameters` do not show the protocol's."""
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [3]}],
            "parameters": {"sequence_id": 4242, "sequence_start": True, "sequence_end": True}}  # fmt: skip
    r = requests.post(f"{server.url}/v2/models/acc/infer", data=json.dumps(body), timeout=BOUND)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [3]


# ---- errors ----------------------------------------------------------------------------------


def _post(server: openinfer.Server, model: str, params: dict[str, Any], shape: list[int] | None = None) -> Any:
    body = {"inputs": [{"name": "INPUT", "shape": shape or [1, 1], "datatype": "INT32",
                        "data": [1] * int(np.prod(shape or [1, 1]))}], "parameters": params}  # fmt: skip
    return requests.post(f"{server.url}/v2/models/{model}/infer", data=json.dumps(body), timeout=BOUND)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": -3}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": [1]}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": 5, "sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
        ({"sequence_id": 5, "sequence_end": "yes"}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
        ({}, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 0, "sequence_start": True}, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": "", "sequence_start": True}, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 9191}, "inference request for sequence 9191 to model 'acc' must specify the START flag on the first request of the sequence"),
        ({"sequence_id": "never-started", "sequence_end": True}, "inference request for sequence never-started to model 'acc' must specify the START flag on the first request of the sequence"),
    ],
)  # fmt: skip
def test_http_errors(server: openinfer.Server, params: dict[str, Any], message: str) -> None:
    r = _post(server, "acc", params)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": message}


def test_batch_of_more_than_one_and_corrid_type(server: openinfer.Server) -> None:
    r = _post(server, "acc", {"sequence_id": 1, "sequence_start": True}, [2, 1])
    assert r.status_code == 400
    assert r.json()["error"] == ("inference request to model 'acc' must specify batch-size 1 due to requirements "
                                 "of sequence batcher")  # fmt: skip
    client = _grpc(server)
    with pytest.raises(InferenceServerException) as e:
        client.infer("controls", [_int_input(grpcclient, 1, (1,))], sequence_id=12, sequence_start=True,
                     request_id="r1")  # fmt: skip
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == ("[request id: r1] sequence batching control 'C_IN' data-type is 'UINT64', but "
                                 "model 'controls' expects 'BYTES'")  # fmt: skip


def test_sequence_id_on_a_model_without_sequence_batching_is_ignored(examples: openinfer.Server) -> None:
    """As in Triton: only a sequence model acts on the id."""
    client = _http(examples)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for t in inputs:
        t.set_data_from_numpy(a)
    r = client.infer("simple", inputs, sequence_id=5, sequence_start=False)
    assert (r.as_numpy("OUTPUT0") == 2 * a).all()


def _grpc_raw(server: openinfer.Server, params: dict[str, Any]) -> grpc.RpcError:
    req = service_pb2.ModelInferRequest(model_name="acc")
    t = req.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    for key, (kind, value) in params.items():
        setattr(req.parameters[key], kind, value)
    del t
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=BOUND)
        # The channel still serves.
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=BOUND).live
    return e.value


@pytest.mark.parametrize(
    "params, message",
    [
        ({"sequence_id": ("bool_param", True)}, "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ({"sequence_id": ("double_param", 1.0)}, "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ({"sequence_id": ("int64_param", 3), "sequence_start": ("int64_param", 1)}, "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ({"sequence_id": ("int64_param", 3), "sequence_end": ("string_param", "true")}, "invalid value type for 'sequence_end' parameter, expected bool_param."),
        ({"sequence_start": ("bool_param", True)}, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": ("string_param", "nope")}, "inference request for sequence nope to model 'acc' must specify the START flag on the first request of the sequence"),
    ],
)  # fmt: skip
def test_grpc_errors(server: openinfer.Server, params: dict[str, Any], message: str) -> None:
    e = _grpc_raw(server, params)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == message


# ---- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sequence_batching, error",
    [
        ('control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
         "sequence_batching.control_input[0] ('START'): CONTROL_SEQUENCE_START needs exactly one of int32_false_true"),
        ('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } ] },'
         ' { name: "B" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } ] } ]',
         "sequence_batching.control_input[1]: CONTROL_SEQUENCE_READY is already given by control input 'A'"),
        ('control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } ] } ]',
         "sequence_batching.control_input[0]: name 'INPUT' is already an input of the model"),
        ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
         "CONTROL_SEQUENCE_CORRID data_type must be one of TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, TYPE_STRING, got TYPE_FP32"),
        ('state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ 2 ] '
         'initial_state: { data_type: TYPE_INT32 dims: [ 2 ] data_file: "missing" } } ]',
         "sequence_batching.state[0].initial_state: cannot read data_file"),
        ('state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ 2 ] '
         'initial_state: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } } ]',
         "sequence_batching.state[0].initial_state: dims [3] do not fit the state's dims [2]"),
        ("iterative_sequence: true", "sequence_batching.iterative_sequence is not supported by openinfer (no iterative sequences)"),
    ],
)  # fmt: skip
def test_config_errors_name_the_field(tmp_path: Path, sequence_batching: str, error: str) -> None:
    config = textwrap.dedent(f'''
        name: "bad"
        backend: "python"
        max_batch_size: 4
        sequence_batching {{ {sequence_batching} }}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    ''')  # fmt: skip
    _write(tmp_path, "bad", config, ACC_MODEL)
    (loaded,) = scan_model(tmp_path / "bad")
    assert loaded.model is None and loaded.error is not None
    assert error in loaded.error


def test_config_reports_triton_defaults(server: openinfer.Server) -> None:
    cfg = _http(server).get_model_config("acc_oldest")
    sb = cfg["sequence_batching"]
    assert sb["max_sequence_idle_microseconds"] == 1000000
    assert sb["oldest"]["max_candidate_sequences"] == 4
    assert sb["control_input"][0]["control"][0]["kind"] == "CONTROL_SEQUENCE_START"
    grpc_cfg = _grpc(server).get_model_config("acc", as_json=True)["config"]
    assert grpc_cfg["sequence_batching"]["state"][0]["input_name"] == "SUM_IN"


def test_stop_answers_requests_waiting_for_a_slot(tmp_path: Path) -> None:
    """A sequence in the backlog (no slot frees before the stop) is answered 503 at stop, not
    left hanging, and stop returns."""
    _write(tmp_path, "acc_one_slot", _acc("acc_one_slot", strategy=ONE_SLOT), ACC_MODEL)
    srv = openinfer.serve(tmp_path, http_port=0, grpc_port=0, threads=1, log=False)
    try:
        client = _grpc(srv)
        _step(client, grpcclient, "acc_one_slot", 1, 1, start=True)
        done: queue.Queue[Any] = queue.Queue()
        client.async_infer("acc_one_slot", [_int_input(grpcclient, 5)], lambda result, error: done.put(error or result),
                           sequence_id=2, sequence_start=True)  # fmt: skip
        assert _step(client, grpcclient, "acc_one_slot", 1, 1).as_numpy("OUTPUT")[0][0] == 2  # 1 still runs
        assert done.empty()
    finally:
        srv.stop(timeout=0.5)
    error = done.get(timeout=BOUND)
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "StatusCode.UNAVAILABLE" and "shutting down" in error.message()


TORCH_ACC = '''
from typing import Dict

import torch


class Acc(torch.nn.Module):
    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, SUM_IN: torch.Tensor) -> Dict[str, torch.Tensor]:
        total = torch.where(START != 0, INPUT, SUM_IN + INPUT)
        return {"OUTPUT": total * 10, "SUM_OUT": total}
'''


def test_torchscript_model_with_state(tmp_path: Path) -> None:
    """A TorchScript model takes the START control and the state as forward() arguments and
    returns the state output, matched by name as the pytorch backend matches them."""
    save_torchscript(TORCH_ACC, "Acc", tmp_path / "repo" / "tacc" / "1" / "model.pt", tmp_path)
    config = _acc("tacc", strategy="oldest { max_candidate_sequences: 4 }")
    config = config.replace('backend: "python"', 'platform: "pytorch_libtorch"')
    outputs = config[config.index("output ["):config.index("instance_group")]
    config = config.replace(outputs, 'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    (tmp_path / "repo" / "tacc" / "config.pbtxt").write_text(config)
    srv = openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=0, threads=1, log=False)
    try:
        assert srv.failed == {}, srv.failed
        client = _http(srv)
        outs = {seq: [] for seq in (1, 2)}
        for i in range(3):
            for seq in outs:
                r = _step(client, httpclient, "tacc", seq * (i + 1), seq, start=i == 0, end=i == 2)
                outs[seq].append(int(r.as_numpy("OUTPUT")[0][0]))
        assert outs == {1: [10, 30, 60], 2: [20, 60, 120]}
    finally:
        srv.stop()


def test_timeout_counts_the_wait_for_a_slot(server: openinfer.Server) -> None:
    """Triton's `timeout` parameter bounds a request's wait in the backlog too: a START whose
    timeout passed while another sequence held the only slot is refused unrun."""
    client = _grpc(server)
    _step(client, grpcclient, "acc_one_slot", 1, 601, start=True)
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("acc_one_slot", [_int_input(grpcclient, 9)], lambda result, error: done.put(error or result),
                       sequence_id=602, sequence_start=True, timeout=1000)  # 1 ms  # fmt: skip
    time.sleep(0.5)  # a wait well past the timeout (and for the request to arrive), not a measurement
    assert done.empty()  # still waiting for the slot
    _step(client, grpcclient, "acc_one_slot", 1, 601, end=True)
    error = done.get(timeout=BOUND)
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "StatusCode.UNAVAILABLE" and error.message() == "Request timeout expired"
    # The sequence exists (its START arrived) but never ran: its next request is its first.
    assert _step(client, grpcclient, "acc_one_slot", 4, 602, end=True).as_numpy("OUTPUT")[0][0] == 4


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_openinfer_client_sends_sequence_parameters(server: openinfer.Server, scheme: str) -> None:
    """openinfer.Client passes Triton's sequence parameters through `parameters`."""
    url = server.url if scheme == "http" else server.grpc_url
    seq: int | str = 31 if scheme == "http" else "grpc-31"
    with openinfer.Client(url, timeout=BOUND, shared_memory=False) as c:
        sums = []
        for i, v in enumerate([4, 5, 6]):
            params = {"sequence_id": seq, "sequence_start": i == 0, "sequence_end": i == 2}
            out = c.infer("acc", {"INPUT": np.array([[v]], dtype=np.int32)}, ["OUTPUT"], parameters=params)
            sums.append(int(out["OUTPUT"][0][0]))
        assert sums == [4, 9, 15]
        with pytest.raises(openinfer.InferenceServerError, match="must specify the START flag"):
            c.infer("acc", {"INPUT": np.array([[1]], dtype=np.int32)}, parameters={"sequence_id": seq})
