"""The classification extension through tritonclient HTTP and gRPC: top-k of an output as BYTES
"score:index[:label]" formatted as Triton formats them (std::to_string of the score, ties by
index), per batch row on a batching model, labels from label_filename, and the refusals."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

import openinfer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL_PY = '''
import numpy as np

def infer(inputs):
    x = inputs["SCORES"]
    return {"PROB": x, "IDX": x.astype(np.int32), "TEXT": np.array([[b"a"]] * x.shape[0], dtype=object)
            if x.ndim == 2 else np.array([b"a"], dtype=object)}
'''


def _model(repo: Path, name: str, batch: int, labels: str | None, label_file: str | None = "labels.txt") -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(MODEL_PY)
    label = f'label_filename: "{label_file}"' if label_file else ""
    text_dims = "[ 1 ]"
    (d / "config.pbtxt").write_text(textwrap.dedent(f"""
        backend: "python"
        max_batch_size: {batch}
        input [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [
          {{ name: "PROB" data_type: TYPE_FP32 dims: [ -1 ] {label} }},
          {{ name: "IDX" data_type: TYPE_INT32 dims: [ -1 ] }},
          {{ name: "TEXT" data_type: TYPE_STRING dims: {text_dims} }}
        ]
    """))
    if labels is not None:
        (d / "labels.txt").write_text(labels)


LABELS = "cat\ndog\n\nfish\r\nbird\n"  # the third class has no label; '\r' stays, as in Triton


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cls_repo")
    _model(repo, "cls", 8, LABELS)
    _model(repo, "cls_flat", 0, None, label_file=None)
    _model(repo, "cls_nolabels", 0, None)  # names a label file that is not there
    _model(repo, "cls_escape", 0, None, label_file="../cls/labels.txt")
    srv = openinfer.serve(repo, http_port=0, grpc_port=0, threads=2, log=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc(server):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.close()


def _infer(client, mod, model: str, scores: np.ndarray, k: int, output: str = "PROB", binary: bool = True):
    inp = mod.InferInput("SCORES", list(scores.shape), "FP32")
    inp.set_data_from_numpy(scores)
    if mod is httpclient:
        out = mod.InferRequestedOutput(output, binary_data=binary, class_count=k)
    else:
        out = mod.InferRequestedOutput(output, class_count=k)
    got = client.infer(model, [inp], outputs=[out]).as_numpy(output)
    # JSON outputs come back as str, binary ones as bytes; the tests compare bytes.
    return np.vectorize(lambda x: x if isinstance(x, bytes) else x.encode(), otypes=[object])(got)


CLIENTS = [("http", httpclient, True), ("http_json", httpclient, False), ("grpc", grpcclient, True)]


@pytest.fixture(params=CLIENTS, ids=[c[0] for c in CLIENTS])
def client(request, http, grpc):
    _, mod, binary = request.param
    return (http if mod is httpclient else grpc), mod, binary


def test_ties_and_labels_batched(client) -> None:
    c, mod, binary = client
    # Row 0 ties 0.5 at indices 1, 3 and 4: the lower index comes first (std::sort on a short
    # row keeps that order in Triton). Row 1 is another ordering of the same classes.
    scores = np.array([[0.25, 0.5, -1.0, 0.5, 0.5], [3.0, 1.0, 2.0, 0.0, 4.0]], dtype=np.float32)
    got = _infer(c, mod, "cls", scores, 4, binary=binary)
    assert got.shape == (2, 4)
    assert [x.decode() for x in got[0]] == [
        "0.500000:1:dog", "0.500000:3:fish\r", "0.500000:4:bird", "0.250000:0:cat"]
    assert [x.decode() for x in got[1]] == [
        "4.000000:4:bird", "3.000000:0:cat", "2.000000:2", "1.000000:1:dog"]


def test_k_larger_than_output(client) -> None:
    c, mod, binary = client
    scores = np.array([[1e-7, 123456.789, -0.0]], dtype=np.float32)
    got = _infer(c, mod, "cls", scores, 10, binary=binary)
    assert got.shape == (1, 3)  # min(k, classes)
    # The float's value printed with "%f", as std::to_string prints it.
    assert [x.decode() for x in got[0]] == ["123456.789062:1:dog", "0.000000:0:cat", "-0.000000:2"]


def test_integer_output_and_unbatched(client) -> None:
    c, mod, binary = client
    scores = np.array([7, -3, 7, 100, 0], dtype=np.float32)
    got = _infer(c, mod, "cls_flat", scores, 3, output="IDX", binary=binary)
    assert got.shape == (3,)
    assert [x.decode() for x in got] == ["100:3", "7:0", "7:2"]


def test_many_classes_match_a_stable_descending_sort(client) -> None:
    c, mod, binary = client
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 20, size=(3, 300)).astype(np.float32)  # many ties
    got = _infer(c, mod, "cls", scores, 25, binary=binary)
    for row, out in zip(scores, got):
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:25]
        labels = LABELS.split("\n")
        want = [f"{row[i]:f}:{i}" + (f":{labels[i]}" if i < len(labels) and labels[i] else "") for i in order]
        assert [x.decode() for x in out] == want


def test_zero_means_the_tensor(client) -> None:
    c, mod, binary = client
    scores = np.array([[0.5, 0.25]], dtype=np.float32)
    inp = mod.InferInput("SCORES", [1, 2], "FP32")
    inp.set_data_from_numpy(scores)
    out = mod.InferRequestedOutput("PROB", class_count=0)
    assert np.array_equal(c.infer("cls", [inp], outputs=[out]).as_numpy("PROB"), scores)


def test_non_numeric_output_refused(client) -> None:
    c, mod, binary = client
    with pytest.raises(InferenceServerException) as e:
        _infer(c, mod, "cls", np.zeros((1, 2), np.float32), 2, output="TEXT", binary=binary)
    assert "unsupported type 'BYTES'" in str(e.value) and "TEXT" in str(e.value)
    want = "400" if mod is httpclient else "StatusCode.INVALID_ARGUMENT"
    assert want in str(e.value.status())
    assert c.is_server_live()


def test_bad_parameter_http(http, server) -> None:
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"inputs": [{"name": "SCORES", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
                       "outputs": [{"name": "PROB", "parameters": {"classification": -2}}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/cls/infer", data=body)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400
    assert "'classification'" in json.loads(e.value.read())["error"]


def test_missing_label_file_makes_model_unavailable(http) -> None:
    assert not http.is_model_ready("cls_nolabels")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    reason = index["cls_nolabels"]["reason"]
    assert "label_filename" in reason and "labels.txt" in reason
    reason = index["cls_escape"]["reason"]
    assert "label_filename" in reason and "inside the model directory" in reason
    assert http.is_model_ready("cls")
