"""gRPC message compression: requests with grpc-encoding gzip or deflate (compressed flag set)
are inflated, off the event loop and within grpc_max_message_bytes; inference responses are
compressed when the client accepts it (grpc-accept-encoding) and the server allows it
(grpc_infer_response_compression_level, tritonserver's --grpc-infer-response-compression-level),
the level picking the algorithm the way gRPC does; an unknown encoding is UNIMPLEMENTED with
grpc-accept-encoding saying what is accepted. Clients: grpcio, tritonclient.grpc, and a raw
HTTP/2 connection where the bytes themselves must be checked."""

from __future__ import annotations

import gzip
import queue
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_grpc_transport import H2, SERVICE, frame, status_of

import openinfer
from openinfer import Model, Tensor, _core

from conftest import wait_until_held

LIMIT = 4 << 20
ACCEPTED = "identity,deflate,gzip"


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def make_server(level: str = "none", **kw: Any) -> openinfer.Server:
    model = Model("echo", _echo, inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    return openinfer.serve(models=[model], http_port=0, threads=1, log=False, grpc_max_message_bytes=LIMIT,
                           grpc_infer_response_compression_level=level, **kw)


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    srv = make_server("low")
    try:
        yield srv
    finally:
        srv.stop()


def infer_request(pb: Any, values: np.ndarray, id_: str = "") -> Any:
    req = pb.ModelInferRequest(model_name="echo", id=id_)
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[len(values)])
    req.raw_input_contents.append(values.astype(np.int32).tobytes())
    return req


def output_of(resp: Any) -> list[int]:
    return np.frombuffer(resp.raw_output_contents[0], dtype=np.int32).tolist()


def pack(data: bytes, encoding: str) -> bytes:
    return gzip.compress(data) if encoding == "gzip" else zlib.compress(data)


def unpack(data: bytes, encoding: str) -> bytes:
    return gzip.decompress(data) if encoding == "gzip" else zlib.decompress(data)


def messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (flag, payload) of each length-prefixed gRPC message in a response body."""
    out = []
    while data:
        flag, n = struct.unpack(">BI", data[:5])
        out.append((flag, data[5:5 + n]))
        data = data[5 + n:]
    return out


def send_all(conn: H2, sid: int, data: bytes, end: bool = True) -> None:
    """Sends `data` on a stream in frames the peer allows, waiting for window as needed."""
    step = conn.conn.max_outbound_frame_size
    for i in range(0, len(data), step):
        chunk = data[i:i + step]
        while conn.conn.local_flow_control_window(sid) < len(chunk):
            conn.pump()
        conn.conn.send_data(sid, chunk, end_stream=end and i + step >= len(data))
        conn.flush()


VALUES = np.arange(20_000, dtype=np.int32)


# ---- requests ------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["Gzip", "Deflate"])
def test_grpcio_compressed_requests(server: openinfer.Server, grpc_stubs: Any, algorithm: str) -> None:
    import grpc

    compression = getattr(grpc.Compression, algorithm)
    with grpc.insecure_channel(server.grpc_url[len("grpc://"):], compression=compression) as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        resp = stub.ModelInfer(infer_request(grpc_stubs.pb, VALUES), compression=compression, timeout=30)
        assert output_of(resp) == VALUES.tolist()
        # Every RPC takes compressed requests, not only inference.
        assert stub.ServerLive(grpc_stubs.pb.ServerLiveRequest(), timeout=10).live
        meta = stub.ModelMetadata(grpc_stubs.pb.ModelMetadataRequest(name="echo"), timeout=10)
        assert meta.name == "echo"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_requests_unary_and_stream(server: openinfer.Server, algorithm: str) -> None:
    import tritonclient.grpc as tgrpc

    client = tgrpc.InferenceServerClient(server.grpc_url[len("grpc://"):])
    try:
        inp = tgrpc.InferInput("INPUT0", [len(VALUES)], "INT32")
        inp.set_data_from_numpy(VALUES)
        result = client.infer("echo", [inp], compression_algorithm=algorithm)
        assert result.as_numpy("OUTPUT0").tolist() == VALUES.tolist()

        # A stream of compressed requests of different sizes: answers in order, each its own.
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            compression_algorithm=algorithm)
        sizes = [5000, 3, 70_000, 1, 200]
        for i, n in enumerate(sizes):
            x = tgrpc.InferInput("INPUT0", [n], "INT32")
            x.set_data_from_numpy(np.full(n, i, dtype=np.int32))
            client.async_stream_infer("echo", [x], request_id=str(i))
        for i, n in enumerate(sizes):
            result, error = answers.get(timeout=60)
            assert error is None, error
            assert result.get_response().id == str(i)
            assert result.as_numpy("OUTPUT0").tolist() == [i] * n
        client.stop_stream()
    finally:
        client.close()


def test_raw_compressed_then_plain_messages_keep_their_order(server: openinfer.Server, grpc_stubs: Any) -> None:
    # One stream: a large compressed message (inflated on a worker) then a small plain one;
    # the plain one may not overtake it.
    conn = H2(server.grpc_port)
    try:
        sid = conn.start(SERVICE + "ModelStreamInfer", extra=[("grpc-encoding", "gzip")])
        big = infer_request(grpc_stubs.pb, VALUES, "big").SerializeToString()
        small = infer_request(grpc_stubs.pb, np.array([1, 2], dtype=np.int32), "small").SerializeToString()
        send_all(conn, sid, frame(gzip.compress(big), flag=1) + frame(small))
        [st] = conn.wait(sid, timeout=60)
        assert status_of(st)[1] == "0"
        ids = [grpc_stubs.pb.ModelStreamInferResponse.FromString(p).infer_response.id
               for _, p in messages(st["data"])]
        assert ids == ["big", "small"]
    finally:
        conn.close()


# ---- responses -------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "accept", "expected"), [
    ("none", "identity,deflate,gzip", None),
    ("low", "identity,deflate,gzip", "gzip"),
    ("medium", "identity, deflate, gzip", "deflate"),  # gRPC's ranking: the middle of [gzip, deflate]
    ("high", "identity,deflate,gzip", "deflate"),
    ("high", "identity,gzip", "gzip"),
    ("low", "deflate", "deflate"),
    ("high", "identity", None),  # the client accepts nothing we compress with
    ("high", None, None),
])
def test_response_compression_by_level_and_accept(grpc_stubs: Any, level: str, accept: str | None,
                                                  expected: str | None) -> None:
    with make_server(level) as srv:
        conn = H2(srv.grpc_port)
        try:
            extra = [] if accept is None else [("grpc-accept-encoding", accept)]
            sid = conn.start(SERVICE + "ModelInfer", extra=extra)
            send_all(conn, sid, frame(infer_request(grpc_stubs.pb, VALUES).SerializeToString()))
            [st] = conn.wait(sid, timeout=60)
            assert status_of(st)[1] == "0"
            assert st["headers"]["grpc-accept-encoding"] == ACCEPTED
            assert st["headers"].get("grpc-encoding") == expected
            [(flag, payload)] = messages(st["data"])
            assert flag == (expected is not None)
            if expected is not None:
                assert len(payload) < VALUES.nbytes // 2, "compressed"
                payload = unpack(payload, expected)
            assert output_of(grpc_stubs.pb.ModelInferResponse.FromString(payload)) == VALUES.tolist()

            # Only inference responses are compressed, as tritonserver does.
            [st] = conn.wait(conn.call(SERVICE + "ServerLive", b"", extra=extra))
            assert "grpc-encoding" not in st["headers"] and messages(st["data"]) == [(0, b"\x08\x01")]
        finally:
            conn.close()


@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_compressed_responses_read_by_real_clients(grpc_stubs: Any, level: str) -> None:
    import grpc
    import tritonclient.grpc as tgrpc

    with make_server(level) as srv:
        target = srv.grpc_url[len("grpc://"):]
        with grpc.insecure_channel(target) as channel:
            stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
            assert output_of(stub.ModelInfer(infer_request(grpc_stubs.pb, VALUES), timeout=30)) == VALUES.tolist()
            stream = stub.ModelStreamInfer(iter([infer_request(grpc_stubs.pb, VALUES[:n], str(n))
                                                 for n in (7, 9000, 1)]), timeout=30)
            assert [(r.infer_response.id, len(output_of(r.infer_response))) for r in stream] == \
                [("7", 7), ("9000", 9000), ("1", 1)]
        client = tgrpc.InferenceServerClient(target)
        inp = tgrpc.InferInput("INPUT0", [len(VALUES)], "INT32")
        inp.set_data_from_numpy(VALUES)
        assert client.infer("echo", [inp], compression_algorithm="gzip").as_numpy("OUTPUT0").tolist() == \
            VALUES.tolist()
        client.close()
        with openinfer.Client(srv.grpc_url) as ours:  # sends no grpc-accept-encoding: plain answers
            np.testing.assert_array_equal(ours.infer("echo", {"INPUT0": VALUES})["OUTPUT0"], VALUES)


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_bomb_is_refused_by_the_message_limit(server: openinfer.Server, encoding: str) -> None:
    # 256 MiB of zeros in a few hundred KiB, behind the tag and length of a bytes field (a
    # message that starts well): refused once the inflated size passes the limit.
    c = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    head = c.compress(b"\x3a\x80\x80\x80\x80\x01")  # field 7 (raw_input_contents), 256 MiB
    bomb = head + b"".join(c.compress(b"\0" * (1 << 20)) for _ in range(256)) + c.flush()
    assert len(bomb) < LIMIT
    conn = H2(server.grpc_port)
    try:
        sid = conn.start(SERVICE + "ModelInfer", extra=[("grpc-encoding", encoding)])
        send_all(conn, sid, frame(bomb, flag=1))
        [st] = conn.wait(sid, timeout=60)
        _, code, text = status_of(st)
        assert code == "8", text  # RESOURCE_EXHAUSTED
        assert f"the decompressed request message exceeds the server's grpc_max_message_bytes ({LIMIT})" in text
        [st] = conn.wait(conn.call(SERVICE + "ServerLive", b""))  # the connection goes on
        assert status_of(st)[1] == "0"
    finally:
        conn.close()


def test_grpcio_bomb_gets_resource_exhausted(server: openinfer.Server, grpc_stubs: Any) -> None:
    import grpc

    zeros = np.zeros(LIMIT, dtype=np.int32)  # 16 MiB of zeros: a tiny gzip message
    with grpc.insecure_channel(server.grpc_url[len("grpc://"):]) as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(infer_request(grpc_stubs.pb, zeros), compression=grpc.Compression.Gzip, timeout=60)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "grpc_max_message_bytes" in e.value.details()
        assert stub.ServerLive(grpc_stubs.pb.ServerLiveRequest(), timeout=10).live


def test_unknown_encoding_is_unimplemented_with_accept_encoding(server: openinfer.Server) -> None:
    conn = H2(server.grpc_port)
    try:
        sid = conn.start(SERVICE + "ServerLive", extra=[("grpc-encoding", "snappy")])
        conn.send(sid, frame(b"\x01\x02", flag=1), end=True)
        [st] = conn.wait(sid)
        _, code, text = status_of(st)
        assert code == "12", text
        assert text == f"grpc-encoding 'snappy' is not supported; this server accepts {ACCEPTED}"
        assert st["headers"]["grpc-accept-encoding"] == ACCEPTED
        # An unknown encoding with uncompressed messages is no error: nothing needs decoding.
        sid = conn.start(SERVICE + "ServerLive", extra=[("grpc-encoding", "snappy")])
        conn.send(sid, frame(b""), end=True)
        [st] = conn.wait(sid)
        assert status_of(st)[1] == "0"
    finally:
        conn.close()


@pytest.mark.parametrize(("payload", "word"), [
    (gzip.compress(b"\x08\x01" * 100)[:-10], "truncated"),
    (b"\x1f\x8b\x08\x00" + b"\xff" * 40, "corrupt"),
])
def test_broken_compressed_messages_are_internal(server: openinfer.Server, payload: bytes, word: str) -> None:
    conn = H2(server.grpc_port)
    try:
        sid = conn.start(SERVICE + "ModelInfer", extra=[("grpc-encoding", "gzip")])
        conn.send(sid, frame(payload, flag=1), end=True)
        [st] = conn.wait(sid)
        _, code, text = status_of(st)
        assert code == "13" and f"the compressed request message is {word}" in text
    finally:
        conn.close()


def test_bad_level_is_refused() -> None:
    with pytest.raises(ValueError, match="must be one of none, low, medium, high; got 'max'"):
        openinfer.Server(http_port=0, grpc_infer_response_compression_level="max")
    from openinfer.cli import _parser

    args = _parser().parse_args(["serve", "--grpc-infer-response-compression-level", "medium"])
    assert args.grpc_infer_response_compression_level == "medium"
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--grpc-infer-response-compression-level", "max"])


# ---- off the loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["request", "response"])
def test_the_loop_serves_while_a_message_is_compressed(server: openinfer.Server, grpc_stubs: Any, hold: None,
                                                       side: str) -> None:
    # The server has one loop. A compressed request (or a response to compress) waits on the
    # hold, on a worker; meanwhile ServerReady on another connection is answered.
    import grpc

    target = server.grpc_url[len("grpc://"):]
    compression = grpc.Compression.Gzip if side == "request" else grpc.Compression.NoCompression
    out: list[Any] = []

    def call() -> None:
        with grpc.insecure_channel(target) as channel:
            stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
            out.append(stub.ModelInfer(infer_request(grpc_stubs.pb, VALUES), compression=compression, timeout=120))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    wait_until_held()
    with grpc.insecure_channel(target) as channel:
        stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(grpc_stubs.pb.ServerReadyRequest(), timeout=30).ready
    assert t.is_alive() and not out
    _core._hold_work(False)
    t.join(120)
    assert output_of(out[0]) == VALUES.tolist()


@pytest.mark.parametrize("side", ["request", "response"])
def test_stop_while_a_message_is_compressed(grpc_stubs: Any, hold: None, side: str) -> None:
    # The stop's time runs out while the work waits: the call ends UNAVAILABLE and stop()
    # returns; the work, let go afterwards, finds its call gone.
    import grpc

    srv = make_server("low")
    target = srv.grpc_url[len("grpc://"):]
    compression = grpc.Compression.Gzip if side == "request" else grpc.Compression.NoCompression
    out: list[Any] = []

    def call() -> None:
        with grpc.insecure_channel(target) as channel:
            stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
            try:
                stub.ModelInfer(infer_request(grpc_stubs.pb, VALUES), compression=compression, timeout=120)
            except grpc.RpcError as e:
                out.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    wait_until_held()
    srv.stop(timeout=0.2)
    t.join(120)
    assert out and out[0].code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in out[0].details()
    _core._hold_work(False)
    with make_server() as again:  # the process goes on serving
        with grpc.insecure_channel(again.grpc_url[len("grpc://"):]) as channel:
            stub = grpc_stubs.rpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerLive(grpc_stubs.pb.ServerLiveRequest(), timeout=10).live
