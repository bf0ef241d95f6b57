"""Triton's response cache (`--cache-config local,size=N`, `response_cache { enable: true }`)
through the real transports: a request identical to an earlier one is answered from the cache
with the same bytes and without running the model (the model counts its calls), anything that
can change the answer parts entries, the cache is bounded in bytes (least recently used out
first), hits and misses are counted in the statistics and metrics, failures are never kept, and
bad options and configs are refused with tritonserver's words."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

import openinfer
from openinfer import Model, Tensor

BOUND = 30


class Counted:
    """A model that doubles INPUT0 and counts its calls (per INPUT0 value it saw); value 13
    fails, as a model error."""

    def __init__(self) -> None:
        self.calls: list[list[float]] = []
        self.lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        x = inputs["INPUT0"]
        with self.lock:
            self.calls.append(x.reshape(-1).tolist())
        if 13 in x:
            raise ValueError("thirteen is refused")
        scale = float(parameters.get("scale", 2))
        return {"OUTPUT0": x * scale, "OUTPUT1": x + 1}


IO = dict(inputs=[Tensor("INPUT0", "FP32", [-1])],
          outputs=[Tensor("OUTPUT0", "FP32", [-1]), Tensor("OUTPUT1", "FP32", [-1])])


@pytest.fixture()
def cached() -> Iterator[tuple[openinfer.Server, Counted, Counted]]:
    """A server with a 1 MiB cache: `c` uses it, `u` (the same model) does not."""
    c, u = Counted(), Counted()
    models = [Model("c", c, response_cache=True, **IO), Model("u", u, **IO)]
    with openinfer.serve(models=models, http_port=0, log=False, cache_config=["local,size=1048576"]) as srv:
        yield srv, c, u


def post(srv: openinfer.Server, model: str, values: list[float], **extra: Any) -> requests.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}], **extra}
    return requests.post(f"{srv.url}/v2/models/{model}/infer", json=body, timeout=BOUND)


def stats(srv: openinfer.Server, model: str) -> dict[str, Any]:
    return requests.get(f"{srv.url}/v2/models/{model}/stats", timeout=BOUND).json()["model_stats"][0]


def test_a_repeated_request_is_answered_from_the_cache_with_the_same_bytes(cached) -> None:
    srv, c, u = cached
    first = post(srv, "c", [1, 2])
    assert first.status_code == 200, first.text
    again = [post(srv, "c", [1, 2]) for _ in range(3)]
    assert [r.content for r in again] == [first.content] * 3
    assert c.calls == [[1, 2]]
    # The uncached model runs every time.
    for _ in range(2):
        post(srv, "u", [1, 2])
    assert u.calls == [[1, 2], [1, 2]]


def test_binary_outputs_from_the_cache_are_byte_identical(cached) -> None:
    srv, c, _ = cached
    extra = {"parameters": {"binary_data_output": True}}
    first, second = post(srv, "c", [3, 4], **extra), post(srv, "c", [3, 4], **extra)
    assert first.headers["Inference-Header-Content-Length"] == second.headers["Inference-Header-Content-Length"]
    assert first.content == second.content
    # JSON and binary are encodings of one cached answer.
    assert json.loads(post(srv, "c", [3, 4]).content)["outputs"][0]["data"] == [6.0, 8.0]
    assert c.calls == [[3, 4]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_hits_the_cache(cached, protocol: str) -> None:
    srv, c, _ = cached
    mod, url = (thttp, srv.url.split("//")[1]) if protocol == "http" else (tgrpc, f"127.0.0.1:{srv.grpc_port}")
    client = mod.InferenceServerClient(url)
    try:
        results = []
        for _ in range(3):
            i = mod.InferInput("INPUT0", [3], "FP32")
            i.set_data_from_numpy(np.array([5, 6, 7], dtype=np.float32))
            results.append(client.infer("c", [i]))
        for r in results:
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), [10, 12, 14])
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), [6, 7, 8])
        if protocol == "grpc":
            raw = [r.get_response().SerializeToString(deterministic=True) for r in results]
            assert raw[1:] == raw[:1] * 2
        assert c.calls == [[5, 6, 7]]
        s = client.get_inference_statistics("c")
        if protocol == "grpc":
            infer_stats = s.model_stats[0].inference_stats
            hits, misses, success = infer_stats.cache_hit.count, infer_stats.cache_miss.count, infer_stats.success.count
        else:
            infer_stats = s["model_stats"][0]["inference_stats"]
            hits, misses = infer_stats["cache_hit"]["count"], infer_stats["cache_miss"]["count"]
            success = infer_stats["success"]["count"]
        assert (hits, misses, success) == (2, 1, 3)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_python_model_reports_its_cache_in_its_config(cached, protocol: str) -> None:
    srv, _, _ = cached
    if protocol == "http":
        configs = {m: requests.get(f"{srv.url}/v2/models/{m}/config", timeout=BOUND).json() for m in ("c", "u")}
        assert configs["c"]["response_cache"] == {"enable": True}
        assert configs["u"].get("response_cache", {}).get("enable", False) is False
    else:
        with tgrpc.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}") as client:
            assert client.get_model_config("c").config.response_cache.enable is True
            assert client.get_model_config("u").config.response_cache.enable is False


def test_what_can_change_the_answer_parts_entries(cached) -> None:
    srv, c, _ = cached
    assert post(srv, "c", [1, 2]).status_code == 200
    post(srv, "c", [1, 2, 3])  # another shape
    post(srv, "c", [2, 1])  # other values
    post(srv, "c", [1, 2], parameters={"scale": 3})  # a parameter the model reads
    only0 = post(srv, "c", [1, 2], outputs=[{"name": "OUTPUT0"}])  # another set of outputs
    assert [o["name"] for o in only0.json()["outputs"]] == ["OUTPUT0"]
    assert c.calls == [[1, 2], [1, 2, 3], [2, 1], [1, 2], [1, 2]]
    # The scheduler's own parameters and the encoding do not change the answer: hits.
    post(srv, "c", [1, 2], parameters={"priority": 1, "timeout": 10_000_000, "binary_data_output": False})
    post(srv, "c", [1, 2], parameters={"scale": 3})
    assert post(srv, "c", [1, 2], outputs=[{"name": "OUTPUT0"}]).content == only0.content
    assert len(c.calls) == 5
    assert post(srv, "c", [1, 2], parameters={"scale": 3}).json()["outputs"][0]["data"] == [3.0, 6.0]


def test_failures_are_not_kept(cached) -> None:
    srv, c, _ = cached
    for _ in range(2):
        r = post(srv, "c", [13])
        assert r.status_code == 500 and "thirteen is refused" in r.json()["error"]
    assert c.calls == [[13], [13]]
    s = stats(srv, "c")["inference_stats"]
    assert (s["cache_hit"]["count"], s["cache_miss"]["count"], s["fail"]["count"]) == (0, 2, 2)


def test_the_cache_is_bounded_least_recently_used_out_first() -> None:
    """Each entry holds 2 x 4 KiB of outputs (and its 4 KiB key): about 3 fit in 40 KiB."""
    c = Counted()
    with openinfer.serve(models=[Model("c", c, response_cache=True, **IO)], http_port=0, log=False,
                         cache_config=["local,size=40000"]) as srv:
        values = {k: [float(k)] * 1024 for k in range(5)}
        for k in (0, 1, 2):
            post(srv, "c", values[k])
        post(srv, "c", values[0])  # a hit: 0 is now the most recently used
        assert len(c.calls) == 3
        post(srv, "c", values[3])  # evicts 1, the least recently used
        post(srv, "c", values[0])
        post(srv, "c", values[2])
        assert len(c.calls) == 4
        post(srv, "c", values[1])  # evicted: runs again
        assert len(c.calls) == 5
        # An answer larger than the whole cache is never kept.
        big = [7.0] * 8192
        post(srv, "c", big)
        post(srv, "c", big)
        assert len(c.calls) == 7


def test_without_a_server_cache_the_model_runs_uncached() -> None:
    c = Counted()
    with openinfer.serve(models=[Model("c", c, response_cache=True, **IO)], http_port=0, log=False) as srv:
        post(srv, "c", [1])
        post(srv, "c", [1])
        assert len(c.calls) == 2
        s = stats(srv, "c")["inference_stats"]
        assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (0, 0)
        assert "nv_cache_num_hits_per_model" not in requests.get(srv.metrics_url, timeout=BOUND).text


def test_metrics_count_hits_and_misses_of_the_models_that_use_the_cache(cached) -> None:
    srv, _, _ = cached
    for values in ([1], [1], [1], [2]):
        post(srv, "c", values)
    post(srv, "u", [1])
    text = requests.get(srv.metrics_url, timeout=BOUND).text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("nv_cache_")}
    assert lines['nv_cache_num_hits_per_model{model="c",version="1"}'] == 2
    assert lines['nv_cache_num_misses_per_model{model="c",version="1"}'] == 2
    assert 'nv_cache_hit_duration_per_model{model="c",version="1"}' in lines
    assert 'nv_cache_miss_duration_per_model{model="c",version="1"}' in lines
    assert not any('model="u"' in k for k in lines)
    # Hits are successes, as Triton counts them; the model's own inference count is not.
    assert 'nv_inference_request_success{model="c",version="1"} 4' in text
    assert 'nv_inference_count{model="c",version="1"} 2' in text


def test_concurrent_identical_requests_all_get_the_answer(cached) -> None:
    srv, c, _ = cached
    out: list[bytes] = []

    def run() -> None:
        for _ in range(20):
            out.append(post(srv, "c", [9, 8]).content)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert len(out) == 80 and len(set(out)) == 1
    assert 1 <= len(c.calls) <= 4  # the ones in flight before the first answer was kept


@pytest.mark.parametrize("options, message", [
    (dict(cache_config=["local,size=abc"]), "--cache-config local,size=abc: expected a size in bytes"),
    (dict(cache_config=["local,size=-1"]), "expected a size in bytes of 0 or more, got -1"),
    (dict(cache_config=["redis,size=10"]), "openinfer has the 'local' cache only, got 'redis'"),
    (dict(cache_config=["local,bytes=10"]), "the local cache's one setting is 'size', got 'bytes'"),
    (dict(cache_config=["size=10"]), "No cache specified. --cache-config option format is"),
    (dict(cache_config=["local,size"]), "--cache-config option format is '<cache name>,<setting>=<value>'. Got "
                                        "local,size"),
    (dict(cache_config=["local,size=1"], response_cache_byte_size=1),
     "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
])
def test_bad_cache_options_are_refused_with_tritonservers_words(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        openinfer.serve(models=[Model("c", Counted(), **IO)], http_port=0, log=False, **options)
    assert message in str(err.value)


def test_deprecated_byte_size_flag_and_the_cli(tmp_path: Path) -> None:
    c = Counted()
    with openinfer.serve(models=[Model("c", c, response_cache=True, **IO)], http_port=0, log=False,
                         response_cache_byte_size=1 << 20) as srv:
        post(srv, "c", [4])
        post(srv, "c", [4])
        assert len(c.calls) == 1
    from openinfer.cli import main

    assert main(["serve", str(tmp_path), "--http-port", "0", "--cache-config", "local,size=x"]) == 1


def write_model(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(
        "import numpy as np\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        raise NotImplementedError\n")
    (repo / name / "config.pbtxt").write_text(config)


@pytest.mark.parametrize("extra, words", [
    ("sequence_batching { }", "with sequence batching scheduler. Please disable the response cache."),
    ("model_transaction_policy { decoupled: true }",
     "with 'decoupled' transaction policy. Please disable the response cache."),
])
def test_a_model_the_cache_cannot_serve_is_unavailable_with_tritons_reason(tmp_path: Path, extra: str,
                                                                           words: str) -> None:
    write_model(tmp_path, "m", f"""backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
response_cache {{ enable: true }}
{extra}
""")
    with openinfer.serve(tmp_path, http_port=0, log=False, cache_config=["local,size=1000"]) as srv:
        r = requests.get(f"{srv.url}/v2/models/m/ready", timeout=BOUND)
        assert r.status_code == 400
        index = requests.post(f"{srv.url}/v2/repository/index", json={}, timeout=BOUND).json()
        reason = next(e["reason"] for e in index if e["name"] == "m")
        assert f"Response Cache does not currently support model m {words}" in reason


def test_a_python_model_refuses_the_cache_where_triton_does() -> None:
    def gen(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        yield {"OUTPUT0": inputs["INPUT0"]}

    with pytest.raises(ValueError, match="with 'decoupled' transaction policy. Please disable the response cache"):
        Model("g", gen, response_cache=True, inputs=[Tensor("INPUT0", "FP32", [1])],
              outputs=[Tensor("OUTPUT0", "FP32", [1])])
    with pytest.raises(TypeError, match="response_cache must be a bool"):
        Model("g", Counted(), response_cache="yes", **IO)  # type: ignore[arg-type]
