"""Decoupled models (Triton's model_transaction_policy { decoupled: true }): a Python generator
yields 0..N responses per request, delivered one by one over gRPC ModelStreamInfer with
Triton's triton_final_response flag; the unary endpoints answer as Triton does; a generator
that raises, a stream reset and a slow reader, as the model itself observes them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import Model, Tensor

from conftest import Observed

BOUND = 30.0  # every wait in this file ends by then


ticks = Observed()
halfway = Observed()
sleeper = Observed()
flood = Observed()


def _flood(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """64 KiB responses as fast as it may, up to 20000 (1.25 GiB)."""
    block = np.zeros(16384, dtype=np.int32)
    try:
        for i in range(20_000):
            flood.note(produced=i + 1)
            yield {"OUTPUT0": block}
        flood.note(finished=True)
    except GeneratorExit:
        flood.note(closed=True)
        raise


def _ticker(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """Yields a small response every 5 ms until closed (or 100000 of them)."""
    try:
        for i in range(100_000):
            ticks.note(produced=i + 1)
            yield {"OUTPUT0": np.array([i], dtype=np.int32)}
            ticks.gate.wait(0.005)
        ticks.note(finished=True)
    except GeneratorExit:
        ticks.note(closed=True)
        raise


def _halfway(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    for i in range(2):
        halfway.note(produced=i + 1)
        yield {"OUTPUT0": np.array([i], dtype=np.int32)}
    raise ValueError("the model gave up half way")


async def _async_counter(inputs: dict[str, np.ndarray]) -> Any:
    for i in range(int(inputs["INPUT0"][0])):
        yield {"OUTPUT0": np.array([i * 10], dtype=np.int32)}


async def _async_sleeper(inputs: dict[str, np.ndarray]) -> Any:
    import asyncio

    try:
        sleeper.note(produced=1)
        yield {"OUTPUT0": np.array([1], dtype=np.int32)}
        await asyncio.sleep(60)  # far past the test's bound: only a cancellation ends it early
        sleeper.note(produced=2, finished=True)
        yield {"OUTPUT0": np.array([2], dtype=np.int32)}
    except (GeneratorExit, asyncio.CancelledError):
        sleeper.note(closed=True)
        raise


def _wrong_output(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    yield {"OUTPUT0": np.array([1], dtype=np.int32)}
    yield {"OUTPUT0": np.array([1.5], dtype=np.float64)}


ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])


def decoupled_models() -> list[Model]:
    return [
        Model("ticker", _ticker, **ONE_INT),
        Model("halfway", _halfway, **ONE_INT),
        Model("async_counter", _async_counter, **ONE_INT),
        Model("async_sleeper", _async_sleeper, **ONE_INT),
        Model("flood", _flood, **ONE_INT),
        Model("wrong_output", _wrong_output, **ONE_INT),
        Model("plain", lambda inputs: {"OUTPUT0": inputs["INPUT0"]}, **ONE_INT),
        Model("listed", lambda inputs: [{"OUTPUT0": np.array([i], dtype=np.int32)} for i in range(inputs["INPUT0"][0])],
              decoupled=True, **ONE_INT),
        Model("one_dict", lambda inputs: {"OUTPUT0": inputs["INPUT0"] * 2}, decoupled=True, **ONE_INT),
    ]


@pytest.fixture(scope="module")
def served() -> Iterator[openinfer.Server]:
    srv = openinfer.serve(openinfer.examples_path(), models=decoupled_models(), http_port=0, log=False, threads=2)
    try:
        yield srv
    finally:
        ticks.gate.set()
        srv.stop()


def _repeat_inputs(grpcclient: Any, values: list[int], delays: list[int]) -> list[Any]:
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([5], dtype=np.uint32))
    return inputs


def _stream(served: openinfer.Server) -> tuple[Any, Any, queue.Queue[Any]]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{served.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put(error if error is not None else result))
    return grpcclient, client, results


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


# ---- tritonclient's streaming example against repeat_int32 --------------------------------------


@pytest.mark.parametrize("empty_final", [False, True])
def test_repeat_int32_streams_each_response_in_order(served: openinfer.Server, empty_final: bool) -> None:
    """Triton's repeat_client.py flow: N responses in order, each flagged not final, then
    (when asked for) an empty response flagged final."""
    grpcclient, client, results = _stream(served)
    values = [4, 2, 0, 1]
    with client:
        client.async_stream_infer("repeat_int32", _repeat_inputs(grpcclient, values, [1, 2, 3, 4]), request_id="0",
                                  outputs=[grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")],
                                  enable_empty_final_response=empty_final)
        got = [results.get(timeout=BOUND) for _ in range(len(values) + empty_final)]
        client.stop_stream()
    for i, value in enumerate(values):
        assert not isinstance(got[i], Exception), got[i]
        assert got[i].get_response().id == "0"
        assert got[i].as_numpy("OUT").tolist() == [value]
        assert got[i].as_numpy("IDX").tolist() == [i]
        assert not _final(got[i])
    if empty_final:
        last = got[-1].get_response()
        assert last.id == "0" and last.model_name == "repeat_int32" and not last.outputs
        assert _final(got[-1])
    assert results.empty()


def test_repeat_int32_empty_input_gives_no_response_but_the_final_one(served: openinfer.Server) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        client.async_stream_infer("repeat_int32", _repeat_inputs(grpcclient, [], []), request_id="e",
                                  enable_empty_final_response=True)
        only = results.get(timeout=BOUND)
        client.stop_stream()
    assert _final(only) and only.get_response().id == "e" and not only.get_response().outputs
    assert results.empty()


def test_non_decoupled_stream_responses_are_flagged_final(served: openinfer.Server) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        inp = grpcclient.InferInput("INPUT0", [2], "INT32")
        inp.set_data_from_numpy(np.array([7, 8], dtype=np.int32))
        client.async_stream_infer("plain", [inp])
        result = results.get(timeout=BOUND)
        client.stop_stream()
    assert result.as_numpy("OUTPUT0").tolist() == [7, 8]
    assert _final(result)


def test_empty_final_response_parameter_must_be_bool(served: openinfer.Server, grpc_stubs: Any) -> None:
    import grpc

    pb = grpc_stubs.pb
    req = pb.ModelInferRequest(model_name="repeat_int32", id="p")
    req.parameters["triton_enable_empty_final_response"].string_param = "yes"
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        (answer,) = list(stub.ModelStreamInfer(iter([req]), timeout=BOUND))
    assert answer.error_message == (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param.")


# ---- unary calls ------------------------------------------------------------------------------


def test_unary_grpc_infer_on_a_decoupled_model_is_unimplemented(served: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(url=f"127.0.0.1:{served.grpc_port}") as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("repeat_int32", _repeat_inputs(grpcclient, [1], [0]))
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    assert err.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_unary_http_infer_on_a_decoupled_model_is_501(served: openinfer.Server) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    import gc

    answer = None
    with httpclient.InferenceServerClient(url=f"127.0.0.1:{served.http_port}") as client:
        inputs = [httpclient.InferInput("INPUT0", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([3], dtype=np.int32))
        try:
            client.infer("ticker", inputs)
        except InferenceServerException as e:
            answer = (e.status(), e.message())
    # The gevent-based client sits in reference cycles: collected here, on this thread, rather
    # than by a collection that happens to run on a model's thread, which gevent refuses.
    del client, inputs
    gc.collect()
    assert answer == ("501", "HTTP end point doesn't support models with decoupled transaction policy")
    assert ticks.produced == 0  # the model never ran


# ---- failures half way, cancellation ---------------------------------------------------------


def test_a_generator_that_raises_half_way_sends_what_it_made_then_the_error(served: openinfer.Server) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.async_stream_infer("halfway", [inp], request_id="h")
        got = [results.get(timeout=BOUND) for _ in range(3)]
        client.stop_stream()
    assert [g.as_numpy("OUTPUT0").tolist() for g in got[:2]] == [[0], [1]]
    assert isinstance(got[2], Exception)
    assert "the model gave up half way" in got[2].message() and "ValueError" in got[2].message()
    assert halfway.produced == 2


def test_a_wrong_response_stops_the_generator_with_an_error(served: openinfer.Server) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.async_stream_infer("wrong_output", [inp])
        got = [results.get(timeout=BOUND) for _ in range(2)]
        client.stop_stream()
    assert got[0].as_numpy("OUTPUT0").tolist() == [1]
    assert isinstance(got[1], Exception) and "OUTPUT0" in got[1].message() and "INT32" in got[1].message()


def test_async_generator_models_stream_too(served: openinfer.Server) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("async_counter", [inp], enable_empty_final_response=True)
        got = [results.get(timeout=BOUND) for _ in range(4)]
        client.stop_stream()
    assert [g.as_numpy("OUTPUT0").tolist() for g in got[:3]] == [[0], [10], [20]]
    assert _final(got[3])


@pytest.mark.parametrize("model, n, expected", [("listed", 3, [[0], [1], [2]]), ("listed", 0, []),
                                                ("one_dict", 4, [[8]])])
def test_decoupled_models_may_return_a_list_or_one_dict(served: openinfer.Server, model: str, n: int,
                                                        expected: list[list[int]]) -> None:
    grpcclient, client, results = _stream(served)
    with client:
        inp = grpcclient.InferInput("INPUT0", [1], "INT32")
        inp.set_data_from_numpy(np.array([n], dtype=np.int32))
        client.async_stream_infer(model, [inp], enable_empty_final_response=True)
        got = [results.get(timeout=BOUND) for _ in range(len(expected) + 1)]
        client.stop_stream()
    assert [g.as_numpy("OUTPUT0").tolist() for g in got[:-1]] == expected
    assert _final(got[-1]) and not any(_final(g) for g in got[:-1])


def test_a_stream_reset_closes_the_running_generator(served: openinfer.Server, grpc_stubs: Any) -> None:
    """The client cancels its stream (RST_STREAM) after the first response: the model's
    generator is closed at its next yield (GeneratorExit), long before it would end."""
    import grpc

    pb = grpc_stubs.pb
    stop = threading.Event()

    def requests() -> Iterator[Any]:
        req = pb.ModelInferRequest(model_name="ticker")
        req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
        yield req
        stop.wait(BOUND)

    ticks.note(produced=0, closed=False, finished=False)
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), timeout=BOUND)
        first = next(call)
        assert first.infer_response.parameters["triton_final_response"].bool_param is False
        call.cancel()
        ticks.wait_for(lambda: ticks.closed, "closed")
        stop.set()
    assert not ticks.finished and ticks.produced < 100_000


# ---- declarations -----------------------------------------------------------------------------


def test_a_generator_is_decoupled_unless_declared_otherwise() -> None:
    assert Model("g", _ticker, **ONE_INT).decoupled
    assert not Model("p", lambda inputs: {}, **ONE_INT).decoupled
    with pytest.raises(ValueError, match="decoupled=True"):
        Model("g", _ticker, decoupled=False, **ONE_INT)
    with pytest.raises(ValueError, match="dynamic batching"):
        Model("g", _ticker, decoupled=True, max_batch_size=4, dynamic_batching=True,
              inputs=[Tensor("INPUT0", "INT32", [-1, 1])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 1])])


def test_model_config_reports_the_transaction_policy(served: openinfer.Server) -> None:
    with openinfer.Client(served.url) as client:
        status, body = client._get("/v2/models/ticker/config", None)
        assert status == 200 and b'"model_transaction_policy":{"decoupled":true}' in body
        status, body = client._get("/v2/models/repeat_int32/config", None)
        assert status == 200 and b'"model_transaction_policy":{"decoupled":true}' in body
        status, body = client._get("/v2/models/plain/config", None)
        assert b'"decoupled":true' not in body


# ---- shutdown ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "sse"])
def test_stop_closes_a_generator_whose_client_still_reads(grpc_stubs: Any, transport: str) -> None:
    """stop() waits its timeout for a stream that would run for minutes, answers UNAVAILABLE
    (gRPC) or cuts the event stream (SSE), and the model's generator is closed rather than left
    running in the background."""
    import socket

    import grpc

    seen = Observed()

    def endless(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        try:
            for i in range(100_000):
                seen.note(produced=i + 1)
                yield {"OUTPUT0": np.array([i], dtype=np.int32)}
                seen.gate.wait(0.005)
        except GeneratorExit:
            seen.note(closed=True)
            raise

    srv = openinfer.serve(models=[Model("endless", endless, **ONE_INT)], http_port=0, log=False, threads=2)
    reader_done = threading.Event()
    try:
        if transport == "grpc":
            pb = grpc_stubs.pb
            req = pb.ModelInferRequest(model_name="endless")
            req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
            req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
            channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
            call = grpc_stubs.rpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([req]), timeout=BOUND)

            def read() -> None:
                try:
                    for _ in call:
                        pass
                except grpc.RpcError:
                    pass
                reader_done.set()
        else:
            body = b'{"INPUT0": [1]}'
            sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=BOUND)
            sock.sendall(b"POST /v2/models/endless/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

            def read() -> None:
                while sock.recv(65536):
                    pass
                reader_done.set()

        threading.Thread(target=read, daemon=True).start()
        seen.wait_for(lambda: seen.produced > 3, "streaming")
    finally:
        srv.stop(0.2)
    seen.wait_for(lambda: seen.closed, "closed")
    assert reader_done.wait(BOUND)
    assert seen.produced < 100_000


def test_a_reset_cancels_an_async_generator_while_it_awaits(served: openinfer.Server, grpc_stubs: Any) -> None:
    """An async generator waiting a minute in `await` between responses is cancelled when its
    client resets the stream: it does not wait for its next yield."""
    import grpc

    pb = grpc_stubs.pb
    stop = threading.Event()

    def requests() -> Iterator[Any]:
        req = pb.ModelInferRequest(model_name="async_sleeper")
        req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
        yield req
        stop.wait(BOUND)

    sleeper.note(produced=0, closed=False, finished=False)
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        call = grpc_stubs.rpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests(), timeout=BOUND)
        assert next(call).infer_response.model_name == "async_sleeper"
        call.cancel()
        sleeper.wait_for(lambda: sleeper.closed, "cancelled")
        stop.set()
    assert sleeper.produced == 1 and not sleeper.finished


def test_a_grpc_client_that_never_reads_holds_the_generator_back(served: openinfer.Server,
                                                                  grpc_stubs: Any) -> None:
    """A client whose HTTP/2 window is 0 receives nothing: the model's generator is paused at
    its yield once the server's bound of unsent responses is reached, instead of queueing
    20000 x 64 KiB; when the client goes, the generator is closed."""
    import time

    import h2.settings
    from test_grpc_transport import H2, SERVICE, frame

    flood.note(produced=0, closed=False, finished=False)
    conn = H2(served.grpc_port)
    conn.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    conn.flush()
    req = grpc_stubs.pb.ModelInferRequest(model_name="flood")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    sid = conn.start(SERVICE + "ModelStreamInfer")
    conn.send(sid, frame(req.SerializeToString()))
    deadline, last, still = time.monotonic() + BOUND, -1, 0
    while time.monotonic() < deadline and still < 4 and not flood.finished:
        time.sleep(0.25)
        still = still + 1 if flood.produced == last else 0
        last = flood.produced
    assert not flood.finished and still >= 4, f"the generator never paused: {flood.produced} produced"
    assert flood.produced < 100, flood.produced  # 1 MiB of 64 KiB responses, and no socket buffer
    conn.sock.close()
    flood.wait_for(lambda: flood.closed, "closed")
