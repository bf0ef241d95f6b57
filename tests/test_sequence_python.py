"""Sequence batching on models given in Python (issue 12 item 1): openinfer.Model's
`sequence_batching` takes Triton's JSON config shape, is checked by the same code as a
config.pbtxt's, and serves sequences with control inputs and implicit state through
tritonclient.http and tritonclient.grpc streaming."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer

BOUND = 30.0  # a bound for a hung test, not a measurement

SEQUENCE = {
    "oldest": {"max_candidate_sequences": 4, "max_queue_delay_microseconds": 0},
    "control_input": [
        {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
        {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
    ],
    "state": [{"input_name": "SUM_IN", "output_name": "SUM_OUT", "data_type": "TYPE_INT32", "dims": [1]}],
}


def _acc(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    total = np.where(inputs["START"] != 0, inputs["INPUT"], inputs["SUM_IN"] + inputs["INPUT"])
    return {"OUTPUT": total, "SUM_OUT": total, "CORR": inputs["CORRID"].astype(np.int64)}


def _model(name: str = "pyacc", **kw: Any) -> openinfer.Model:
    return openinfer.Model(
        name, _acc, inputs=[("INPUT", "INT32", [-1, 1])],
        outputs=[("OUTPUT", "INT32", [-1, 1]), ("CORR", "INT64", [-1, 1])],
        max_batch_size=8, **{"sequence_batching": SEQUENCE, **kw},
    )  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    srv = openinfer.serve(models=[_model()], http_port=0, grpc_port=0, threads=2, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def _input(module: Any, value: int) -> Any:
    t = module.InferInput("INPUT", [1, 1], "INT32")
    t.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return t


def test_http_sequences_keep_their_own_state(server: openinfer.Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=BOUND)
    try:
        sums: dict[int, list[int]] = {11: [], 12: []}
        for i, (a, b) in enumerate([(1, 100), (2, 200), (3, 300)]):
            for seq, v in ((11, a), (12, b)):
                r = client.infer("pyacc", [_input(httpclient, v)], sequence_id=seq, sequence_start=i == 0,
                                 sequence_end=i == 2)  # fmt: skip
                sums[seq].append(int(r.as_numpy("OUTPUT")[0][0]))
                assert int(r.as_numpy("CORR")[0][0]) == seq  # the CORRID control reached the model
        assert sums == {11: [1, 3, 6], 12: [100, 300, 600]}
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            client.infer("pyacc", [_input(httpclient, 1)], sequence_id=11)  # ended
        with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
            client.infer("pyacc", [_input(httpclient, 1)])
    finally:
        client.close()


def test_grpc_stream_sequences(server: openinfer.Server) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        values = [5, 3, -2, 10]
        for seq in (21, 22):
            for n, v in enumerate(values):
                client.async_stream_infer(
                    "pyacc", [_input(grpcclient, v * (seq - 20))], request_id=f"{seq}_{n}", sequence_id=seq,
                    sequence_start=n == 0, sequence_end=n == len(values) - 1,
                )  # fmt: skip
        got: dict[str, list[int]] = {"21": [], "22": []}
        for _ in range(2 * len(values)):
            item = answers.get(timeout=BOUND)
            assert not isinstance(item, InferenceServerException), item
            seq, n = item.get_response().id.split("_")
            assert int(n) == len(got[seq])
            got[seq].append(int(item.as_numpy("OUTPUT")[0][0]))
        client.stop_stream()
    assert got == {"21": [5, 8, 6, 16], "22": [10, 16, 12, 32]}


@pytest.mark.parametrize(
    "settings, error",
    [
        ({"oldest": {"max_candidate_sequences": -1}}, "sequence_batching.oldest.max_candidate_sequences"),
        ({"oldest": {"preferred_batch_size": [9]}}, r"sequence_batching.oldest.preferred_batch_size: 9"),
        ({"control_input": [{"name": "INPUT", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                                           "int32_false_true": [0, 1]}]}]},
         r"sequence_batching.control_input\[0\]: name 'INPUT' is already an input"),
        ({"state": [{"input_name": "S", "output_name": "T", "data_type": "TYPE_STRING"}]},
         r"sequence_batching.state\[0\] \('S'\): data_type must be a numeric type"),
        ({"state": [{"input_name": "S", "output_name": "T", "data_type": "TYPE_FP32", "dims": [1],
                     "initial_state": {"data_type": "TYPE_FP32", "dims": [1], "data_file": "x"}}]},
         r"initial_state: data_file needs a model directory"),
        ({"max_sequence_idle_microseconds": "soon"}, "sequence_batching.max_sequence_idle_microseconds"),
        ({"bogus": 1}, "sequence_batching.bogus: unknown field"),
        ({"iterative_sequence": True}, "iterative_sequence is not supported"),
    ],
)
def test_bad_settings_name_the_field(settings: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error) as info:
        _model("bad", sequence_batching=settings)
    assert "model 'bad'" in str(info.value)


def test_bad_settings_types() -> None:
    with pytest.raises(TypeError, match="sequence_batching must be a dict"):
        _model("bad", sequence_batching="oldest")
    with pytest.raises(ValueError, match="decoupled model cannot use sequence_batching"):
        openinfer.Model("bad", _acc, inputs=[("INPUT", "INT32", [1])], outputs=[("OUTPUT", "INT32", [1])],
                        decoupled=True, sequence_batching={})  # fmt: skip
    with pytest.raises(ValueError, match="dynamic_batching and sequence_batching cannot both be given"):
        _model("bad", dynamic_batching=True)


def test_config_reports_the_sequence_batching(server: openinfer.Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=BOUND)
    try:
        sb = client.get_model_config("pyacc")["sequence_batching"]
    finally:
        client.close()
    assert sb["oldest"]["max_candidate_sequences"] == 4
    assert sb["oldest"]["preferred_batch_size"] == [8]  # Triton's default: max_batch_size
    assert sb["max_sequence_idle_microseconds"] == 1000000  # as a config.pbtxt model reports it
    assert [c["name"] for c in sb["control_input"]] == ["START", "CORRID"]
    assert sb["state"][0]["input_name"] == "SUM_IN"
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as g:
        config = g.get_model_config("pyacc").config
    assert config.sequence_batching.oldest.max_candidate_sequences == 4
    assert config.sequence_batching.state[0].output_name == "SUM_OUT"
