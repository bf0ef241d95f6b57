"""The legacy TensorRT Inference Server 1.x API (v1) beside V2: /api/health, /api/status,
/api/infer and nvidia.inferenceserver.GRPCService. Checked with 1.11's own client (in a
subprocess, see legacy_client.py), with raw HTTP built from the protocol text, and with grpcio
stubs generated from proto/legacy; the protos themselves are compared with the descriptors of
the tensorrtserver 1.11.0 wheel, field by field."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import Http, assert_alive

import openinfer

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "proto" / "legacy"
FILES = ["model_config", "request_status", "server_status", "api", "grpc_service"]
WHEEL_DESCRIPTORS = ROOT / "tests" / "data" / "tensorrtserver-1.11.0.descriptors.pb"

SCORES_PY = '''
def infer(inputs):
    return {"PROB": inputs["SCORES"]}
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("legacy_repo")
    for name in ("simple", "simple_string"):
        shutil.copytree(openinfer.examples_path() / name, repo / name)
    d = repo / "scores"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(SCORES_PY)
    (d / "labels.txt").write_text("a\nb\nc\nd\n")
    (d / "config.pbtxt").write_text(textwrap.dedent("""
        backend: "python"
        max_batch_size: 4
        input [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "PROB" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
    """))
    return repo


@pytest.fixture(scope="module")
def server(repo):
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """Python modules generated from proto/legacy with grpcio-tools, in a private descriptor
    pool (their file names repeat tritonclient's)."""
    out = tmp_path_factory.mktemp("legacy_stubs")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{LEGACY}", f"--python_out={out}",
                        f"--grpc_python_out={out}", f"--descriptor_set_out={out / 'ours.pb'}",
                        *(str(LEGACY / f"{f}.proto") for f in FILES)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (out / "oi_legacy_pool.py").write_text(
        "from google.protobuf import descriptor_pool\npool = descriptor_pool.DescriptorPool()\n")
    renames = {f"import {f}_pb2 as": f"import oi_legacy_{f}_pb2 as" for f in FILES}
    renames["_descriptor_pool.Default()"] = "__import__('oi_legacy_pool').pool"
    for path in out.glob("*_pb2*.py"):
        text = path.read_text()
        for a, b in renames.items():
            text = text.replace(a, b)
        path.write_text(text)

    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("oi_legacy_pool", out / "oi_legacy_pool.py")
    mods = {f: load(f"oi_legacy_{f}_pb2", out / f"{f}_pb2.py") for f in FILES}
    rpc = load("oi_legacy_grpc_service_pb2_grpc", out / "grpc_service_pb2_grpc.py")
    return types.SimpleNamespace(**mods, rpc=rpc, descriptors=out / "ours.pb")


# ---- the protos against the wheel's descriptors ----------------------------------------------


def _shape(fds) -> dict:
    """Everything about a FileDescriptorSet that reaches the wire or the generated API."""
    def message(m) -> dict:
        return {"fields": [(f.name, f.number, f.label, f.type, f.type_name,
                            f.oneof_index if f.HasField("oneof_index") else None) for f in m.field],
                "oneofs": [o.name for o in m.oneof_decl],
                "map_entry": m.options.map_entry,
                "nested": {n.name: message(n) for n in m.nested_type},
                "enums": {e.name: [(v.name, v.number) for v in e.value] for e in m.enum_type}}
    return {f.name: {"package": f.package, "syntax": f.syntax, "deps": list(f.dependency),
                     "messages": {m.name: message(m) for m in f.message_type},
                     "enums": {e.name: [(v.name, v.number) for v in e.value] for e in f.enum_type},
                     "services": {s.name: [(r.name, r.input_type, r.output_type, r.client_streaming,
                                            r.server_streaming) for r in s.method] for s in f.service}}
            for f in fds.file}


def test_protos_match_the_wheel_descriptors(pb) -> None:
    from google.protobuf import descriptor_pb2

    ours = descriptor_pb2.FileDescriptorSet.FromString(pb.descriptors.read_bytes())
    wheel = descriptor_pb2.FileDescriptorSet.FromString(WHEEL_DESCRIPTORS.read_bytes())
    a, b = _shape(ours), _shape(wheel)
    assert sorted(a) == sorted(b) == sorted(f"{f}.proto" for f in FILES)
    for name in b:
        for kind in ("package", "syntax", "deps", "enums", "services"):
            assert a[name][kind] == b[name][kind], (name, kind)
        assert sorted(a[name]["messages"]) == sorted(b[name]["messages"]), name
        for m in b[name]["messages"]:
            assert a[name]["messages"][m] == b[name]["messages"][m], (name, m)
    assert "InferRequestHeader" in a["api.proto"]["messages"]  # the comparison compared something


def test_the_stored_descriptors_are_the_installed_wheels() -> None:
    """tests/data holds what scripts/legacy_protos.py read from the wheel; where the wheel is
    installed, it still says the same."""
    api = importlib.util.find_spec("tensorrtserver")
    if api is None:
        pytest.skip("tensorrtserver 1.11.0 is not installed (requirements-test.txt)")
    from google.protobuf import descriptor_pb2

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import legacy_protos
    finally:
        sys.path.pop(0)
    stored = descriptor_pb2.FileDescriptorSet.FromString(WHEEL_DESCRIPTORS.read_bytes())
    folder = Path(api.submodule_search_locations[0]) / "api"
    for fd in stored.file:
        text = (folder / fd.name.replace(".proto", "_pb2.py")).read_text()
        assert descriptor_pb2.FileDescriptorProto.FromString(legacy_protos.serialized(text)) == fd


# ---- the real 1.11 client --------------------------------------------------------------------


def _client_env(tmp_path: Path) -> dict[str, str] | None:
    """The environment in which 1.11's client library loads: OpenSSL 1.1 from psycopg2-binary's
    wheel under the names the library asks for, or None when a piece is missing."""
    spec = importlib.util.find_spec("tensorrtserver")
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "psycopg2_binary.libs"))
    if spec is None or not libs:
        return None
    ssl = glob.glob(os.path.join(libs[0], "libssl-*.so.1.1"))
    crypto = glob.glob(os.path.join(libs[0], "libcrypto-*.so.1.1"))
    if not ssl or not crypto:
        return None
    (tmp_path / "libssl.so.1.1").symlink_to(ssl[0])
    (tmp_path / "libcrypto.so.1.1").symlink_to(crypto[0])
    api = os.path.join(spec.submodule_search_locations[0], "api")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(tmp_path), libs[0], api])
    # The wheel's generated modules build descriptors directly: the pure-Python runtime allows it.
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    return env


def test_tensorrtserver_client(server, tmp_path) -> None:
    env = _client_env(tmp_path)
    if env is None:
        pytest.skip("tensorrtserver 1.11.0 or psycopg2-binary's OpenSSL 1.1 is not installed (requirements-test.txt)")
    r = subprocess.run([sys.executable, "-W", "ignore", str(Path(__file__).with_name("legacy_client.py")),
                        f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for proto in ("http", "grpc"):
        g = got[proto]
        assert g["live"] is True and g["ready"] is True
        assert g["status"] == {"id": "inference:0", "models": ["simple"], "max_batch_size": 8,
                               "inputs": ["INPUT0", "INPUT1"], "ready": {"1": 1}}
        assert g["all_models"] == ["scores", "simple", "simple_string"]
        a = np.arange(16)
        assert g["sum"] == [(a + 3).tolist(), (2 * a + 3).tolist()]
        # OUTPUT1 = INPUT0 - INPUT1: the top 2 of each batch row, (index, value, label).
        assert g["diff_top2"] == [[[15, 12.0, ""], [14, 11.0, ""]], [[15, 27.0, ""], [14, 25.0, ""]]]
        assert g["strings"] == [str(i + 1) for i in range(16)]
        # Equal scores by index; labels from label_filename.
        assert g["labelled"] == [[[1, pytest.approx(0.7), "b"], [3, pytest.approx(0.7), "d"],
                                  [2, pytest.approx(0.2), "c"]]]
        assert "NOPE" in g["unknown_output"]
    assert got["grpc"]["stream_first"] == [3, 4, 5]


# ---- raw HTTP, from the protocol text -----------------------------------------------------


def _status(pb, headers: dict[str, str]):
    from google.protobuf import text_format

    return text_format.Parse(headers["nv-status"], pb.request_status.RequestStatus())


def simple_body(batch: int = 1) -> bytes:
    a = np.arange(16 * batch, dtype=np.int32)
    return a.tobytes() + np.ones(16 * batch, dtype=np.int32).tobytes()


SIMPLE_HEADER = 'batch_size: 1 input { name: "INPUT0" } input { name: "INPUT1" } output { name: "OUTPUT0" }'


def test_health(server, pb) -> None:
    conn = Http(server.http_port)
    for mode in ("live", "ready"):
        status, headers, body = conn.request("GET", f"/api/health/{mode}")
        rs = _status(pb, headers)
        assert (status, body, rs.code, rs.server_id) == (200, b"", pb.request_status.SUCCESS, "inference:0")
    ids = [_status(pb, conn.request("GET", "/api/health/live")[1]).request_id for _ in range(2)]
    assert ids[1] > ids[0] > 0
    status, headers, _ = conn.request("GET", "/api/health/sideways")
    assert status == 400 and "sideways" in _status(pb, headers).msg
    status, headers, _ = conn.request("POST", "/api/health/live")
    assert status == 405
    conn.close()


def test_health_ready_follows_the_models(tmp_path, pb) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)  # no model file: unavailable
    with openinfer.serve(tmp_path, http_port=0, log=False) as s:
        conn = Http(s.http_port)
        assert conn.request("GET", "/api/health/live")[0] == 200
        status, headers, _ = conn.request("GET", "/api/health/ready")
        assert status == 400 and _status(pb, headers).code == pb.request_status.UNAVAILABLE
        status, _, body = conn.request("GET", "/api/status/broken?format=binary")
        st = pb.server_status.ServerStatus.FromString(body)
        vs = st.model_status["broken"].version_status
        assert status == 200 and all(v.ready_state == pb.server_status.MODEL_UNAVAILABLE for v in vs.values())
        assert all("model.py" in v.ready_state_reason.message for v in vs.values())
        conn.close()


@pytest.mark.parametrize("fmt", ["", "?format=text", "?format=binary", "?format=json"])
def test_status_formats(server, pb, fmt: str) -> None:
    from google.protobuf import json_format, text_format

    conn = Http(server.http_port)
    conn.request("POST", "/api/infer/simple", simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
    status, headers, body = conn.request("GET", "/api/status" + fmt)
    assert status == 200 and _status(pb, headers).code == pb.request_status.SUCCESS
    st = pb.server_status.ServerStatus()
    if "binary" in fmt:
        assert headers["content-type"] == "application/octet-stream"
        st.ParseFromString(body)
    elif "json" in fmt:
        assert headers["content-type"] == "application/json"
        json_format.Parse(body, st)
    else:
        assert headers["content-type"] == "text/plain"
        text_format.Parse(body.decode(), st)
    assert st.id == "inference:0" and st.ready_state == pb.server_status.SERVER_READY and st.uptime_ns > 0
    assert sorted(st.model_status) == ["scores", "simple", "simple_string"]
    simple = st.model_status["simple"]
    assert simple.config.name == "simple" and simple.config.max_batch_size == 8
    assert [i.name for i in simple.config.input] == ["INPUT0", "INPUT1"]
    assert simple.config.input[0].data_type == pb.model_config.TYPE_INT32 and list(simple.config.input[0].dims) == [16]
    assert st.model_status["scores"].config.output[0].label_filename == "labels.txt"
    v1 = simple.version_status[1]
    assert v1.ready_state == pb.server_status.MODEL_READY
    assert v1.model_inference_count >= 1 and v1.infer_stats[0].success.count >= 1
    assert v1.infer_stats[1].compute.count >= 1  # executions of batch size 1
    conn.close()


def test_status_text_is_what_protobuf_prints(server, pb) -> None:
    """The text form is protobuf's own (C++ DebugString): parsed and printed back by protobuf's
    Python text_format, it is the same text, but for the key of a map entry that is 0, which
    C++ prints (an entry's fields have presence there) and Python leaves out."""
    from google.protobuf import text_format

    conn = Http(server.http_port)
    body = conn.request("GET", "/api/status/scores")[2].decode()
    st = text_format.Parse(body, pb.server_status.ServerStatus())
    assert "key: 0\n" in body
    assert text_format.MessageToString(st) == "".join(
        ln for ln in body.splitlines(keepends=True) if ln.strip() != "key: 0")
    _, headers, _ = conn.request("POST", "/api/infer/simple", simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
    rh = text_format.Parse(headers["nv-inferresponse"], pb.api.InferResponseHeader())
    assert text_format.MessageToString(rh, as_one_line=True) == headers["nv-inferresponse"]
    conn.close()


def test_status_unknown_model(server, pb) -> None:
    conn = Http(server.http_port)
    status, headers, body = conn.request("GET", "/api/status/nope")
    rs = _status(pb, headers)
    assert (status, body, rs.code) == (400, b"", pb.request_status.NOT_FOUND) and "nope" in rs.msg
    status, headers, _ = conn.request("GET", "/api/status?format=yaml")
    assert status == 400 and "format" in _status(pb, headers).msg
    assert conn.request("GET", "/api/health/live")[0] == 200  # the connection goes on
    conn.close()


@pytest.mark.parametrize("fmt", ["", "?format=binary"])
def test_infer_raw_and_classes(server, pb, fmt: str) -> None:
    from google.protobuf import text_format

    conn = Http(server.http_port)
    header = ('batch_size: 2 id: 77 input { name: "INPUT0" dims: [16] } input { name: "INPUT1" } '
              'output { name: "OUTPUT1" } output { name: "OUTPUT0" cls { count: 2 } }')
    status, headers, body = conn.request("POST", "/api/infer/simple/1" + fmt, simple_body(2),
                                         {"NV-InferRequest": header})
    assert status == 200, headers
    rs = _status(pb, headers)
    assert rs.code == pb.request_status.SUCCESS and rs.request_id > 0
    rh = text_format.Parse(headers["nv-inferresponse"], pb.api.InferResponseHeader())
    assert (rh.model_name, rh.model_version, rh.batch_size, rh.id) == ("simple", 1, 2, 77)
    assert [o.name for o in rh.output] == ["OUTPUT1", "OUTPUT0"]
    assert list(rh.output[0].raw.dims) == [16] and rh.output[0].raw.batch_byte_size == 128
    # The body: OUTPUT1's raw bytes, then the whole response header (text, or binary).
    raw, tail = body[:128], body[128:]
    a = np.arange(32, dtype=np.int32)
    assert np.array_equal(np.frombuffer(raw, np.int32), a - 1)
    whole = pb.api.InferResponseHeader()
    if fmt:
        whole.ParseFromString(tail)
    else:
        text_format.Parse(tail.decode(), whole)
    assert whole == rh
    classes = [[(c.idx, c.value) for c in row.cls] for row in rh.output[1].batch_classes]
    assert classes == [[(15, 16.0), (14, 15.0)], [(15, 32.0), (14, 31.0)]]
    conn.close()


def test_infer_bytes_and_labels(server, pb) -> None:
    from google.protobuf import text_format

    conn = Http(server.http_port)
    elems = [str(i).encode() for i in range(16)]
    one = b"".join(struct.pack("<I", len(e)) + e for e in elems)
    ones = b"".join(struct.pack("<I", 1) + b"2" for _ in range(16))
    status, headers, body = conn.request(
        "POST", "/api/infer/simple_string", one + ones,
        {"NV-InferRequest": 'batch_size: 1 input { name: "INPUT0" } input { name: "INPUT1" } output { name: "OUTPUT0" }'})
    assert status == 200, headers
    rh = text_format.Parse(headers["nv-inferresponse"], pb.api.InferResponseHeader())
    n = rh.output[0].raw.batch_byte_size
    out, k = [], 0
    while k < n:
        (m,) = struct.unpack_from("<I", body, k)
        out.append(body[k + 4:k + 4 + m].decode())
        k += 4 + m
    assert out == [str(i + 2) for i in range(16)]
    x = np.array([[0.5, 0.25, 0.5, 0.75]], np.float32)
    status, headers, _ = conn.request("POST", "/api/infer/scores", x.tobytes(), {
        "NV-InferRequest": 'batch_size: 1 input { name: "SCORES" } output { name: "PROB" cls { count: 9 } }'})
    rh = text_format.Parse(headers["nv-inferresponse"], pb.api.InferResponseHeader())
    got = [(c.idx, c.value, c.label) for c in rh.output[0].batch_classes[0].cls]
    assert got == [(3, 0.75, "d"), (0, 0.5, "a"), (2, 0.5, "c"), (1, 0.25, "b")]
    conn.close()


BAD = [
    ("missing header", None, simple_body(), "missing NV-InferRequest"),
    ("malformed header", "batch_size: 1 input { name: ", simple_body(), "NV-InferRequest: column"),
    ("unknown header field", "batch_size: 1 colour: 3", simple_body(), "unknown field 'colour'"),
    ("body too short", SIMPLE_HEADER, simple_body()[:-4], "unexpected size for input 'INPUT1'"),
    ("body too long", SIMPLE_HEADER, simple_body() + b"xxxx", "unexpected additional input data"),
    ("unknown output", SIMPLE_HEADER.replace('output { name: "OUTPUT0" }', 'output { name: "OUT9" }'),
     simple_body(), "unexpected inference output 'OUT9'"),
    ("batch too large", SIMPLE_HEADER.replace("batch_size: 1", "batch_size: 9"), simple_body(9), "batch_size"),
    ("batch zero", SIMPLE_HEADER.replace("batch_size: 1", "batch_size: 0"), b"", "batch_size"),
    ("unknown input", 'batch_size: 1 input { name: "X" }', simple_body(), "unexpected inference input 'X'"),
    ("missing input", 'batch_size: 1 input { name: "INPUT0" }', simple_body()[:64], "but missing required input(s) ['INPUT1']"),
    ("cls of strings", 'batch_size: 1 input { name: "INPUT0" } input { name: "INPUT1" } '
     'output { name: "OUTPUT0" cls { count: 1 } }', None, "unsupported type 'BYTES'"),
]


@pytest.mark.parametrize("case,header,body,needle", BAD, ids=[b[0] for b in BAD])
def test_infer_bad_input(server, pb, case: str, header: str | None, body: bytes | None, needle: str) -> None:
    conn = Http(server.http_port)
    model = "simple"
    if body is None:  # a BYTES model
        model, body = "simple_string", b"".join(struct.pack("<I", 1) + b"1" for _ in range(32))
    headers = {"NV-InferRequest": header} if header is not None else {}
    status, got, out = conn.request("POST", f"/api/infer/{model}", body, headers)
    rs = _status(pb, got)
    assert status == 400 and out == b"", (status, got)
    assert rs.code == pb.request_status.INVALID_ARG and needle in rs.msg, rs.msg
    assert "nv-inferresponse" in got
    # The connection stays usable, and so does the server.
    status, got, _ = conn.request("POST", "/api/infer/simple", simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
    assert status == 200 and _status(pb, got).code == pb.request_status.SUCCESS
    conn.close()
    assert_alive(server.http_port)


def test_infer_unknown_model_and_bad_paths(server, pb) -> None:
    conn = Http(server.http_port)
    status, got, _ = conn.request("POST", "/api/infer/nope", simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
    assert status == 400 and _status(pb, got).code == pb.request_status.NOT_FOUND
    status, got, _ = conn.request("POST", "/api/infer/simple/7", simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
    assert status == 400 and _status(pb, got).code == pb.request_status.NOT_FOUND
    for path in ("/api/infer/simple/x", "/api/infer/", "/api/nothing"):
        status, got, _ = conn.request("POST", path, simple_body(), {"NV-InferRequest": SIMPLE_HEADER})
        assert status == 400 and _status(pb, got).code == pb.request_status.INVALID_ARG, path
    status, got, _ = conn.request("GET", "/api/infer/simple")
    assert status == 405
    assert conn.request("GET", "/api/health/live")[0] == 200
    conn.close()


def test_v2_untouched(server) -> None:
    conn = Http(server.http_port)
    status, _, body = conn.request("GET", "/v2/health/live")
    assert (status, json.loads(body)) == (200, {"live": True})
    status, _, body = conn.request("GET", "/apix/status")
    assert status == 404
    conn.close()


# ---- gRPC through stubs generated from proto/legacy ----------------------------------------


@pytest.fixture(scope="module")
def stub(server, pb):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield pb.rpc.GRPCServiceStub(channel)
    channel.close()


def _infer_request(pb, model: str, header: str, raw: list[bytes], version: int = -1):
    from google.protobuf import text_format

    return pb.grpc_service.InferRequest(model_name=model, model_version=version,
                                        meta_data=text_format.Parse(header, pb.api.InferRequestHeader()),
                                        raw_input=raw)


def test_grpc_health_and_status(stub, pb) -> None:
    for mode in ("live", "ready"):
        r = stub.Health(pb.grpc_service.HealthRequest(mode=mode))
        assert r.health is True and r.request_status.code == pb.request_status.SUCCESS
    r = stub.Health(pb.grpc_service.HealthRequest(mode="other"))
    assert r.health is False and r.request_status.code == pb.request_status.INVALID_ARG
    r = stub.Status(pb.grpc_service.StatusRequest(model_name="simple"))
    assert r.request_status.code == pb.request_status.SUCCESS and list(r.server_status.model_status) == ["simple"]
    assert r.server_status.model_status["simple"].config.max_batch_size == 8
    r = stub.Status(pb.grpc_service.StatusRequest())
    assert sorted(r.server_status.model_status) == ["scores", "simple", "simple_string"]
    r = stub.Status(pb.grpc_service.StatusRequest(model_name="nope"))
    assert r.request_status.code == pb.request_status.NOT_FOUND and not r.HasField("server_status")


def test_grpc_infer(stub, pb) -> None:
    a = np.arange(16, dtype=np.int32)
    b = np.ones(16, dtype=np.int32)
    header = ('batch_size: 1 id: 5 input { name: "INPUT0" } input { name: "INPUT1" } '
              'output { name: "OUTPUT0" } output { name: "OUTPUT1" cls { count: 1 } }')
    r = stub.Infer(_infer_request(pb, "simple", header, [a.tobytes(), b.tobytes()]))
    assert r.request_status.code == pb.request_status.SUCCESS, r.request_status.msg
    assert r.meta_data.id == 5 and r.meta_data.model_version == 1
    assert len(r.raw_output) == 1 and np.array_equal(np.frombuffer(r.raw_output[0], np.int32), a + 1)
    assert [(c.idx, c.value) for c in r.meta_data.output[1].batch_classes[0].cls] == [(15, 14.0)]
    # Errors come back in request_status, the call itself OK, as 1.x answered.
    r = stub.Infer(_infer_request(pb, "simple", header, [a.tobytes()]))
    assert r.request_status.code == pb.request_status.INVALID_ARG and "raw_input" in r.request_status.msg
    assert r.meta_data.id == 5
    r = stub.Infer(_infer_request(pb, "simple", header, [a.tobytes(), b.tobytes()[:-1]]))
    assert r.request_status.code == pb.request_status.INVALID_ARG and "INPUT1" in r.request_status.msg
    r = stub.Infer(pb.grpc_service.InferRequest(model_name="simple"))
    assert r.request_status.code == pb.request_status.INVALID_ARG and "meta_data" in r.request_status.msg
    r = stub.Infer(_infer_request(pb, "nope", header, [a.tobytes(), b.tobytes()]))
    assert r.request_status.code == pb.request_status.NOT_FOUND


def test_grpc_stream_infer(stub, pb) -> None:
    a = np.arange(16, dtype=np.int32)
    ones = np.ones(16, dtype=np.int32).tobytes()
    header = 'batch_size: 1 input { name: "INPUT0" } input { name: "INPUT1" } output { name: "OUTPUT0" }'
    reqs = [_infer_request(pb, "simple", header.replace("batch_size: 1", f"batch_size: 1 id: {k}"),
                           [(a + k).tobytes(), ones]) for k in range(4)]
    reqs.insert(2, _infer_request(pb, "simple", header, [b"short", ones]))
    got = list(stub.StreamInfer(iter(reqs)))
    assert len(got) == 5
    ok = [r for r in got if r.request_status.code == pb.request_status.SUCCESS]
    assert sorted(r.meta_data.id for r in ok) == [0, 1, 2, 3]
    for r in ok:
        assert np.frombuffer(r.raw_output[0], np.int32)[0] == r.meta_data.id + 1
    bad = [r for r in got if r.request_status.code != pb.request_status.SUCCESS]
    assert len(bad) == 1 and bad[0].request_status.code == pb.request_status.INVALID_ARG


def test_grpc_unsupported_and_unknown(stub, pb, server) -> None:
    import grpc

    r = stub.ModelControl(pb.grpc_service.ModelControlRequest(model_name="simple"))
    assert r.request_status.code == pb.request_status.UNSUPPORTED
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    call = channel.unary_unary("/nvidia.inferenceserver.GRPCService/Profile")
    with pytest.raises(grpc.RpcError) as e:
        call(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel.close()


# ---- shared memory (1.11's sharedmemorycontrol and InferSharedMemory) -----------------------


@pytest.fixture
def region():
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=256, name=f"oi_legacy_{os.getpid()}")
    try:
        shm.buf[:64] = np.arange(16, dtype=np.int32).tobytes()
        shm.buf[64:128] = np.full(16, 5, dtype=np.int32).tobytes()
        yield shm
    finally:
        shm.close()
        shm.unlink()


def test_http_shared_memory(server, pb, region) -> None:
    from google.protobuf import text_format

    conn = Http(server.http_port)
    key = "/" + region.name
    status, got, _ = conn.request("POST", f"/api/sharedmemorycontrol/register/r1/{key}/0/256")
    assert status == 200 and _status(pb, got).code == pb.request_status.SUCCESS, got
    status, got, _ = conn.request("POST", f"/api/sharedmemorycontrol/register/r1/{key}/0/256")
    assert status == 400 and _status(pb, got).code == pb.request_status.ALREADY_EXISTS
    status, _, body = conn.request("POST", "/api/sharedmemorycontrol/status")
    st = text_format.Parse(body.decode(), pb.server_status.SharedMemoryStatus())
    assert [(r.name, r.system_shared_memory.shared_memory_key, r.byte_size) for r in st.shared_memory_region] == [
        ("r1", key, 256)]
    header = ('batch_size: 1 input { name: "INPUT0" shared_memory { name: "r1" offset: 0 byte_size: 64 } } '
              'input { name: "INPUT1" } '
              'output { name: "OUTPUT0" shared_memory { name: "r1" offset: 128 byte_size: 64 } } '
              'output { name: "OUTPUT1" }')
    ones = np.ones(16, dtype=np.int32).tobytes()
    status, got, body = conn.request("POST", "/api/infer/simple", ones, {"NV-InferRequest": header})
    assert status == 200, got
    rh = text_format.Parse(got["nv-inferresponse"], pb.api.InferResponseHeader())
    assert [o.raw.batch_byte_size for o in rh.output] == [64, 64]
    # OUTPUT0 went into the region; only OUTPUT1's bytes are in the body.
    assert np.array_equal(np.frombuffer(region.buf[128:192], np.int32), np.arange(16) + 1)
    assert np.array_equal(np.frombuffer(body[:64], np.int32), np.arange(16) - 1)
    bad = header.replace("offset: 128", "offset: 250")  # past the region's end
    status, got, _ = conn.request("POST", "/api/infer/simple", ones, {"NV-InferRequest": bad})
    assert status == 400 and "OUTPUT0" in _status(pb, got).msg
    status, got, _ = conn.request("POST", "/api/sharedmemorycontrol/unregister/r1")
    assert status == 200
    status, got, _ = conn.request("POST", "/api/infer/simple", ones, {"NV-InferRequest": header})
    assert status == 400 and "r1" in _status(pb, got).msg
    status, got, _ = conn.request("POST", "/api/sharedmemorycontrol/register/r2/no-slash/0/8")
    assert status == 400 and "register" in _status(pb, got).msg
    status, _, body = conn.request("POST", "/api/sharedmemorycontrol/status?format=binary")
    assert pb.server_status.SharedMemoryStatus.FromString(body).shared_memory_region == []
    conn.close()


def test_grpc_shared_memory(stub, pb, region) -> None:
    g = pb.grpc_service
    reg = g.SharedMemoryControlRequest.Register(
        name="g1", byte_size=256,
        system_shared_memory=g.SharedMemoryControlRequest.Register.SystemSharedMemoryIdentifier(
            shared_memory_key="/" + region.name, offset=0))
    r = stub.SharedMemoryControl(g.SharedMemoryControlRequest(register=reg))
    assert r.request_status.code == pb.request_status.SUCCESS, r.request_status.msg
    r = stub.SharedMemoryControl(g.SharedMemoryControlRequest(status=g.SharedMemoryControlRequest.Status()))
    assert [x.name for x in r.shared_memory_status.shared_memory_region] == ["g1"]
    header = ('batch_size: 1 input { name: "INPUT0" shared_memory { name: "g1" offset: 0 byte_size: 64 } } '
              'input { name: "INPUT1" shared_memory { name: "g1" offset: 64 byte_size: 64 } } '
              'output { name: "OUTPUT1" shared_memory { name: "g1" offset: 192 byte_size: 64 } }')
    r = stub.Infer(_infer_request(pb, "simple", header, [b"", b""]))
    assert r.request_status.code == pb.request_status.SUCCESS, r.request_status.msg
    assert list(r.raw_output) == []
    assert np.array_equal(np.frombuffer(region.buf[192:256], np.int32), np.arange(16) - 5)
    r = stub.SharedMemoryControl(g.SharedMemoryControlRequest(unregister_all=g.SharedMemoryControlRequest.UnregisterAll()))
    assert r.request_status.code == pb.request_status.SUCCESS
    r = stub.SharedMemoryControl(g.SharedMemoryControlRequest(status=g.SharedMemoryControlRequest.Status()))
    assert list(r.shared_memory_status.shared_memory_region) == []
