"""The client half of the gRPC inference wire codec (csrc/codec/pb_infer.c): the
ModelInferResponse / ModelStreamInferResponse reader and the ModelInferRequest writer, through
their fuzz target built under AddressSanitizer and UndefinedBehaviorSanitizer. Messages made by
the protobuf library are decoded (what each decodes to is checked) and round-tripped through
both writers; thousands of mutations of them are survived."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from test_json_codec import CC, _build as _build_json, _run

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")


@pytest.fixture(scope="module")
def fuzz_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_json(tmp_path_factory.mktemp("fuzz_pb_response") / "fuzz_pb_response",
                       "tests/fuzz/fuzz_pb_response.c", "-DOI_FUZZ_MAIN", "csrc/codec/pb_infer.c")


def decode(fuzz_bin: Path, tmp_path: Path, msg: bytes) -> str:
    f = tmp_path / "msg.bin"
    f.write_bytes(msg)
    r = _run([str(fuzz_bin), "-v", str(f)], text=True, errors="replace")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _response(pb: Any) -> Any:
    r = pb.ModelInferResponse(model_name="m", model_version="3", id="req-7")
    r.parameters["p"].int64_param = -2
    r.outputs.add(name="A", datatype="FP16", shape=[1, 2])
    r.outputs.add(name="B", datatype="BYTES", shape=[2])
    r.outputs.add(name="E", datatype="INT32", shape=[0])
    r.raw_output_contents.extend([np.array([1, -2], np.float16).tobytes(), b"\x01\x00\x00\x00z\x00\x00\x00\x00", b""])
    return r


def test_raw_outputs_in_place(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    out = decode(fuzz_bin, tmp_path, _response(grpc_stubs.pb).SerializeToString())
    assert 'unary OK model=m version=3 id=req-7 params={"p":-2} outputs=3 error=-' in out
    assert "output A FP16 ndim=2 bytes=4 inplace=1 data=" + np.array([1, -2], np.float16).tobytes().hex() in out
    assert "output B BYTES ndim=1 bytes=9 inplace=1 data=010000007a00000000" in out
    assert "output E INT32 ndim=1 bytes=0" in out


def test_typed_outputs_packed(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    r = grpc_stubs.pb.ModelInferResponse(model_name="m")
    r.outputs.add(name="I", datatype="INT8", shape=[3]).contents.int_contents.extend([-128, 0, 127])
    r.outputs.add(name="F", datatype="FP64", shape=[1]).contents.fp64_contents.extend([0.5])
    r.outputs.add(name="S", datatype="BYTES", shape=[1]).contents.bytes_contents.extend([b"hi"])
    out = decode(fuzz_bin, tmp_path, r.SerializeToString())
    assert "unary OK model=m version= id=- params= outputs=3" in out
    assert "output I INT8 ndim=1 bytes=3 inplace=0 data=80007f" in out
    assert "output F FP64 ndim=1 bytes=8 inplace=0 data=" + np.array([0.5]).tobytes().hex() in out
    assert "output S BYTES ndim=1 bytes=6 inplace=0 data=020000006869" in out


def test_stream_responses(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    ok = pb.ModelStreamInferResponse(infer_response=_response(pb))
    out = decode(fuzz_bin, tmp_path, ok.SerializeToString())
    assert "stream OK model=m version=3 id=req-7" in out and "outputs=3 error=-" in out
    err = pb.ModelStreamInferResponse(error_message="unknown model 'x'")
    err.infer_response.id = "5"
    out = decode(fuzz_bin, tmp_path, err.SerializeToString())
    assert "stream OK model= version= id=5 params= outputs=0 error=unknown model 'x'" in out


@pytest.mark.parametrize("msg,text", [
    (b"\x2a\x0e\x0a\x01A\x12\x04FP32\x1d\x00\x00\x00\x00",
     "ModelInferResponse.outputs[0].shape: field 3 has wire type 5 (32-bit), expected 2"),
    (b"\x2a\x07\x12\x05INT32", "ModelInferResponse.outputs[0].name is missing"),
    (b"\x2a\x0c\x0a\x01A\x12\x05INT32\x18\x01" + b"\x32\x00", "output 'A'"),
    (b"\x2a\x0c\x0a\x01A\x12\x05INT32\x18\x01" + b"\x32\x00\x32\x00",
     "raw_output_contents has 2 entries for 1 outputs"),
    (b"\x32\x05ab", "ModelInferResponse: truncated field"),
])
def test_errors_name_the_field(fuzz_bin: Path, tmp_path: Path, msg: bytes, text: str) -> None:
    out = decode(fuzz_bin, tmp_path, msg)
    assert "unary ERROR 400" in out and text in out, out


def test_mutations_are_survived(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    seeds = [_response(pb).SerializeToString(), pb.ModelStreamInferResponse(
        error_message="e", infer_response=_response(pb)).SerializeToString()]
    r = pb.ModelInferResponse(model_name="m", id="x")
    for dtype, field, values in [("FP32", "fp32_contents", [1.0, 2.0]), ("UINT16", "uint_contents", [1, 65535]),
                                 ("BOOL", "bool_contents", [True, False]), ("INT64", "int64_contents", [-1, 5])]:
        getattr(r.outputs.add(name=dtype, datatype=dtype, shape=[2]).contents, field).extend(values)
    seeds.append(r.SerializeToString())
    rng = random.Random(7)
    files = []
    for k in range(3000):
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            if op == 0 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)):]
            else:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        f = tmp_path / f"m{k}.bin"
        f.write_bytes(bytes(b))
        files.append(str(f))
    r = _run([str(fuzz_bin), *files], text=True, errors="replace")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert not re.search(r"ERROR: (Address|Leak)Sanitizer|runtime error", r.stderr)
