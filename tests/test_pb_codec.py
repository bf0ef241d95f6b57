"""The gRPC inference wire codec (csrc/codec/pb_infer.c) on its own: its fuzz target built
under AddressSanitizer and UndefinedBehaviorSanitizer replays messages made by the protobuf
library (what each decodes to is checked) and thousands of mutations of them."""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from test_json_codec import CC, _build as _build_json, _run

SOURCES = ["csrc/codec/pb_infer.c"]

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")


@pytest.fixture(scope="module")
def fuzz_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_json(tmp_path_factory.mktemp("fuzz_pb") / "fuzz_pb_infer", "tests/fuzz/fuzz_pb_infer.c",
                       "-DOI_FUZZ_MAIN", *SOURCES)


def decode(fuzz_bin: Path, tmp_path: Path, msg: bytes) -> str:
    f = tmp_path / "msg.bin"
    f.write_bytes(msg)
    r = _run([str(fuzz_bin), "-v", str(f)], text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_typed_contents_and_parameters(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    r = pb.ModelInferRequest(model_name="m", model_version="2", id="abc")
    r.parameters["flag"].bool_param = True
    t = r.inputs.add(name="I", datatype="INT16", shape=[2, 2])
    t.contents.int_contents.extend([-32768, 32767, 0, -1])
    t.parameters["p"].string_param = "x"
    r.inputs.add(name="S", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b""])
    r.outputs.add(name="O")
    out = decode(fuzz_bin, tmp_path, r.SerializeToString())
    assert 'OK model=m version=2 id=abc params={"flag":true} inputs=2 outputs=1' in out
    assert "input I INT16 ndim=2 bytes=8 params={\"p\":\"x\"} data=" + np.array(
        [-32768, 32767, 0, -1], np.int16).tobytes().hex() in out
    assert "input S BYTES ndim=1 bytes=10 params= data=02000000616200000000" in out
    assert "output O params=" in out


def test_unpacked_repeated_fields(fuzz_bin: Path, tmp_path: Path) -> None:
    # Input {name "A", datatype "INT64", shape 3 (unpacked), int64_contents 5 and 6 unpacked}.
    contents = b"\x18\x05\x18\x06"
    tensor = b"\x0a\x01A\x12\x05INT64\x18\x02" + b"\x2a" + bytes([len(contents)]) + contents
    msg = b"\x0a\x01m" + b"\x2a" + bytes([len(tensor)]) + tensor
    out = decode(fuzz_bin, tmp_path, msg)
    assert "input A INT64 ndim=1 bytes=16" in out and struct.pack("<qq", 5, 6).hex() in out


@pytest.mark.parametrize("msg,text", [
    (b"\x0a\x01m\x2a\x0e\x0a\x01A\x12\x04FP32\x1d\x00\x00\x00\x00",
     "inputs[0].shape: field 3 has wire type 5 (32-bit), expected 2"),
    (b"\x0a\x01m\x2a\x07\x12\x05INT32", "inputs[0].name is missing"),
    (b"\x0a\x01m\x2a\x0d\x0a\x01A\x12\x05INT32\x18\xff" + b"\xff" * 9, "malformed varint"),
])
def test_errors_name_the_field(fuzz_bin: Path, tmp_path: Path, msg: bytes, text: str) -> None:
    out = decode(fuzz_bin, tmp_path, msg)
    assert "ERROR 400" in out and text in out, out


def test_mutations_are_survived(fuzz_bin: Path, tmp_path: Path, grpc_stubs: Any) -> None:
    pb = grpc_stubs.pb
    seeds = []
    r = pb.ModelInferRequest(model_name="simple", id="x")
    r.parameters["a"].double_param = 1.5
    for dtype, field, values in [("FP32", "fp32_contents", [1.0, 2.0]), ("UINT8", "uint_contents", [1, 255]),
                                 ("BOOL", "bool_contents", [True, False]), ("BYTES", "bytes_contents", [b"q", b""])]:
        getattr(r.inputs.add(name=dtype, datatype=dtype, shape=[2]).contents, field).extend(values)
    r.outputs.add(name="o").parameters["binary_data"].bool_param = False
    seeds.append(r.SerializeToString())
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="A", datatype="FP16", shape=[1, 2])
    r.inputs.add(name="B", datatype="BYTES", shape=[1])
    r.raw_input_contents.extend([b"\x00\x3c\x00\x40", b"\x01\x00\x00\x00z"])
    seeds.append(r.SerializeToString())
    rng = random.Random(4)
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
    r = _run([str(fuzz_bin), *files], text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert not re.search(r"ERROR: (Address|Leak)Sanitizer|runtime error", r.stderr)
