"""Triton's trace extension: settings read and changed with tritonclient over HTTP and gRPC
(global and per model, cleared, bad values refused with nothing changed), and the trace file
that level TIMESTAMPS writes (Triton's JSON), with trace_rate and trace_count honoured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from openinfer import Model, Tensor
from conftest import assert_alive, assert_grpc_alive

HTTP_POINTS = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
               "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "HTTP_SEND_START",
               "HTTP_SEND_END"]
GRPC_POINTS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"] + HTTP_POINTS[2:9] + ["GRPC_SEND_START", "GRPC_SEND_END"]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[openinfer.Server, Path]]:
    path = tmp_path / "trace.json"
    with openinfer.serve(http_port=0, log=False, trace_file=path) as s:
        yield s, path


_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def clients(s: openinfer.Server) -> tuple[thttp.InferenceServerClient, tgrpc.InferenceServerClient]:
    """Both clients of `s`, closed after the test."""
    pair = (thttp.InferenceServerClient(f"127.0.0.1:{s.http_port}"),
            tgrpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}"))
    _OPEN.extend(pair)
    return pair


def grpc_settings(g: tgrpc.InferenceServerClient, model: str = "", **update: Any) -> dict[str, Any]:
    """The settings as the HTTP client shows them (trace_level a list, the rest strings)."""
    if update:
        got = g.update_trace_settings(model_name=model, settings=update, as_json=True)
    else:
        got = g.get_trace_settings(model_name=model, as_json=True)
    return {k: v.get("value", []) if k == "trace_level" else v.get("value", [""])[0]
            for k, v in got["settings"].items()}


def infer_http(h: thttp.InferenceServerClient, n: int) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(n):
        ins = [thttp.InferInput("INPUT0", [1, 16], "INT32"), thttp.InferInput("INPUT1", [1, 16], "INT32")]
        for i in ins:
            i.set_data_from_numpy(a)
        out = h.infer("simple", ins).as_numpy("OUTPUT0")
        assert (out == a + a).all()


def infer_grpc(g: tgrpc.InferenceServerClient, n: int) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(n):
        ins = [tgrpc.InferInput("INPUT0", [1, 16], "INT32"), tgrpc.InferInput("INPUT1", [1, 16], "INT32")]
        for i in ins:
            i.set_data_from_numpy(a)
        out = g.infer("simple", ins).as_numpy("OUTPUT0")
        assert (out == a + a).all()


def read_traces(path: Path) -> dict[int, dict[str, Any]]:
    """The trace file parsed: id -> {model_name, model_version, points: [(name, ns)], tensors:
    [(activity, tensor)], events: names in file order (timestamps and tensor activities)}."""
    entries = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(entries, list)
    traces: dict[int, dict[str, Any]] = {}
    for e in entries:
        t = traces.setdefault(e["id"], {"points": [], "tensors": [], "events": []})
        if "activity" in e:
            assert set(e) == {"id", "activity", "tensor"}
            assert set(e["tensor"]) == {"name", "data", "shape", "dtype"}
            t["tensors"].append((e["activity"], e["tensor"]))
            t["events"].append(e["activity"])
        elif "timestamps" in e:
            t["events"] += [ts["name"] for ts in e["timestamps"]]
            assert set(e) == {"id", "timestamps"}
            t["points"] += [(ts["name"], ts["ns"]) for ts in e["timestamps"]]
        else:
            assert set(e) == {"id", "model_name", "model_version"}
            t.update(model_name=e["model_name"], model_version=e["model_version"])
    return traces


# ---- settings ----------------------------------------------------------------------------------


def test_defaults_on_both_protocols(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    expected = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                "trace_file": str(path), "trace_mode": "triton"}
    assert h.get_trace_settings() == expected
    assert h.get_trace_settings(model_name="simple") == expected
    assert grpc_settings(g) == expected
    assert grpc_settings(g, "simple") == expected
    assert requests.get(f"http://127.0.0.1:{s.http_port}/v2", timeout=10).json()["extensions"].count("trace") == 1


def test_global_and_model_settings_http(traced: tuple[openinfer.Server, Path]) -> None:
    s, _ = traced
    h, _ = clients(s)
    got = h.update_trace_settings(settings={"trace_rate": "7", "log_frequency": "5"})
    assert (got["trace_rate"], got["log_frequency"]) == ("7", "5")
    got = h.update_trace_settings(model_name="simple", settings={"trace_rate": "3", "trace_count": "9"})
    assert (got["trace_rate"], got["trace_count"], got["log_frequency"]) == ("3", "9", "5")
    # The global settings, and another model's, are untouched.
    assert h.get_trace_settings()["trace_rate"] == "7"
    assert h.get_trace_settings(model_name="simple_string")["trace_rate"] == "7"
    # A global change reaches what the model did not set itself.
    h.update_trace_settings(settings={"log_frequency": "6"})
    assert h.get_trace_settings(model_name="simple")["log_frequency"] == "6"
    assert h.get_trace_settings(model_name="simple")["trace_rate"] == "3"
    # null clears the model's own setting: the global one applies again.
    got = h.update_trace_settings(model_name="simple", settings={"trace_rate": None})
    assert (got["trace_rate"], got["trace_count"]) == ("7", "9")
    got = h.update_trace_settings(model_name="simple", settings={"trace_count": None})
    assert got["trace_count"] == "-1"
    # An empty body only reads.
    r = requests.post(f"http://127.0.0.1:{s.http_port}/v2/trace/setting", timeout=10)
    assert r.status_code == 200 and r.json()["trace_rate"] == "7"


def test_global_and_model_settings_grpc(traced: tuple[openinfer.Server, Path]) -> None:
    s, _ = traced
    h, g = clients(s)
    assert grpc_settings(g, trace_rate="11")["trace_rate"] == "11"
    got = grpc_settings(g, "simple", trace_level=["TIMESTAMPS"], trace_count="4")
    assert (got["trace_level"], got["trace_count"], got["trace_rate"]) == (["TIMESTAMPS"], "4", "11")
    assert grpc_settings(g)["trace_level"] == ["OFF"]
    assert h.get_trace_settings(model_name="simple")["trace_level"] == ["TIMESTAMPS"]
    # No value clears the model's own setting.
    got = grpc_settings(g, "simple", trace_level=None)
    assert got["trace_level"] == ["OFF"] and got["trace_count"] == "4"
    got = grpc_settings(g, "simple", trace_count=None)
    assert got["trace_count"] == "-1"


BAD = [
    ({"trace_rate": "fast"}, "Unable to parse 'trace_rate', got: fast"),
    ({"trace_rate": "-1"}, "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: -1"),
    ({"trace_rate": "4294967296"}, "'trace_rate', value is out of range"),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
    ({"trace_count": "many"}, "Unable to parse 'trace_count', got: many"),
    ({"log_frequency": "1.5"}, "Unable to parse 'log_frequency', got: 1.5"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": ["LOUD"]}, "unknown value 'LOUD' for 'trace_level'"),
    ({"trace_verbosity": "1"}, "unknown trace setting 'trace_verbosity'"),
    # A valid setting beside a bad one is not applied either.
    ({"trace_rate": "2", "trace_count": "x"}, "Unable to parse 'trace_count', got: x"),
]


@pytest.mark.parametrize("settings,message", BAD)
def test_bad_values_change_nothing(traced: tuple[openinfer.Server, Path], settings: dict[str, Any],
                                   message: str) -> None:
    s, _ = traced
    h, g = clients(s)
    before = h.get_trace_settings(model_name="simple")
    for model in ("", "simple"):
        with pytest.raises(InferenceServerException) as e:
            h.update_trace_settings(model_name=model, settings=settings)
        assert e.value.status() == "400" and message in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            g.update_trace_settings(model_name=model, settings=settings)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and message in e.value.message()
    assert h.get_trace_settings(model_name="simple") == before
    assert h.get_trace_settings() == before
    assert_alive(s.http_port)
    assert_grpc_alive(s.grpc_port)


def test_bad_requests(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    base = f"http://127.0.0.1:{s.http_port}/v2"
    with pytest.raises(InferenceServerException) as e:
        h.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    assert e.value.status() == "501" and "trace file location can not be updated" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        g.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as e:
        h.get_trace_settings(model_name="nope")
    assert e.value.status() == "400" and e.value.message() == "Request for unknown model : nope"
    with pytest.raises(InferenceServerException) as e:
        g.update_trace_settings(model_name="nope", settings={"trace_rate": "1"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "unknown model : nope" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        g.update_trace_settings(settings={"trace_rate": ["1", "2"]})
    assert "expect only 1 value for 'trace_rate'" in e.value.message()
    for body in (b"{", b"[1]", b'{"trace_level": "OFF", "trace_rate": 3}'):
        r = requests.post(base + "/trace/setting", data=body, timeout=10)
        if body.startswith(b'{"'):  # a lone level and a number are taken, as strings would be
            assert r.status_code == 200 and r.json()["trace_rate"] == "3"
        else:
            assert r.status_code == 400 and "trace request" in r.json()["error"]
    assert requests.put(base + "/trace/setting", timeout=10).status_code == 405
    assert h.get_trace_settings()["trace_file"] == str(path)
    assert_alive(s.http_port)


def test_timestamps_need_a_trace_file() -> None:
    with openinfer.serve(http_port=0, log=False) as s:
        h, g = clients(s)
        assert h.get_trace_settings()["trace_file"] == ""
        with pytest.raises(InferenceServerException) as e:
            h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert e.value.status() == "400" and "needs a trace file" in e.value.message()
        assert grpc_settings(g, trace_rate="5")["trace_rate"] == "5"  # the rest may change
        assert h.get_trace_settings()["trace_level"] == ["OFF"]


# ---- the trace file ----------------------------------------------------------------------------


def check_trace(t: dict[str, Any], points: list[str]) -> None:
    assert (t["model_name"], t["model_version"]) == ("simple", 1)
    assert [name for name, _ in t["points"]] == points
    stamps = [ns for _, ns in t["points"]]
    assert stamps == sorted(stamps) and stamps[0] > 0


def test_http_and_grpc_requests_traced(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    infer_http(h, 3)
    infer_grpc(g, 2)
    s.stop()
    traces = read_traces(path)
    assert sorted(traces) == [1, 2, 3, 4, 5]
    for i in (1, 2, 3):
        check_trace(traces[i], HTTP_POINTS)
    for i in (4, 5):
        check_trace(traces[i], GRPC_POINTS)


def test_generate_requests_traced(tmp_path: Path) -> None:
    """/generate and /generate_stream are traced as /infer is: one record per request with the
    HTTP points around the model's, a stream's send points at its end."""

    def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": inputs["INPUT0"]}

    def count(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        for i in range(3):
            yield {"OUTPUT0": inputs["INPUT0"] + i}

    io = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
    path = tmp_path / "t.json"
    with openinfer.serve(models=[Model("echo", echo, **io), Model("count", count, **io)], http_port=0, log=False,
                         trace_file=path, trace_config=["level=TIMESTAMPS", "rate=1"]) as s:
        r = requests.post(f"{s.url}/v2/models/echo/generate", json={"INPUT0": [1, 2]}, timeout=30)
        assert r.status_code == 200 and r.json()["OUTPUT0"] == [1, 2]
        r = requests.post(f"{s.url}/v2/models/count/generate_stream", json={"INPUT0": [5]}, timeout=30)
        assert r.status_code == 200 and r.text.count("data:") == 3
        r = requests.post(f"{s.url}/v2/models/echo/generate", json={"INPUT0": "x"}, timeout=30)
        assert r.status_code == 400  # refused before it reached the model: not traced
    traces = read_traces(path)
    assert sorted(traces) == [1, 2]
    assert [(traces[i]["model_name"], traces[i]["model_version"]) for i in (1, 2)] == [("echo", 1), ("count", 1)]
    for i in (1, 2):
        assert [name for name, _ in traces[i]["points"]] == HTTP_POINTS
        stamps = [ns for _, ns in traces[i]["points"]]
        assert stamps == sorted(stamps) and stamps[0] > 0


def test_rate_and_count_honoured(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "3", "trace_count": "2"})
    infer_http(h, 5)  # the 3rd is traced
    assert h.get_trace_settings()["trace_count"] == "1"
    infer_grpc(g, 4)  # the 6th request is traced; the 9th finds the count spent
    assert h.get_trace_settings()["trace_count"] == "0"
    s.stop()
    traces = read_traces(path)
    assert len(traces) == 2
    check_trace(traces[1], HTTP_POINTS)
    check_trace(traces[2], GRPC_POINTS)


def test_model_settings_drive_sampling(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    # Tracing on for "simple" alone, every other request.
    h.update_trace_settings(model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2"})
    r = requests.post(f"http://127.0.0.1:{s.http_port}/v2/models/simple_string/infer", timeout=10,
                      json={"inputs": [{"name": n, "shape": [1, 16], "datatype": "BYTES", "data": ["1"] * 16}
                                       for n in ("INPUT0", "INPUT1")]})
    assert r.status_code == 200, r.text
    infer_http(h, 4)
    # Cleared: the global settings (off) apply again.
    h.update_trace_settings(model_name="simple", settings={"trace_level": None})
    infer_grpc(g, 2)
    s.stop()
    traces = read_traces(path)
    assert len(traces) == 2
    assert all(t["model_name"] == "simple" for t in traces.values())


def test_log_frequency_writes_index_files(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, _ = clients(s)
    h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"})
    infer_http(h, 5)
    s.stop()
    parts = [read_traces(Path(f"{path}.{i}")) for i in range(3)]
    assert [len(p) for p in parts] == [2, 2, 1]
    assert not Path(f"{path}.3").exists()
    for p in parts:
        for t in p.values():
            check_trace(t, HTTP_POINTS)


def test_trace_file_that_cannot_be_opened(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot open the trace file .*missing"):
        openinfer.serve(http_port=0, log=False, trace_file=tmp_path / "missing" / "trace.json")


def test_cli_trace_file(tmp_path: Path) -> None:
    import signal

    from test_serve_cli import Cli

    path = tmp_path / "trace.json"
    cli = Cli("--trace-file", str(path))
    try:
        base = f"http://127.0.0.1:{cli.port}/v2"
        r = requests.post(base + "/trace/setting", timeout=10,
                          json={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert r.status_code == 200 and r.json()["trace_file"] == str(path)
        body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                           for n in ("INPUT0", "INPUT1")]}
        assert requests.post(base + "/models/simple/infer", json=body, timeout=10).status_code == 200
        cli.proc.send_signal(signal.SIGTERM)
        rc, out = cli.wait()
        assert rc == 0, out
    finally:
        cli.kill()
    traces = read_traces(path)
    assert len(traces) == 1
    check_trace(traces[1], HTTP_POINTS)


def test_count_read_back_per_model(traced: tuple[openinfer.Server, Path]) -> None:
    """A model with settings of its own spends its own count; the others spend the global one."""
    s, path = traced
    h, _ = clients(s)
    h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "5"})
    h.update_trace_settings(model_name="simple", settings={"trace_rate": "2"})
    infer_http(h, 4)  # the 2nd and 4th
    assert h.get_trace_settings(model_name="simple")["trace_count"] == "3"
    assert h.get_trace_settings()["trace_count"] == "5"
    assert h.get_trace_settings(model_name="simple_string")["trace_count"] == "5"
    s.stop()
    assert len(read_traces(path)) == 2


# ---- level TENSORS -------------------------------------------------------------------------------


def tensor_value(tensor: dict[str, Any]) -> np.ndarray:
    """A traced tensor's data as an array of its shape ("data" and "shape" are Triton's
    comma-separated strings)."""
    shape = [int(d) for d in tensor["shape"].split(",")] if tensor["shape"] else []
    if tensor["dtype"] == "BYTES":
        items = json.loads("[" + tensor["data"] + "]")
        return np.array([i.encode() for i in items], dtype=object).reshape(shape)
    kind = {"BOOL": np.int8, "FP32": np.float32, "FP64": np.float64}.get(tensor["dtype"], np.int64)
    return np.array(tensor["data"].split(",") if tensor["data"] else [], dtype=np.float64).astype(kind).reshape(shape)


def test_tensors_level_alone(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    h.update_trace_settings(settings={"trace_level": ["TENSORS"], "trace_rate": "1"})
    assert h.get_trace_settings()["trace_level"] == ["TENSORS"]
    infer_http(h, 1)
    infer_grpc(g, 1)
    s.stop()
    traces = read_traces(path)
    assert sorted(traces) == [1, 2]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for t in traces.values():
        # No timestamps and no request details at TENSORS alone, as in Triton.
        assert t["points"] == [] and "model_name" not in t
        assert [(act, x["name"]) for act, x in t["tensors"]] == [
            ("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
            ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]
        for act, x in t["tensors"]:
            assert (x["dtype"], x["shape"]) == ("INT32", "1,16")
            expected = {"INPUT0": a, "INPUT1": a, "OUTPUT0": a + a, "OUTPUT1": a - a}[x["name"]]
            assert (tensor_value(x) == expected).all()
        assert t["tensors"][0][1]["data"] == ",".join(str(i) for i in range(16))


def test_timestamps_and_tensors_together(traced: tuple[openinfer.Server, Path]) -> None:
    s, path = traced
    h, g = clients(s)
    got = grpc_settings(g, trace_level=["TENSORS", "TIMESTAMPS"], trace_rate="1")
    assert got["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    infer_grpc(g, 1)
    s.stop()
    traces = read_traces(path)
    assert list(traces) == [1]
    t = traces[1]
    check_trace(t, GRPC_POINTS)
    # The inputs follow QUEUE_START, the outputs COMPUTE_OUTPUT_START, as Triton reports them.
    ins, outs = ["TENSOR_QUEUE_INPUT"] * 2, ["TENSOR_BACKEND_OUTPUT"] * 2
    expected = GRPC_POINTS[:4] + ins + GRPC_POINTS[4:7] + outs + GRPC_POINTS[7:]
    assert t["events"] == expected


KINDS = [("B", "BOOL"), ("U8", "UINT8"), ("I8", "INT8"), ("U64", "UINT64"), ("I64", "INT64"),
         ("F32", "FP32"), ("F64", "FP64"), ("H", "FP16"), ("S", "BYTES")]


def test_tensor_data_of_every_kind(tmp_path: Path) -> None:
    """Booleans as 0/1, integers of each width, floats with 6 significant digits, FP16 empty as
    Triton leaves it, and BYTES elements (quotes, backslashes, control bytes, UTF-8 and bytes
    that are not UTF-8) written so that the file stays valid JSON and each element reads back."""
    path = tmp_path / "trace.json"
    model = openinfer.Model(
        "echo_all", lambda x: {"Y_" + k: v for k, v in x.items()},
        inputs=[openinfer.Tensor(n, d, [-1]) for n, d in KINDS],
        outputs=[openinfer.Tensor("Y_" + n, d, [-1]) for n, d in KINDS])
    strings = [b'say "hi"', b"back\\slash", b"tab\tnew\nline\x00", "héllo ✓".encode(), b"\xff\xc3",
               b"\xed\xa0\x80"]
    with openinfer.serve(models=[model], http_port=0, log=False, trace_file=path) as s:
        h, _ = clients(s)
        h.update_trace_settings(settings={"trace_level": ["TENSORS"], "trace_rate": "1"})
        values = {
            "B": np.array([True, False, True]), "U8": np.array([0, 255], np.uint8),
            "I8": np.array([-128, 7], np.int8), "U64": np.array([2**64 - 1], np.uint64),
            "I64": np.array([-2**63], np.int64), "F32": np.array([0.1, -2.5, 1e20], np.float32),
            "F64": np.array([3.141592653589793, 0.0]), "H": np.array([1.5], np.float16),
            "S": np.array(strings, dtype=object),
        }
        ins = []
        for n, d in KINDS:
            i = thttp.InferInput(n, list(values[n].shape), d)
            i.set_data_from_numpy(values[n], binary_data=True)
            ins.append(i)
        h.infer("echo_all", ins)
    (t,) = read_traces(path).values()
    got = {(act, x["name"]): x for act, x in t["tensors"]}
    assert len(got) == 2 * len(KINDS)
    data = {n: got[("TENSOR_QUEUE_INPUT", n)]["data"] for n, _ in KINDS}
    assert data["B"] == "1,0,1"
    assert data["U8"] == "0,255" and data["I8"] == "-128,7"
    assert data["U64"] == str(2**64 - 1) and data["I64"] == str(-2**63)
    assert data["F32"] == "0.1,-2.5,1e+20" and data["F64"] == "3.14159,0"
    assert data["H"] == ""
    elems = json.loads("[" + data["S"] + "]")
    assert [e.encode("utf-8") for e in elems[:4]] == strings[:4]
    # Bytes that are not UTF-8 (a stray byte, a cut sequence, a surrogate), one escape each.
    assert elems[4:] == ["\u00ff\u00c3", "\u00ed\u00a0\u0080"]
    for n, d in KINDS:
        out = got[("TENSOR_BACKEND_OUTPUT", "Y_" + n)]
        assert (out["dtype"], out["shape"], out["data"]) == (d, str(len(values[n])), data[n])


# ---- tritonserver's start-up flags -------------------------------------------------------------


def test_trace_config_starts_tracing(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    config = [f"triton,file={path}", "level=TIMESTAMPS", "level=tensors", "rate=1", "count=2",
              "mode=triton", "triton,log-frequency=0"]
    with openinfer.serve(http_port=0, log=False, trace_config=config) as s:
        h, g = clients(s)
        assert h.get_trace_settings() == {
            "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "2",
            "log_frequency": "0", "trace_file": str(path), "trace_mode": "triton"}
        infer_http(h, 3)
    traces = read_traces(path)
    assert sorted(traces) == [1, 2]
    check_trace(traces[1], HTTP_POINTS)
    assert len(traces[1]["tensors"]) == 4


def test_older_flags_and_their_precedence(tmp_path: Path) -> None:
    """--trace-config wins over --trace-rate and the like; levels add up; OFF anywhere wins."""
    path = tmp_path / "t.json"
    with openinfer.serve(http_port=0, log=False, trace_file=path, trace_level=["TIMESTAMPS"], trace_rate=5,
                         trace_count=7, trace_log_frequency=3,
                         trace_config={"rate": 2, "level": "TENSORS"}) as s:
        h, _ = clients(s)
        assert h.get_trace_settings() == {
            "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "2", "trace_count": "7",
            "log_frequency": "3", "trace_file": str(path), "trace_mode": "triton"}
    with openinfer.serve(http_port=0, log=False, trace_file=path, trace_level="TIMESTAMPS",
                         trace_config=["level=OFF"]) as s:
        h, _ = clients(s)
        assert h.get_trace_settings()["trace_level"] == ["OFF"]


BAD_CONFIG = [
    (["foo=1"], 'Bad option: "--trace-config foo".\nunknown trace setting \'foo\''),
    (["file=/tmp/x.json"], "it is a triton mode setting: --trace-config triton,file=<value>"),
    (["log_frequency=2"], "triton mode setting"),
    (["triton,rate=1"], "unknown triton trace setting 'rate'; expected one of file, log-frequency"),
    (["rate=x"], 'Bad option: "--trace-config rate".\nInvalid option value. Got x'),
    (["count=-2"], "Provided option value is out of bound. Got -2"),
    (["level=LOUD"], "invalid value for trace level option: loud"),
    ([",rate=1"], "No trace mode specified."),
    (["rate"], "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
    (["rate="], "Got rate="),
    (["jaeger,rate=1"], 'invalid value for trace mode option: jaeger. Available options are "triton"'),
    (["mode=opentelemetry"], "trace mode 'opentelemetry' is not supported"),
    (["opentelemetry,url=x"], "trace mode 'opentelemetry' is not supported"),
    (["level=TIMESTAMPS"], "needs a trace file"),
]


@pytest.mark.parametrize("config,message", BAD_CONFIG)
def test_bad_trace_config_refused(config: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        openinfer.serve(http_port=0, log=False, trace_config=config)
    assert message in str(e.value)


def test_bad_older_flags_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='Bad option: "--trace-rate".\nInvalid option value. Got fast'):
        openinfer.serve(http_port=0, log=False, trace_file=tmp_path / "t", trace_rate="fast")
    with pytest.raises(ValueError, match="invalid value for trace level option: loud"):
        openinfer.serve(http_port=0, log=False, trace_file=tmp_path / "t", trace_level=["LOUD"])


def test_cli_trace_config(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from test_serve_cli import Cli

    path = tmp_path / "trace.json"
    cli = Cli("--trace-config", f"triton,file={path}", "--trace-config", "level=TENSORS", "--trace-rate", "1")
    try:
        base = f"http://127.0.0.1:{cli.port}/v2"
        assert requests.get(base + "/trace/setting", timeout=10).json()["trace_level"] == ["TENSORS"]
        body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                           for n in ("INPUT0", "INPUT1")]}
        assert requests.post(base + "/models/simple/infer", json=body, timeout=10).status_code == 200
        cli.proc.send_signal(signal.SIGTERM)
        rc, out = cli.wait()
        assert rc == 0, out
    finally:
        cli.kill()
    (t,) = read_traces(path).values()
    assert [x["name"] for _, x in t["tensors"]] == ["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"]
    bad = subprocess.run([sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--trace-config",
                          "colour=blue"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and 'Bad option: "--trace-config colour"' in bad.stderr


def test_trace_settings_annotations_resolve() -> None:
    """Every name the module's annotations use is imported (typing.get_type_hints, as
    documentation tools and type checkers at run time call it, resolves them)."""
    import inspect
    import typing

    from openinfer._control import tracesettings

    for name, function in inspect.getmembers(tracesettings, inspect.isfunction):
        if function.__module__ == tracesettings.__name__:
            typing.get_type_hints(function)
