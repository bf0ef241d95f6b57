"""Triton's Direct sequence-batching strategy (issue 12): each sequence keeps one batch row of
one model instance for its whole life, rows without a ready request are padding (zeros, READY
false, CORRID 0) and `minimum_slot_utilization` holds a batch back up to
`max_queue_delay_microseconds`. Shown with models that keep their own per-row state (no CORRID
lookup, no implicit state), which only works when the row and the instance stay fixed: Python
models keyed by (executor thread, row) and a TorchScript module holding a buffer per row, one
module per instance. All through tritonclient."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import save_torchscript
from conftest import triton_grpc as _grpc
from conftest import triton_http as _http

BOUND = 30.0  # no wait here lasts longer: a bound for a hung test, not a measurement

# Keeps a running sum per (instance, row): the instance is the executor thread, which is what
# a Python model instance is in-process. Padding rows (READY false) must leave theirs alone.
ROW_MODEL = """
import threading

import numpy as np

_sums = {}


def infer(inputs):
    x, start = inputs["INPUT"], inputs["START"][:, 0] != 0
    ready, corrid = inputs["READY"][:, 0] != 0, inputs["CORRID"][:, 0]
    me, rows = threading.get_ident(), x.shape[0]
    out = np.zeros((rows, 1), np.int32)
    for r in range(rows):
        if ready[r]:
            value = int(x[r].sum())
            _sums[me, r] = value if start[r] else _sums.get((me, r), 0) + value
            out[r, 0] = _sums[me, r]
    pad = ~ready
    carried = np.count_nonzero(x[pad]) + np.count_nonzero(start[pad]) + np.count_nonzero(corrid[pad])
    return {
        "OUTPUT": out,
        "ROW": np.arange(rows, dtype=np.int32).reshape(rows, 1),
        "INSTANCE": np.full((rows, 1), me, dtype=np.uint64),
        "BATCH": np.full((rows, 1), rows, dtype=np.int32),
        "PADDED": np.full((rows, 1), int(pad.sum()), dtype=np.int32),
        "PAD_CARRIED": np.full((rows, 1), int(carried), dtype=np.int32),
    }
"""

ROW_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {rows}
sequence_batching {{
  {direct}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "ROW" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "INSTANCE" data_type: TYPE_UINT64 dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PADDED" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PAD_CARRIED" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""

UTIL_DELAY_US = 1_000_000


def _write(repo: Path, name: str, *, rows: int, instances: int, direct: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(ROW_CONFIG.format(name=name, rows=rows, instances=instances,
                                                                direct=direct))  # fmt: skip
    (repo / name / "1" / "model.py").write_text(ROW_MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("directrepo")
    _write(repo, "rows2x2", rows=2, instances=2)  # no strategy named: Direct, as in Triton
    _write(repo, "rows4", rows=4, instances=1, direct="direct { }")
    _write(repo, "util", rows=4, instances=1, direct=(
        f"direct {{ max_queue_delay_microseconds: {UTIL_DELAY_US} minimum_slot_utilization: 0.75 }} "
        "max_sequence_idle_microseconds: 60000000"))  # fmt: skip
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    try:
        assert srv.failed == {}, srv.failed
        yield srv
    finally:
        srv.stop()


def _input(module: Any, values: list[int]) -> Any:
    data = np.array([values], dtype=np.int32)
    t = module.InferInput("INPUT", list(data.shape), "INT32")
    t.set_data_from_numpy(data)
    return t


def _answer(result: Any) -> dict[str, int]:
    return {name: int(result.as_numpy(name)[0][0])
            for name in ("OUTPUT", "ROW", "INSTANCE", "BATCH", "PADDED", "PAD_CARRIED")}  # fmt: skip


def _step(client: Any, module: Any, model: str, values: list[int], seq: int, *, start: bool = False,
          end: bool = False) -> dict[str, int]:  # fmt: skip
    return _answer(client.infer(model, [_input(module, values)], sequence_id=seq, sequence_start=start,
                                sequence_end=end))  # fmt: skip


def _lockstep(values: dict[int, list[int]], make_client: Callable[[], Any],
              send: Callable[[Any, int, int, int], Any]) -> dict[int, list[Any]]:  # fmt: skip
    """Runs each sequence of `values` on a thread and client of its own, every sequence
    sending its i-th request at the same moment: send(client, seq, i, value) -> its answer."""
    barrier = threading.Barrier(len(values))
    answers: dict[int, list[Any]] = {}

    def run(seq: int) -> None:
        client = make_client()
        out = []
        for i, v in enumerate(values[seq]):
            barrier.wait(BOUND)
            out.append(send(client, seq, i, v))
        answers[seq] = out

    threads = [threading.Thread(target=run, args=(seq,)) for seq in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 2)
    assert sorted(answers) == sorted(values), "a sequence's thread failed"
    return answers


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_sequence_keeps_its_row_and_instance(server: openinfer.Server, protocol: str) -> None:
    """Four sequences in lockstep on 2 instances x 2 rows: each keeps one (instance, row) from
    START to END, the four fill every slot, and each gets its own running sum from the model's
    per-row state. Rows in arrival order or a free choice of instance would mix the sums."""
    module = httpclient if protocol == "http" else grpcclient
    ids = [11, 12, 13, 14] if protocol == "http" else [21, 22, 23, 24]
    values = {seq: [(k + 1) * (j + 3) for j in range(6)] for k, seq in enumerate(ids)}
    answers = _lockstep(
        values,
        lambda: _http(server) if protocol == "http" else _grpc(server),
        lambda client, seq, i, v: _step(client, module, "rows2x2", [v], seq, start=i == 0, end=i == len(values[seq]) - 1),
    )
    assert {seq: [a["OUTPUT"] for a in answers[seq]] for seq in ids} == {
        seq: [int(x) for x in np.cumsum(values[seq])] for seq in ids
    }
    places = {seq: {(a["INSTANCE"], a["ROW"]) for a in answers[seq]} for seq in ids}
    assert all(len(p) == 1 for p in places.values()), places
    slots = {next(iter(p)) for p in places.values()}
    assert len(slots) == 4 and {row for _, row in slots} == {0, 1} and len({inst for inst, _ in slots}) == 2
    assert all(a["PAD_CARRIED"] == 0 for seq in ids for a in answers[seq])


def test_rows_without_a_request_are_padding(server: openinfer.Server) -> None:
    """One instance, 4 rows, one request at a time: a batch runs rows 0 up to the row of the
    sequence with a request, the others padding with zeros, START false, READY false and CORRID
    0, whose outputs nobody gets; a slot freed by END goes to the next sequence."""
    client = _http(server)
    a, b, c, d = 301, 302, 303, 304
    assert _pick(_step(client, httpclient, "rows4", [1], a, start=True)) == (1, 0, 1, 0)
    assert _pick(_step(client, httpclient, "rows4", [2, 3], b, start=True)) == (5, 1, 2, 1)
    assert _pick(_step(client, httpclient, "rows4", [4], c, start=True)) == (4, 2, 3, 2)
    assert _pick(_step(client, httpclient, "rows4", [10], a)) == (11, 0, 1, 0)
    assert _pick(_step(client, httpclient, "rows4", [5, 5, 5], c)) == (19, 2, 3, 2)
    assert _pick(_step(client, httpclient, "rows4", [1], a, end=True)) == (12, 0, 1, 0)
    # a's row 0 is free again: the next sequence takes it (the lowest free row).
    assert _pick(_step(client, httpclient, "rows4", [7], d, start=True, end=True)) == (7, 0, 1, 0)
    assert _pick(_step(client, httpclient, "rows4", [1], b, end=True)) == (6, 1, 2, 1)
    assert _pick(_step(client, httpclient, "rows4", [1], c, end=True)) == (20, 2, 3, 2)
    # Padding rows are not inferences: the statistics count the 9 requests only.
    stats = client.get_inference_statistics("rows4")["model_stats"][0]
    assert stats["inference_count"] == 9 and stats["execution_count"] == 9


def _pick(answer: dict[str, int]) -> tuple[int, int, int, int]:
    assert answer["PAD_CARRIED"] == 0, answer
    return answer["OUTPUT"], answer["ROW"], answer["BATCH"], answer["PADDED"]


def _async_steps(client: grpcclient.InferenceServerClient, steps: list[tuple[int, list[int], bool]],
                 ) -> list[Any]:  # fmt: skip
    """Sends (sequence, values, start) requests at once; returns their results in order."""
    done: list[queue.Queue[Any]] = [queue.Queue() for _ in steps]
    for (seq, values, start), q in zip(steps, done):
        client.async_infer("util", [_input(grpcclient, values)], lambda result, error, q=q: q.put(error or result),
                           sequence_id=seq, sequence_start=start)  # fmt: skip
    results = [q.get(timeout=BOUND) for q in done]
    for r in results:
        if isinstance(r, InferenceServerException):
            raise r
    return results


def test_minimum_slot_utilization_holds_a_batch_back(server: openinfer.Server) -> None:
    """`util` wants 3 of its 4 rows ready (0.75) and waits at most 1 s for them: three
    sequences starting together run as one batch, a request that arrives alone waits for the
    others to join it, and a lone request still runs once the delay is out."""
    client = _grpc(server)
    ids = [401, 402, 403]
    started = [_answer(r) for r in _async_steps(client, [(seq, [seq], True) for seq in ids])]
    assert sorted(a["OUTPUT"] for a in started) == ids
    assert {(a["BATCH"], a["PADDED"]) for a in started} == {(3, 0)}
    row = {seq: a["ROW"] for seq, a in zip(ids, started)}
    assert sorted(row.values()) == [0, 1, 2]
    # 401's request is in the server (the liveness call after it on the same connection has been
    # answered) before 402's and 403's are sent: held back, it runs in their batch.
    first: queue.Queue[Any] = queue.Queue()
    client.async_infer("util", [_input(grpcclient, [1])], lambda result, error: first.put(error or result),
                       sequence_id=401)  # fmt: skip
    assert client.is_server_live()
    joined = [_answer(r) for r in _async_steps(client, [(402, [2], False), (403, [3], False)])]
    held = first.get(timeout=BOUND)
    assert not isinstance(held, InferenceServerException), held
    assert [a["OUTPUT"] for a in [_answer(held), *joined]] == [402, 404, 406]
    assert {(a["BATCH"], a["PADDED"]) for a in [_answer(held), *joined]} == {(3, 0)}
    # Alone, with nobody to join it, a request runs when the delay is out.
    lone = _answer(client.infer("util", [_input(grpcclient, [1])], sequence_id=401))
    assert (lone["OUTPUT"], lone["ROW"], lone["BATCH"], lone["PADDED"]) == (403, row[401], row[401] + 1, row[401])
    # Requests that cannot share a batch (other shapes) get a batch each, padded in between.
    values = {401: [1, 1], 402: [2, 2, 2], 403: [3]}
    again = [_answer(r) for r in _async_steps(client, [(seq, values[seq], False) for seq in ids])]
    assert [a["OUTPUT"] for a in again] == [403 + 2, 404 + 6, 406 + 3]
    assert all(a["PAD_CARRIED"] == 0 for a in again)
    assert max(a["PADDED"] for a in again) >= 1  # some row was padded for a mismatched one


STRINGS_MODEL = """
import numpy as np


def infer(inputs):
    ready = inputs["READY"][:, 0]
    text, corrid, start = inputs["TEXT"][:, 0], inputs["CORRID"][:, 0], inputs["START"][:, 0]
    pads = [(text[r], corrid[r], bool(start[r]), float(ready[r])) for r in range(len(ready)) if ready[r] != 1.0]
    seen = np.array([[repr(pads).encode()]] * len(ready), dtype=np.object_)
    return {"LENGTH": np.array([[len(t)] for t in text], dtype=np.int32), "PADS": seen}
"""

STRINGS_CONFIG = """
name: "strings"
backend: "python"
max_batch_size: 2
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ -1.5, 1.0 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LENGTH" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "PADS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_padding_rows_of_strings_and_other_control_types(tmp_path: Path) -> None:
    """A padding row of a BYTES input holds empty strings, a string CORRID is empty, and the
    flags take the config's false values in their own datatypes (BOOL START false, FP32 READY
    -1.5), over HTTP JSON."""
    (tmp_path / "strings" / "1").mkdir(parents=True)
    (tmp_path / "strings" / "config.pbtxt").write_text(STRINGS_CONFIG)
    (tmp_path / "strings" / "1" / "model.py").write_text(STRINGS_MODEL)
    srv = openinfer.serve(tmp_path, http_port=0, grpc_port=0, log=False)
    try:
        assert srv.failed == {}, srv.failed
        client = _http(srv)

        def send(seq: str, text: bytes, start: bool) -> tuple[int, str]:
            t = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            t.set_data_from_numpy(np.array([[text]], dtype=np.object_), binary_data=False)
            r = client.infer("strings", [t], sequence_id=seq, sequence_start=start)
            pads = r.as_numpy("PADS")[0][0]
            return int(r.as_numpy("LENGTH")[0][0]), pads.decode() if isinstance(pads, bytes) else pads

        assert send("first", b"abc", True) == (3, "[]")  # row 0
        # The second sequence takes row 1; row 0 (nothing ready) is padding.
        assert send("second", b"hello", True) == (5, "[(b'', b'', False, -1.5)]")
        assert send("second", b"hi", False) == (2, "[(b'', b'', False, -1.5)]")
    finally:
        srv.stop()


TORCH_ROWS = """
from typing import Dict

import torch


class RowSums(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("sums", torch.zeros(2, dtype=torch.int32))

    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, READY: torch.Tensor) -> Dict[str, torch.Tensor]:
        rows = INPUT.shape[0]
        before = self.sums[:rows]
        x = INPUT[:, 0]
        after = torch.where(START[:, 0] != 0, x, before + x)
        after = torch.where(READY[:, 0] != 0, after, before)
        self.sums[:rows] = after
        return {"OUTPUT": after.unsqueeze(1)}
"""

TORCH_CONFIG = """
name: "trows"
platform: "pytorch_libtorch"
max_batch_size: 2
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def test_torchscript_instances_keep_their_rows(tmp_path: Path) -> None:
    """A TorchScript module keeping a running sum per batch row in a buffer, two instances
    (two modules): four sequences in lockstep each get their own sums, so each sequence stayed
    on one row of one module."""
    save_torchscript(TORCH_ROWS, "RowSums", tmp_path / "repo" / "trows" / "1" / "model.pt", tmp_path)
    (tmp_path / "repo" / "trows" / "config.pbtxt").write_text(TORCH_CONFIG)
    srv = openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=0, threads=2, log=False)
    try:
        assert srv.failed == {}, srv.failed
        values = {seq: [(k + 1) * (j + 1) for j in range(5)] for k, seq in enumerate([51, 52, 53, 54])}

        def send(client: Any, seq: int, i: int, v: int) -> int:
            r = client.infer("trows", [_input(grpcclient, [v])], sequence_id=seq, sequence_start=i == 0,
                             sequence_end=i == len(values[seq]) - 1)  # fmt: skip
            return int(r.as_numpy("OUTPUT")[0][0])

        sums = _lockstep(values, lambda: _grpc(srv), send)
        assert sums == {seq: [int(x) for x in np.cumsum(v)] for seq, v in values.items()}
    finally:
        srv.stop()


def test_minimum_slot_utilization_out_of_range_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "bad", rows=2, instances=1, direct="direct { minimum_slot_utilization: 1.5 }")
    srv = openinfer.serve(tmp_path, http_port=0, log=False)
    try:
        assert ("config.pbtxt: sequence_batching.direct.minimum_slot_utilization: sequence batching minimum slot "
                "utilization must be in range (0.0, 1.0] for bad, got 1.5") in srv.failed["bad"][1]  # fmt: skip
    finally:
        srv.stop()
