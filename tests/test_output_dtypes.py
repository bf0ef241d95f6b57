"""Converting what a Python model returns to an output's declared datatype: values convert when
they fit the declared type and are refused when they do not (never wrapped, never overflowed to
infinity), other kinds are refused outright, and the error names the output, the declared type
and what the model gave. Every pair of numeric types, BOOL, BF16 and BYTES, through real
sockets: requests over HTTP, tritonclient over gRPC."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from conftest import assert_alive, assert_grpc_alive

import openinfer
from openinfer import Model, Tensor

INTS = ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
FLOATS = ["FP16", "FP32", "FP64"]
DECLARED = ["BOOL", *INTS, *FLOATS, "BF16"]
GIVEN = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float16", "float32", "float64"]


def _returns(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, object]:
    """Returns what the request's parameters describe: `dtype` (a numpy dtype name, "list" for
    a plain Python list, "object" or "str" for arrays of those) and `values`, a JSON list of
    strings (parameters carry no lists, and strings keep 64-bit integers exact)."""
    given, values = parameters["dtype"], json.loads(parameters["values"])
    if given == "list":
        return {"OUTPUT0": [ast.literal_eval(v) for v in values]}
    if given in ("object", "str"):
        return {"OUTPUT0": np.array(values, dtype=given if given == "object" else np.str_)}
    kind = np.dtype(given).kind
    parse = {"b": lambda v: v in ("True", "1"), "i": int, "u": int, "f": float}[kind]
    return {"OUTPUT0": np.array([parse(v) for v in values], dtype=given)}


@pytest.fixture(scope="module")
def server() -> Iterator[openinfer.Server]:
    models = [
        Model(f"returns_{t.lower()}", _returns,
              inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", t, [-1])])
        for t in [*DECLARED, "BYTES"]
    ]
    srv = openinfer.serve(models=models, http_port=0, threads=1, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def infer(server: openinfer.Server, declared: str, given: str, values: list) -> tuple[int, dict]:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0]}],
        "parameters": {"dtype": given, "values": json.dumps([str(v) for v in values])},
    }
    r = requests.post(f"{server.url}/v2/models/returns_{declared.lower()}/infer", json=body, timeout=30)
    return r.status_code, r.json()


def limits(name: str) -> tuple[int, int]:
    """The range of an integer type, by numpy or V2 name."""
    if name == "bool":
        return 0, 1
    info = np.iinfo(name.lower())
    return int(info.min), int(info.max)


def _cases() -> Iterator[tuple[str, str, list, bool]]:
    """(declared, given numpy dtype, values, whether they convert) for every pair."""
    for declared in DECLARED:
        for given in GIVEN:
            kind = np.dtype(given).kind
            if declared == "BF16" and given == "uint16":
                continue  # bfloat16 bit patterns, not values (see openinfer.model)
            if declared == "BOOL":
                yield declared, given, ([True, False] if kind == "b" else [1, 0]), kind == "b"
            elif declared in INTS:
                if kind == "f":
                    yield declared, given, [1.0, 2.0], False  # no float to integer conversion
                    continue
                lo_d, hi_d = limits(declared)
                lo_g, hi_g = limits(given)
                yield declared, given, [max(lo_d, lo_g), min(hi_d, hi_g)], True
                if lo_g < lo_d:
                    yield declared, given, [0, lo_g], False
                if hi_g > hi_d:
                    yield declared, given, [0, hi_g], False
            else:  # FP16, FP32, FP64, BF16
                yield declared, given, ([True, False] if kind == "b" else [1.5, -2.25] if kind == "f" else [0, 1, 100]), True
                if declared == "FP16" and kind in "iu" and limits(given)[1] > 65519:
                    yield declared, given, [0, limits(given)[1]], False  # rounds to infinity
                if kind == "f" and np.finfo(given).max > (np.finfo(np.float16).max if declared == "FP16" else
                                                          np.finfo(np.float32).max if declared in ("FP32", "BF16") else
                                                          np.finfo(np.float64).max):
                    yield declared, given, [1.0, float(np.finfo(given).max)], False
    for declared, values, ok in [("INT32", [1, -2], True), ("INT32", [2**40], False), ("UINT8", [0, 255], True),
                                 ("UINT8", [-1], False), ("UINT64", [2**64 - 1], True), ("BOOL", [True, False], True),
                                 ("BOOL", [1, 0], False), ("FP32", [1.5, 2], True), ("FP16", [1e6], False)]:
        yield declared, "list", values, ok


CASES = list(_cases())


@pytest.mark.parametrize(("declared", "given", "values", "ok"), CASES,
                         ids=[f"{d}-{g}-{'ok' if ok else 'refused'}-{i}" for i, (d, g, _, ok) in enumerate(CASES)])
def test_output_conversion(server: openinfer.Server, declared: str, given: str, values: list, ok: bool) -> None:
    status, body = infer(server, declared, given, values)
    if ok:
        assert status == 200, body
        out = body["outputs"][0]
        assert out["datatype"] == declared and out["shape"] == [len(values)]
        assert out["data"] == [bool(v) if declared == "BOOL" else v for v in values]
    else:
        assert status == 500, body
        error = body["error"]
        shown = "int64" if given == "list" and declared != "FP16" else "float64" if given == "list" else given
        assert "'OUTPUT0'" in error and declared in error and shown in error, error


def test_reported_int64_for_int32_is_refused_not_wrapped(server: openinfer.Server) -> None:
    status, body = infer(server, "INT32", "int64", [2**40, -(2**40)])
    assert status == 500, body
    assert body["error"] == ("model 'returns_int32' output 'OUTPUT0': expected INT32, got int64 values that do not fit: "
                             "element 0 is 1099511627776, outside -2147483648..2147483647")
    assert_alive(server.http_port)


def test_float_overflow_is_refused_but_infinity_passes(server: openinfer.Server) -> None:
    # Infinity that the model computed is a value like any other; one that the conversion made is not.
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.zeros(1, np.int32))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        r = client.infer("returns_fp32", [inp], parameters={"dtype": "float64", "values": json.dumps(["inf", "-inf", "nan"])})
        got = r.as_numpy("OUTPUT0")
        assert got.dtype == np.float32 and np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])
        with pytest.raises(grpcclient.InferenceServerException) as exc:
            client.infer("returns_fp32", [inp], parameters={"dtype": "float64", "values": json.dumps(["1", "-1e300"])})
        assert "'OUTPUT0'" in exc.value.message() and "FP32" in exc.value.message() and "float64" in exc.value.message()
    assert_grpc_alive(server.grpc_port)


@pytest.mark.parametrize(("declared", "given", "values", "needle"), [
    ("BYTES", "int64", [1, 2], "int"),
    ("BYTES", "float64", [1.5], "float"),
    ("INT32", "object", [b"1"], "object"),
    ("INT32", "str", ["1"], "<U1"),
    ("FP32", "object", [b"x"], "object"),
    ("BOOL", "object", [b"x"], "object"),
])
def test_bytes_and_numbers_do_not_mix(server: openinfer.Server, declared: str, given: str, values: list, needle: str) -> None:
    status, body = infer(server, declared, given, values)
    assert status == 500, body
    assert "'OUTPUT0'" in body["error"] and declared in body["error"] and needle in body["error"], body["error"]


def test_bytes_output_takes_bytes_and_str(server: openinfer.Server) -> None:
    for given in ("object", "str"):
        status, body = infer(server, "BYTES", given, ["ab", "c"])
        assert status == 200, body
        assert body["outputs"][0]["data"] == ["ab", "c"]
