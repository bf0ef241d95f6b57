"""Python model instances in worker processes (instance_group count > 1, Model(instances=N)):
the same answers as the in-process path for every datatype through real clients, one process
per instance, a killed worker's request failing clearly while the rest are served and a
successor starts, streaming, batching, cancellation and load errors crossing the process
boundary. Worker and test meet only through files (a worker is another process)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

import openinfer
from openinfer import Model, Request, Tensor
from openinfer.config import DynamicBatching

from conftest import NP, V2_TYPES, Cli, concurrent, wait_for, worker_children

BOUND = 30.0  # no wait here lasts longer: a bound against a hang, not a measurement


def _reverse(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A view with a negative stride: the worker has to lay it out itself."""
    return {"OUTPUT0": inputs["INPUT0"][::-1]}


def _identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _gated(inputs: dict[str, np.ndarray], parameters: dict[str, Any], request: Request) -> dict[str, np.ndarray]:
    """Notes in the directory `dir` that call `tag` started (with its pid), then, unless it
    `passes`, waits until the file `open` appears there or the request is cancelled (noted
    too); answers its pid."""
    where, tag = Path(parameters["dir"]), parameters["tag"]
    (where / f"{tag}.started").write_text(str(os.getpid()))
    end = time.monotonic() + BOUND
    while not parameters.get("passes") and not (where / "open").exists() and time.monotonic() < end:
        if request.is_cancelled():
            (where / f"{tag}.cancelled").write_text("")
            break
        time.sleep(0.002)
    return {"PID": np.array([os.getpid()], dtype=np.int64)}


def _pid(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    time.sleep(float(inputs["INPUT0"][0]) / 1000.0)
    return {"PID": np.array([os.getpid()], dtype=np.int64)}


def _raises(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise ValueError("the model refuses negative numbers")


def _client_error(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise openinfer.InferenceServerError(422, "INPUT0 must be sorted")


def _wrong_dtype(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.zeros(3, dtype=np.float64)}


def _missing_output(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {}


def _count(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Iterator[dict[str, np.ndarray]]:
    """Yields 0..INPUT0[0]-1, then raises if asked to."""
    for i in range(int(inputs["INPUT0"][0])):
        yield {"OUTPUT0": np.array([i * 10], dtype=np.int32)}
    if parameters.get("fail"):
        raise ValueError("the generator gave up after its responses")


def _axpy(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["A"] * inputs["K"][0] + inputs["B"]}


def _batch_rows(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["INPUT0"]
    return {"OUTPUT0": x * 2, "ROWS": np.full((len(x), 1), len(x), dtype=np.int32)}


def _talks(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import sys

    print(f"worker {os.getpid()} says hello on stdout")
    print(f"worker {os.getpid()} says hello on stderr", file=sys.stderr)
    return {"OUTPUT0": inputs["INPUT0"]}


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
TO_PID = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("PID", "INT64", [1])])


def typed(prefix: str, processes: bool) -> list[Model]:
    return [
        Model(f"{prefix}_{t.lower()}", _reverse, instances=2, processes=processes,
              inputs=[Tensor("INPUT0", t, [-1, -1])], outputs=[Tensor("OUTPUT0", t, [-1, -1])])
        for t in V2_TYPES
    ]


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    models = typed("proc", True) + typed("thread", False) + [
        Model("gated", _gated, instances=2, **TO_PID),
        Model("pid", _pid, instances=2, **TO_PID),
        Model("raises_p", _raises, instances=2, **ONE_INT),
        Model("raises_t", _raises, instances=2, processes=False, **ONE_INT),
        Model("client_error_p", _client_error, instances=2, **ONE_INT),
        Model("client_error_t", _client_error, instances=2, processes=False, **ONE_INT),
        Model("wrong_dtype_p", _wrong_dtype, instances=2, **ONE_INT),
        Model("wrong_dtype_t", _wrong_dtype, instances=2, processes=False, **ONE_INT),
        Model("missing_output_p", _missing_output, instances=2, **ONE_INT),
        Model("missing_output_t", _missing_output, instances=2, processes=False, **ONE_INT),
        Model("count", _count, instances=2, **ONE_INT),
        Model("big", _identity, instances=2, inputs=[Tensor("INPUT0", "FP32", [-1])],
              outputs=[Tensor("OUTPUT0", "FP32", [-1])]),
        Model("axpy", _axpy, instances=2, inputs=[Tensor(n, "FP32", [-1]) for n in "ABK"],
              outputs=[Tensor("Y", "FP32", [-1])]),
        Model("rows", _batch_rows, instances=2, max_batch_size=8,
              # A delay no test waits out: a batch goes when it is full (8 rows), not when a
              # busy machine lets the requests trickle in.
              dynamic_batching=DynamicBatching(max_queue_delay_microseconds=600_000_000),
              inputs=[Tensor("INPUT0", "INT32", [-1, 1])],
              outputs=[Tensor("OUTPUT0", "INT32", [-1, 1]), Tensor("ROWS", "INT32", [-1, 1])]),
    ]
    assert all(m.processes for m in models if not m.name.startswith("thread_") and not m.name.endswith("_t"))
    srv = openinfer.serve(models=models, http_port=0, grpc_port=0, threads=2, log=False, max_body_bytes=256 << 20)
    try:
        yield srv
    finally:
        srv.stop()


def sample(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype == "BYTES":
        flat = [b"", b"a", "\u00e9t\u00e9".encode(), b"\x00\xff", b"x" * 300, bytes(range(256))]
        return np.array(flat, dtype=np.object_).reshape(2, 3)
    if dtype == "BOOL":
        return rng.integers(0, 2, (2, 3)).astype(np.bool_)
    if dtype in ("FP16", "FP32", "FP64"):
        return np.array([[0.5, -1.25, 3.0e4], [np.inf, -0.0, 1e-3]], dtype=NP[dtype])
    info = np.iinfo(NP[dtype])
    return np.array([[info.min, info.max, 0], [1, info.max // 3, 7]], dtype=NP[dtype])


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to the bit (a NaN or -0.0 included), BYTES element by element."""
    if a.dtype == np.object_:
        return a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist()
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def pids_of(srv: openinfer.Server, model: str, n: int) -> set[int]:
    """The pids that answer `n` requests sent together, each held 150 ms so that both instances
    are needed."""
    with openinfer.Client(srv.url) as client:
        answers = concurrent(n, lambda i: client.infer(model, {"INPUT0": np.array([150], np.int32)})["PID"][0])
    return {int(p) for p in answers}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])


# -- the same answers as in-process -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [t for t in V2_TYPES if t != "BF16"])
def test_tritonclient_http_every_datatype_as_in_process(server: openinfer.Server, dtype: str) -> None:
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        for binary in (True, False):
            arr = sample(dtype)
            if dtype == "BYTES" and not binary:  # JSON carries BYTES as UTF-8 text
                arr = np.array([[b"", b"a", "\u00e9t\u00e9".encode()], [b"x" * 300, b"{}", b"\\"]], dtype=np.object_)
            answers = []
            for prefix in ("proc", "thread"):
                inp = thttp.InferInput("INPUT0", list(arr.shape), dtype)
                inp.set_data_from_numpy(arr, binary_data=binary)
                out = thttp.InferRequestedOutput("OUTPUT0", binary_data=binary)
                answers.append(client.infer(f"{prefix}_{dtype.lower()}", [inp], outputs=[out]).as_numpy("OUTPUT0"))
            want = arr[::-1]
            if dtype == "BYTES" and not binary:  # which tritonclient hands back as str
                want = np.vectorize(bytes.decode, otypes=[np.object_])(want)
            np.testing.assert_array_equal(answers[0], want)
            assert same(answers[0], answers[1])
    finally:
        client.close()


@pytest.mark.parametrize("dtype", [t for t in V2_TYPES if t != "BF16"])
def test_tritonclient_grpc_every_datatype_as_in_process(server: openinfer.Server, dtype: str) -> None:
    arr = sample(dtype)
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        answers = []
        for prefix in ("proc", "thread"):
            inp = tgrpc.InferInput("INPUT0", list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            answers.append(client.infer(f"{prefix}_{dtype.lower()}", [inp]).as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(answers[0], arr[::-1])
        assert same(answers[0], answers[1])
    finally:
        client.close()


def test_bf16_bits_cross_unchanged(server: openinfer.Server) -> None:
    bits = np.array([[0x3F80, 0xC000, 0x0000], [0x7F80, 0x3E4D, 0xFFFF]], dtype=np.uint16)
    with openinfer.Client(server.url) as client:
        got = [client.infer(f"{p}_bf16", {"INPUT0": bits}, datatypes={"INPUT0": "BF16"})["OUTPUT0"]
               for p in ("proc", "thread")]
    assert got[0].view(np.uint16).tolist() == bits[::-1].tolist()
    assert got[0].tobytes() == got[1].tobytes()


@pytest.mark.parametrize("pair", ["raises", "client_error"])
def test_model_errors_answer_as_in_process(server: openinfer.Server, pair: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [-1]}]}
    got = [requests.post(f"{server.url}/v2/models/{pair}_{k}/infer", json=body, timeout=BOUND) for k in ("p", "t")]
    assert got[0].status_code == got[1].status_code == (500 if pair == "raises" else 422)
    assert got[0].json()["error"] == got[1].json()["error"].replace(f"{pair}_t", f"{pair}_p")
    assert ("refuses negative numbers" if pair == "raises" else "INPUT0 must be sorted") in got[0].json()["error"]


@pytest.mark.parametrize("pair", ["wrong_dtype", "missing_output"])
def test_wrong_outputs_fail_as_in_process_and_the_worker_serves_on(server: openinfer.Server, pair: str) -> None:
    """What a worker's model returns is checked there, by the same code as in-process."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}
    got = [requests.post(f"{server.url}/v2/models/{pair}_{k}/infer", json=body, timeout=BOUND) for k in ("p", "t")]
    assert got[0].status_code == got[1].status_code == 500, [g.text for g in got]
    assert got[0].json()["error"] == got[1].json()["error"].replace(f"{pair}_t", f"{pair}_p")
    assert "OUTPUT0" in got[0].json()["error"]
    assert len(pids_of(server, "pid", 4)) == 2  # no worker went down with it


def test_bad_requests_are_refused_before_a_worker(server: openinfer.Server) -> None:
    """Wrong datatype and short binary data: the server's own 400s, the same as in-process."""
    wrong = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    got = [requests.post(f"{server.url}/v2/models/{p}_int32/infer", json=wrong, timeout=BOUND) for p in ("proc", "thread")]
    assert got[0].status_code == got[1].status_code == 400
    assert got[0].json()["error"] == got[1].json()["error"].replace("thread_int32", "proc_int32")
    short = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"INT32","parameters":{"binary_data_size":8}}]}'
    got = [requests.post(f"{server.url}/v2/models/{p}_int32/infer", data=short + bytes(8), timeout=BOUND,
                         headers={"Inference-Header-Content-Length": str(len(short))}) for p in ("proc", "thread")]
    assert got[0].status_code == got[1].status_code == 400
    assert got[0].json()["error"] == got[1].json()["error"].replace("thread_int32", "proc_int32")


def test_inputs_in_one_body_map_from_one_memfd(server: openinfer.Server) -> None:
    """Two large inputs of one binary HTTP body (and of one gRPC message) reach the worker
    where the transport put them, beside a small one that is copied."""
    a = np.arange(1 << 20, dtype=np.float32)
    b = np.full(1 << 20, 0.5, dtype=np.float32)
    small = np.array([3.0], dtype=np.float32)
    want = a * 3.0 + b
    for module, port in ((thttp, server.http_port), (tgrpc, server.grpc_port)):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inputs = []
            for name, arr in (("A", a), ("B", b), ("K", small)):
                inputs.append(module.InferInput(name, list(arr.shape), "FP32"))
                inputs[-1].set_data_from_numpy(arr)
            got = client.infer("axpy", inputs).as_numpy("Y")
        finally:
            client.close()
        np.testing.assert_array_equal(got, want)


def test_large_tensors_outgrow_the_ring(server: openinfer.Server) -> None:
    """Results over the ring's size travel in a memfd of their own; small ones in the ring;
    both intact, interleaved, from both workers at once."""
    big = np.arange(6 << 20, dtype=np.float32)  # 24 MiB, over the 16 MiB ring
    small = np.arange(1000, dtype=np.float32)
    with openinfer.Client(server.url) as client:
        outs = concurrent(6, lambda i: client.infer("big", {"INPUT0": big + i if i % 2 else small + i})["OUTPUT0"])
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, big + i if i % 2 else small + i)


# -- processes ----------------------------------------------------------------------------------


def test_each_instance_is_a_process_of_the_server(server: openinfer.Server) -> None:
    pids = pids_of(server, "pid", 4)
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(parent_of(p) == os.getpid() for p in pids)


def test_a_killed_worker_fails_its_request_only_and_is_replaced(server: openinfer.Server, tmp_path: Path) -> None:
    """SIGKILL to the worker that holds one request, under a bounded load on the same model:
    that request fails naming the signal, every other call succeeds, a new worker serves."""
    held: list[Any] = []
    holder = threading.Thread(target=lambda: held.append(requests.post(
        f"{server.url}/v2/models/gated/infer", timeout=BOUND,
        json={"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0]}],
              "parameters": {"dir": str(tmp_path), "tag": "victim"}})))
    holder.start()
    wait_for(lambda: (tmp_path / "victim.started").exists(), "holding the gated model")
    victim = int((tmp_path / "victim.started").read_text())
    answers: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def load(i: int) -> None:
        try:
            with openinfer.Client(server.url) as client:
                while not stop.is_set():
                    out = client.infer("gated", {"INPUT0": np.array([i], np.int32)},
                                       parameters={"dir": str(tmp_path), "tag": f"load{i}", "passes": True})
                    answers.append(int(out["PID"][0]))
        except BaseException as e:  # reported below
            failures.append(e)

    loaders = [threading.Thread(target=load, args=(i,)) for i in range(3)]
    for t in loaders:
        t.start()
    try:
        wait_for(lambda: len(answers) >= 20, "answering the load")
        sibling = set(answers)
        assert victim not in sibling and len(sibling) == 1
        os.kill(victim, signal.SIGKILL)
        holder.join(BOUND)
        wait_for(lambda: set(answers) - sibling, "served by a new worker")
    finally:
        stop.set()
        for t in loaders:
            t.join(BOUND)
    assert not failures, failures
    assert held and held[0].status_code == 500, held
    error = held[0].json()["error"]
    assert error == (f"model 'gated': its worker process (pid {victim}) was killed by signal 9 (Killed) "
                     "while serving the request"), error
    assert not alive(victim)
    successor = set(answers) - sibling - {victim}
    assert len(successor) == 1 and parent_of(successor.pop()) == os.getpid()


# -- streaming, batching, cancellation ----------------------------------------------------------


def _stream_count(server: openinfer.Server, n: int, **parameters: Any) -> list[Any]:
    import queue

    results: queue.Queue[Any] = queue.Queue()
    with tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: results.put(error if error is not None else result))
        inp = tgrpc.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([n], dtype=np.int32))
        client.async_stream_infer("count", [inp], request_id="c", parameters=parameters or None,
                                  enable_empty_final_response=True)
        got = [results.get(timeout=BOUND)]
        while not isinstance(got[-1], Exception) and not got[-1].get_response().parameters[
                "triton_final_response"].bool_param:
            got.append(results.get(timeout=BOUND))
        client.stop_stream()
    return got


def test_a_generator_in_a_worker_streams_each_response(server: openinfer.Server) -> None:
    got = _stream_count(server, 5)
    assert [g.as_numpy("OUTPUT0").tolist() for g in got[:5]] == [[0], [10], [20], [30], [40]]
    assert len(got) == 6 and not got[5].get_response().outputs  # the empty final response


def test_a_generator_in_a_worker_that_raises_sends_its_responses_then_the_error(server: openinfer.Server) -> None:
    got = _stream_count(server, 2, fail=True)
    assert [g.as_numpy("OUTPUT0").tolist() for g in got[:2]] == [[0], [10]]
    assert isinstance(got[2], Exception), got
    assert "ValueError: the generator gave up after its responses" in got[2].message()


def test_the_dynamic_batcher_feeds_the_pool(server: openinfer.Server) -> None:
    with openinfer.Client(server.url) as client:
        outs = concurrent(16, lambda i: client.infer("rows", {"INPUT0": np.array([[i]], np.int32)}))
    assert [int(o["OUTPUT0"][0, 0]) for o in outs] == [2 * i for i in range(16)]
    assert [int(o["ROWS"][0, 0]) for o in outs] == [8] * 16, "16 requests are two full batches"


def test_a_worker_sees_its_client_leave(server: openinfer.Server, tmp_path: Path) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = tgrpc.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    failed: list[Exception] = []

    def call() -> None:
        try:
            client.infer("gated", [inp], parameters={"dir": str(tmp_path), "tag": "leaves"}, client_timeout=0.5)
        except Exception as e:  # the deadline, expected
            failed.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: (tmp_path / "leaves.cancelled").exists(), "seen as cancelled in the worker")
    caller.join(BOUND)
    client.close()
    assert failed and "DEADLINE_EXCEEDED" in str(failed[0])


# -- life cycle ---------------------------------------------------------------------------------


def test_worker_output_reaches_the_server_log_and_stop_ends_every_worker(capfd: pytest.CaptureFixture[str]) -> None:
    before = worker_children()
    srv = openinfer.serve(models=[Model("talks", _talks, instances=2, **ONE_INT)], http_port=0, log=False)
    try:
        with openinfer.Client(srv.url) as client:
            assert client.infer("talks", {"INPUT0": np.array([3], np.int32)})["OUTPUT0"].tolist() == [3]
        workers = worker_children() - before
        assert len(workers) == 2
    finally:
        srv.stop()
    assert not any(alive(p) for p in workers)  # stop() has ended and reaped them
    out, err = capfd.readouterr()
    assert "says hello on stdout" in out and "says hello on stderr" in err


def _closure_model() -> Model:
    factor = 3

    def times(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": inputs["INPUT0"] * factor}

    return Model("closure", times, instances=2, **ONE_INT)


def test_functions_a_worker_cannot_import_stay_in_process() -> None:
    model = _closure_model()
    assert model.processes is False  # the default falls back, as in a notebook
    with pytest.raises(ValueError, match=r"processes=True needs a function that a worker process can import, "
                                         r"but _closure_model.<locals>.times is a lambda or is defined inside a function"):
        Model("closure", model.fn, instances=2, processes=True, **ONE_INT)
    with pytest.raises(ValueError, match="is a lambda"):
        Model("lam", lambda inputs: inputs, instances=2, processes=True, **ONE_INT)
    assert Model("one", _identity, **ONE_INT).processes is False
    assert Model("two", _identity, instances=2, **ONE_INT).processes is True
    assert Model("off", _identity, instances=2, processes=False, **ONE_INT).processes is False


def _write_model(repo: Path, name: str, config: str, body: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(body) or textwrap.dedent("""\
        import os
        import numpy as np

        def infer(inputs):
            return {"PID": np.array([os.getpid()], dtype=np.int64)}
        """))


PID_CONFIG = """\
    backend: "python"
    input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }]
    output [{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }]
    """


def test_repository_instance_groups_choose_processes_or_threads(tmp_path: Path) -> None:
    _write_model(tmp_path, "cpu2", PID_CONFIG + 'instance_group [{ count: 2 kind: KIND_CPU }]\n')
    _write_model(tmp_path, "model2", PID_CONFIG + 'instance_group [{ count: 2 kind: KIND_MODEL }]\n')
    _write_model(tmp_path, "one", PID_CONFIG)
    _write_model(tmp_path, "broken_in_workers", PID_CONFIG + 'instance_group [{ count: 2 }]\n', """\
        import __main__
        import numpy as np

        if getattr(__main__.__spec__, "name", "") == "openinfer._worker":
            raise RuntimeError("this model needs a device the workers lack")

        def infer(inputs):
            return {"PID": np.array([0], dtype=np.int64)}
        """)
    srv = openinfer.serve(tmp_path, http_port=0, log=False)
    try:
        with openinfer.Client(srv.url) as client:
            pid = {m: int(client.infer(m, {"INPUT0": np.array([1], np.int32)})["PID"][0]) for m in ("cpu2", "model2", "one")}
        assert pid["cpu2"] != os.getpid() and parent_of(pid["cpu2"]) == os.getpid()
        assert pid["model2"] == pid["one"] == os.getpid()
        index = {m["name"]: m for m in requests.post(f"{srv.url}/v2/repository/index", timeout=BOUND).json()}
        broken = index["broken_in_workers"]
        assert broken["state"] == "UNAVAILABLE", broken
        assert broken["reason"].startswith("a worker process could not import the model: "), broken
        assert "model.py:5: RuntimeError: this model needs a device the workers lack" in broken["reason"], broken
        assert index["cpu2"]["state"] == "READY"
    finally:
        srv.stop()


IDENTITY_FP32 = """\
    backend: "python"
    input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
    output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
    instance_group [{ count: 2 kind: KIND_CPU }]
    """


def rss_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":")))


def test_large_tensors_cross_without_copies(tmp_path: Path) -> None:
    """Two clients at once send 32 MiB over binary HTTP and get it back from a two-worker
    model: the server's peak RSS grows by the tensors in flight (each request's input and
    output: 128 MiB) plus a small constant. Measured here: about +120 MiB; copying each input
    into the worker's job area instead made it about +185 MiB."""
    _write_model(tmp_path, "big", IDENTITY_FP32, """\
        def infer(inputs):
            return {"OUTPUT0": inputs["INPUT0"]}
        """)
    cli = Cli(str(tmp_path))
    try:
        pid = cli.proc.pid
        tensor = np.arange(8 << 20, dtype=np.float32)  # 32 MiB
        clients, rounds = 2, 3

        def send(size: int) -> bool:
            client = thttp.InferenceServerClient(f"127.0.0.1:{cli.port}")
            try:
                for _ in range(rounds):
                    inp = thttp.InferInput("INPUT0", [size], "FP32")
                    inp.set_data_from_numpy(tensor[:size])
                    out = thttp.InferRequestedOutput("OUTPUT0", binary_data=True)
                    if not np.array_equal(client.infer("big", [inp], outputs=[out]).as_numpy("OUTPUT0"), tensor[:size]):
                        return False
                return True
            finally:
                client.close()

        assert all(concurrent(4, lambda i: send(10)))  # both workers up, small requests only
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from here
        base = rss_kib(pid, "VmRSS")
        assert all(concurrent(clients, lambda i: send(tensor.size)))
        growth_mib = (rss_kib(pid, "VmHWM") - base) / 1024
        in_flight_mib = clients * 2 * tensor.nbytes / (1 << 20)
        assert growth_mib < in_flight_mib + 16, f"server RSS grew {growth_mib:.0f} MiB for {in_flight_mib:.0f} MiB in flight"
    finally:
        cli.kill()
