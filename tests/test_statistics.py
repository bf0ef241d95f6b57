"""The statistics extension (GET /v2/models[/m[/versions/v]]/stats, gRPC ModelStatistics,
Server.statistics) and the Prometheus /metrics listener, through tritonclient.http,
tritonclient.grpc, grpcio and raw HTTP, with every count checked against the requests this
module sent. Each test uses its own server (or its own models) so the counts are its own."""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Model, Tensor
from openinfer.config import DynamicBatching

from conftest import wait_for

prometheus_parser = pytest.importorskip("prometheus_client.parser")

ONE_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1])], outputs=[Tensor("OUTPUT0", "INT32", [-1])])
BATCH_INT = dict(inputs=[Tensor("INPUT0", "INT32", [-1, 2])], outputs=[Tensor("OUTPUT0", "INT32", [-1, 2])])

INFERENCE_STATS = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
                   "cache_miss"]
MODEL_STATS_KEYS = ["name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
                    "response_stats", "batch_stats", "memory_usage"]


def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def refuse(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise ValueError("the model refuses")


class Gate:
    """A model whose executor waits until the test opens the gate, so that later requests
    stay queued (pending) for as long as the test needs."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.set()
        assert self.open.wait(60), "the test never opened the gate"
        return {"OUTPUT0": inputs["INPUT0"]}


def models(gate: Gate | None = None) -> list[Model]:
    out = [
        Model("echo", echo, **ONE_INT),
        Model("echo", echo, version=2, **ONE_INT),
        Model("refuse", refuse, **ONE_INT),
        # One executor, a preferred batch of 4 and a long queue delay: four concurrent
        # one-row requests always run as one batch of 4, and a request of 8 rows alone.
        Model("batched", echo, max_batch_size=8, dynamic_batching=DynamicBatching((4,), 20_000_000), **BATCH_INT),
        Model("rows", echo, max_batch_size=8, **BATCH_INT),
    ]
    if gate is not None:
        out.append(Model("gated", gate, **ONE_INT))
    return out


@pytest.fixture
def server() -> Iterator[openinfer.Server]:
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        yield srv


def infer(srv: openinfer.Server, model: str, data: list[Any], datatype: str = "INT32",
          shape: list[int] | None = None, version: str = "1") -> requests.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape or [len(data)], "data": data}]}
    return requests.post(srv.url + path, json=body, timeout=30)


def stats_of(body: dict[str, Any], name: str, version: str = "1") -> dict[str, Any]:
    found = [m for m in body["model_stats"] if (m["name"], m["version"]) == (name, version)]
    assert len(found) == 1, body
    return found[0]


def scrape(srv: openinfer.Server) -> dict[str, Any]:
    """The metrics as prometheus_client's parser reads them: family name -> family."""
    r = requests.get(srv.metrics_url, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(r.text)}


def sample(families: dict[str, Any], family: str, name: str | None = None, **labels: str) -> float:
    values = [s.value for s in families[family].samples
              if s.name == (name or family) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(values) == 1, (family, labels, families[family].samples)
    return values[0]


# ---- the statistics extension ------------------------------------------------------------------


def test_counts_match_what_was_sent_over_http_client(server: openinfer.Server) -> None:
    import tritonclient.http as httpclient

    before_ms = int(time.time() * 1000)
    for n in (1, 3, 5):
        assert infer(server, "echo", list(range(n))).status_code == 200
    for _ in range(2):
        r = infer(server, "refuse", [1])
        assert r.status_code == 500 and "the model refuses" in r.text
    after_ms = int(time.time() * 1000)

    client = httpclient.InferenceServerClient(server.url[len("http://"):])
    echo_stats = client.get_inference_statistics("echo", "1")
    assert list(echo_stats) == ["model_stats"] and len(echo_stats["model_stats"]) == 1
    e = echo_stats["model_stats"][0]
    assert list(e) == MODEL_STATS_KEYS
    assert (e["name"], e["version"]) == ("echo", "1")
    assert list(e["inference_stats"]) == INFERENCE_STATS
    # A model that does not batch counts one inference per request, whatever its size.
    assert (e["inference_count"], e["execution_count"]) == (3, 3)
    s = e["inference_stats"]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert s[key]["count"] == 3, key
    assert s["fail"] == {"count": 0, "ns": 0}
    assert s["cache_hit"] == s["cache_miss"] == {"count": 0, "ns": 0}
    assert s["success"]["ns"] > 0 and s["compute_infer"]["ns"] > 0
    # The parts of a request's time never add up to more than the whole.
    parts = sum(s[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert parts <= s["success"]["ns"]
    assert before_ms <= e["last_inference"] <= after_ms
    assert [b["batch_size"] for b in e["batch_stats"]] == [1]
    assert e["batch_stats"][0]["compute_infer"]["count"] == 3
    assert e["response_stats"] == {} and e["memory_usage"] == []

    f = client.get_inference_statistics("refuse")["model_stats"][0]
    assert f["inference_stats"]["fail"]["count"] == 2 and f["inference_stats"]["fail"]["ns"] > 0
    assert f["inference_stats"]["success"]["count"] == 0
    # A failed execution is no execution, as a backend that fails every request reports none.
    assert (f["inference_count"], f["execution_count"], f["batch_stats"]) == (0, 0, [])


def test_bad_requests_never_reach_the_counts(server: openinfer.Server) -> None:
    """Requests refused before the model (malformed, wrong datatype or shape, unknown version)
    count neither as success nor as failure, as in Triton."""
    assert infer(server, "echo", [1.5], datatype="FP32").status_code == 400
    assert infer(server, "echo", [1, 2], shape=[3]).status_code == 400
    assert requests.post(server.url + "/v2/models/echo/infer", data=b"{not json", timeout=10).status_code == 400
    assert infer(server, "echo", [1], version="9").status_code == 404
    assert infer(server, "rows", [1, 2, 3], shape=[1, 3]).status_code == 400
    body = server.statistics()
    for m in body["model_stats"]:
        s = m["inference_stats"]
        assert (s["success"]["count"], s["fail"]["count"], m["execution_count"]) == (0, 0, 0), m


def test_batch_sizes_under_dynamic_batching(server: openinfer.Server) -> None:
    with ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda i: infer(server, "batched", [i, i], shape=[1, 2]), range(4)))
    assert [r.status_code for r in rs] == [200] * 4
    assert infer(server, "batched", list(range(16)), shape=[8, 2]).status_code == 200
    b = stats_of(server.statistics("batched"), "batched")
    assert (b["inference_count"], b["execution_count"]) == (12, 2)
    assert b["inference_stats"]["success"]["count"] == 5
    assert [x["batch_size"] for x in b["batch_stats"]] == [4, 8]
    for x in b["batch_stats"]:
        assert [x[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")] == [1, 1, 1]
    # The four rows were copied into one batch: that is its compute_input.
    assert b["batch_stats"][0]["compute_input"]["ns"] > 0
    # Without dynamic batching a batching model runs each request alone, its rows its size.
    for rows in (2, 2, 5):
        assert infer(server, "rows", list(range(2 * rows)), shape=[rows, 2]).status_code == 200
    r = stats_of(server.statistics("rows"), "rows")
    assert (r["inference_count"], r["execution_count"]) == (9, 3)
    assert [(x["batch_size"], x["compute_infer"]["count"]) for x in r["batch_stats"]] == [(2, 2), (5, 1)]


def test_selection_and_order(server: openinfer.Server) -> None:
    everything = requests.get(server.url + "/v2/models/stats", timeout=10)
    assert everything.status_code == 200 and everything.headers["content-type"] == "application/json"
    names = [(m["name"], m["version"]) for m in everything.json()["model_stats"]]
    assert names == [("batched", "1"), ("echo", "1"), ("echo", "2"), ("refuse", "1"), ("rows", "1")]
    assert everything.json() == server.statistics()
    both = requests.get(server.url + "/v2/models/echo/stats", timeout=10).json()
    assert [m["version"] for m in both["model_stats"]] == ["1", "2"]
    one = requests.get(server.url + "/v2/models/echo/versions/2/stats", timeout=10).json()
    assert [m["version"] for m in one["model_stats"]] == ["2"]
    assert one == server.statistics("echo", 2) == server.statistics("echo", "2")


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/v2/models/nope/stats", 400, "requested model 'nope' is not available"),
        ("/v2/models/echo/versions/7/stats", 400, "requested model version is not available for model 'echo'"),
        ("/v2/models/echo/versions/x1/stats", 400, "failed to get model version from specified version string 'x1'"),
        ("/v2/models/echo/stats/more", 404, "no endpoint at /v2/models/echo/stats/more"),
    ],
)
def test_bad_selection_http(server: openinfer.Server, path: str, status: int, message: str) -> None:
    r = requests.get(server.url + path, timeout=10)
    assert r.status_code == status and message in r.json()["error"], r.text
    assert requests.get(server.url + "/v2/health/live", timeout=10).status_code == 200


def test_bad_selection_clients(server: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    h = httpclient.InferenceServerClient(server.url[len("http://"):])
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available"):
        h.get_inference_statistics("nope")
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        g.get_inference_statistics("echo", "3")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "requested model version is not available for model 'echo'" in e.value.message()
    with pytest.raises(InferenceServerException, match="version should be an integral value > 0"):
        g.get_inference_statistics("echo", "-1")
    with pytest.raises(openinfer.InferenceServerError) as pe:
        server.statistics("nope")
    assert pe.value.status == 400 and pe.value.message == "requested model 'nope' is not available"
    with pytest.raises(ValueError, match="needs a model"):
        server.statistics(version=1)


def test_method_not_allowed(server: openinfer.Server) -> None:
    for path in ("/v2/models/stats", "/v2/models/echo/stats"):
        r = requests.post(server.url + path, timeout=10)
        assert r.status_code == 405 and "use GET" in r.json()["error"]


def test_grpc_statistics_match_http(server: openinfer.Server) -> None:
    import tritonclient.grpc as grpcclient

    for n in (2, 4):
        assert infer(server, "echo", list(range(n)), version="2").status_code == 200
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: infer(server, "batched", [i, i], shape=[1, 2]), range(4)))
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = np.arange(3, dtype=np.int32)
    inp = grpcclient.InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(g.infer("echo", [inp], model_version="2").as_numpy("OUTPUT0"), x)

    proto = g.get_inference_statistics("echo", "2")
    assert len(proto.model_stats) == 1
    m = proto.model_stats[0]
    assert (m.name, m.version, m.inference_count, m.execution_count) == ("echo", "2", 3, 3)
    assert m.inference_stats.success.count == 3 and m.inference_stats.fail.count == 0
    assert [b.batch_size for b in m.batch_stats] == [1]
    everything = g.get_inference_statistics(as_json=True)
    http_body = server.statistics()
    assert [(s["name"], s["version"]) for s in everything["model_stats"]] == [
        (s["name"], s["version"]) for s in http_body["model_stats"]]
    batched = [s for s in everything["model_stats"] if s["name"] == "batched"][0]
    # protobuf's JSON writes 64-bit integers as strings.
    assert int(batched["inference_count"]) == 4 and int(batched["execution_count"]) == 1
    assert [int(b["batch_size"]) for b in batched["batch_stats"]] == [4]
    assert int(batched["inference_stats"]["success"]["count"]) == 4


def test_grpc_malformed_request(server: openinfer.Server) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelStatistics")
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a\xff\xff", timeout=10)  # field 1 claims more bytes than there are
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed ModelStatisticsRequest" in e.value.details()
        assert call(b"", timeout=10).startswith(b"\x0a")  # the server still answers


def test_statistics_off() -> None:
    with openinfer.serve(models=models(), http_port=0, log=False, statistics=False) as srv:
        assert infer(srv, "echo", [1]).status_code == 200
        r = requests.get(srv.url + "/v2/models/echo/stats", timeout=10)
        assert r.status_code == 503 and r.json()["error"] == "the server does not support model statistics"
        assert "statistics" not in requests.get(srv.url + "/v2", timeout=10).json()["extensions"]
        with pytest.raises(openinfer.InferenceServerError, match="does not support model statistics"):
            srv.statistics()
        families = scrape(srv)
        assert "nv_inference_request_success" not in families and "nv_cpu_utilization" in families
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        assert "statistics" in requests.get(srv.url + "/v2", timeout=10).json()["extensions"]


# ---- metrics ------------------------------------------------------------------------------------


def test_metrics_counters_match_what_was_sent(server: openinfer.Server) -> None:
    for n in (1, 2, 3, 4):
        assert infer(server, "echo", list(range(n))).status_code == 200
    assert infer(server, "refuse", [1]).status_code == 500
    assert infer(server, "echo", [0.5], datatype="FP32").status_code == 400  # never reaches the model
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: infer(server, "batched", [i, i], shape=[1, 2]), range(4)))

    f = scrape(server)
    echo1 = {"model": "echo", "version": "1"}
    assert sample(f, "nv_inference_request_success", "nv_inference_request_success_total", **echo1) == 4
    assert sample(f, "nv_inference_count", "nv_inference_count_total", **echo1) == 4
    assert sample(f, "nv_inference_exec_count", "nv_inference_exec_count_total", **echo1) == 4
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert sample(f, "nv_inference_request_failure", "nv_inference_request_failure_total", reason=reason,
                      **echo1) == 0
    refuse_labels = {"model": "refuse", "version": "1"}
    assert sample(f, "nv_inference_request_failure", "nv_inference_request_failure_total", reason="BACKEND",
                  **refuse_labels) == 1
    assert sample(f, "nv_inference_request_success", "nv_inference_request_success_total", **refuse_labels) == 0
    batched = {"model": "batched", "version": "1"}
    assert sample(f, "nv_inference_count", "nv_inference_count_total", **batched) == 4
    assert sample(f, "nv_inference_exec_count", "nv_inference_exec_count_total", **batched) == 1
    # The duration counters are the statistics' nanoseconds in microseconds.
    st = stats_of(server.statistics("echo", 1), "echo")["inference_stats"]
    for family, key in [("nv_inference_request_duration_us", "success"), ("nv_inference_queue_duration_us", "queue"),
                        ("nv_inference_compute_infer_duration_us", "compute_infer")]:
        assert f[family].type == "counter"
        assert sample(f, family, family + "_total", **echo1) == st[key]["ns"] // 1000
    assert sample(f, "nv_inference_pending_request_count", **echo1) == 0
    assert f["nv_inference_pending_request_count"].type == "gauge"
    assert "nv_inference_first_response_histogram_ms" not in f  # off unless configured
    assert 0 <= sample(f, "nv_cpu_utilization") <= 1
    assert 0 < sample(f, "nv_cpu_memory_used_bytes") <= sample(f, "nv_cpu_memory_total_bytes")
    assert f["nv_inference_request_success"].documentation == "Number of successful inference requests, all batch sizes"


def test_metrics_text_is_tritons() -> None:
    """Family order, HELP and TYPE lines, label order and number format as Triton writes them
    (prometheus-cpp): counters, then gauges, then histograms; labels sorted by name."""
    with openinfer.serve(models=[Model("echo", echo, **ONE_INT)], http_port=0, log=False,
                         allow_cpu_metrics=False, allow_gpu_metrics=False) as srv:
        assert infer(srv, "echo", [1, 2]).status_code == 200
        text = requests.get(srv.metrics_url, timeout=10).text
    lines = text.splitlines()
    assert lines[:3] == [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="echo",version="1"} 1',
    ]
    assert 'nv_inference_request_failure{model="echo",reason="BACKEND",version="1"} 0' in lines
    families = [ln.split()[2] for ln in lines if ln.startswith("# TYPE")]
    assert families == [
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
        "nv_model_load_duration_secs", "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
    ]
    assert not any(ln.startswith("nv_cpu") or ln.startswith("nv_gpu") for ln in lines)


def test_metrics_config_histograms_and_no_counter_latencies() -> None:
    with openinfer.serve(models=models(), http_port=0, log=False,
                         metrics_config=["histogram_latencies=true", "counter_latencies=false"]) as srv:
        for _ in range(3):
            assert infer(srv, "echo", [1]).status_code == 200
        assert infer(srv, "refuse", [1]).status_code == 500
        f = scrape(srv)
    assert "nv_inference_request_duration_us" not in f and "nv_inference_queue_duration_us" not in f
    h = f["nv_inference_first_response_histogram_ms"]
    assert h.type == "histogram"
    echo1 = {"model": "echo", "version": "1"}
    name = "nv_inference_first_response_histogram_ms"
    assert sample(f, name, name + "_count", **echo1) == 3
    assert sample(f, name, name + "_bucket", le="+Inf", **echo1) == 3
    buckets = [s for s in h.samples if s.name == name + "_bucket" and s.labels["model"] == "echo"
               and s.labels["version"] == "1"]
    assert [s.labels["le"] for s in buckets] == ["100", "500", "2000", "5000", "+Inf"]  # as prometheus-cpp writes them
    counts = [s.value for s in buckets]
    assert counts == sorted(counts)  # cumulative
    # Failures get a first (error) response too, as in Triton.
    assert sample(f, name, name + "_count", model="refuse", version="1") == 1


def test_pending_request_count() -> None:
    gate = Gate()
    with openinfer.serve(models=models(gate), http_port=0, log=False) as srv, ThreadPoolExecutor(4) as pool:
        labels = {"model": "gated", "version": "1"}
        try:
            running = pool.submit(infer, srv, "gated", [0])
            assert gate.entered.wait(30)
            queued = [pool.submit(infer, srv, "gated", [i]) for i in (1, 2, 3)]
            wait_for(lambda: sample(scrape(srv), "nv_inference_pending_request_count", **labels) == 3,
                       "three queued requests")
        finally:
            gate.open.set()
        assert [r.result().status_code for r in [running, *queued]] == [200] * 4
        f = scrape(srv)
        assert sample(f, "nv_inference_pending_request_count", **labels) == 0
        assert sample(f, "nv_inference_request_success", "nv_inference_request_success_total", **labels) == 4
        g = stats_of(srv.statistics("gated"), "gated")["inference_stats"]
        # The three waited behind the first: their queue time is in the statistics.
        assert g["queue"]["count"] == 4 and g["queue"]["ns"] > 0


def test_metrics_listener_routes(server: openinfer.Server) -> None:
    assert requests.get(server.metrics_url.removesuffix("/metrics") + "/metrics/", timeout=10).status_code == 200
    # As Triton's metrics listener: other paths answer 200 with nothing, other methods 405.
    r = requests.get(server.metrics_url.removesuffix("/metrics") + "/v2/health/live", timeout=10)
    assert r.status_code == 200 and r.content == b"" and r.headers["content-type"].startswith("text/plain")
    r = requests.post(server.metrics_url, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "GET" and r.json() == {"error": "Method Not Allowed"}
    assert requests.get(server.metrics_url, timeout=10).status_code == 200  # still serving


def test_metrics_port_options() -> None:
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        # With http_port=0 the metrics listener takes a free port too.
        assert srv.metrics_port not in (None, 0, 8002)
        assert srv.metrics_url == f"http://127.0.0.1:{srv.metrics_port}/metrics"
    for off in (0, None):
        with openinfer.serve(models=models(), http_port=0, log=False, metrics_port=off) as srv:
            assert srv.metrics_port is None and srv.metrics_url is None
    with openinfer.serve(models=models(), http_port=0, log=False) as a:
        with pytest.raises(OSError, match=f"metrics: cannot listen on 127.0.0.1:{a.metrics_port}"):
            openinfer.serve(models=models(), http_port=0, log=False, metrics_port=a.metrics_port)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (["histogram_latencies"], "expected <setting>=<value>"),
        (["histogram_latencies="], "expected <setting>=<value>"),
        (["m,histogram_latencies=true"], "expected <setting>=<value>"),
        ({"histogram_latency": True}, "unknown setting 'histogram_latency'"),
        ({"histogram_latencies": "maybe"}, "histogram_latencies must be true or false"),
        # (a quantile pair tritonserver cannot read is logged and left out: test_triton_conformance.py)
    ],
)
def test_metrics_config_errors(config: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        openinfer.serve(models=models(), http_port=0, log=False, metrics_config=config)


@pytest.mark.gpu
def test_gpu_metrics_through_nvml() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pytest.skip("no NVML (libnvidia-ml.so.1) on this machine: GPU metrics are absent, as designed")
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        f = scrape(srv)
    if "nv_gpu_memory_total_bytes" not in f:
        pytest.skip("NVML loads but reports no GPU this process may use")
    for s in f["nv_gpu_memory_total_bytes"].samples:
        assert s.labels["gpu_uuid"].startswith("GPU-") and s.value > 0
    for s in f["nv_gpu_utilization"].samples:
        assert 0 <= s.value <= 1


def test_cli_flags(tmp_path: Any) -> None:
    from openinfer import cli

    args = cli._parser().parse_args(["serve", "--allow-metrics=false", "--metrics-config", "histogram_latencies=on",
                                     "--allow-statistics", "off", "--allow-gpu-metrics", "0"])
    assert (args.allow_metrics, args.allow_statistics, args.allow_gpu_metrics, args.allow_cpu_metrics) == (
        False, False, False, True)
    assert args.metrics_config == ["histogram_latencies=on"]
    assert cli._parser().parse_args(["serve", "--allow-metrics"]).allow_metrics is True
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["serve", "--allow-metrics=maybe"])
    assert cli.main(["serve", str(tmp_path), "--http-port", "0", "--metrics-config", "nope=1"]) == 1


def test_statistics_json_body_is_valid_for_odd_names() -> None:
    name = 'we"ird\\na\u00efme'
    with openinfer.serve(models=[Model(name, echo, **ONE_INT)], http_port=0, log=False) as srv:
        body = json.loads(requests.get(srv.url + "/v2/models/stats", timeout=10).content)
        assert body["model_stats"][0]["name"] == name
        f = scrape(srv)
        assert sample(f, "nv_inference_count", "nv_inference_count_total", model=name, version="1") == 0


def test_unready_model_has_no_statistics(tmp_path: Any) -> None:
    """A model that failed to load is not ready: Triton reports no statistics for it."""
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.py").write_text("def infer(inputs):\n    return {\n")
    with openinfer.serve(tmp_path, models=[Model("echo", echo, **ONE_INT)], http_port=0, log=False) as srv:
        assert srv.failed.keys() == {"broken"}
        r = requests.get(srv.url + "/v2/models/broken/stats", timeout=10)
        assert r.status_code == 400 and r.json()["error"] == "requested model 'broken' is not available"
        assert [m["name"] for m in srv.statistics()["model_stats"]] == ["echo"]
        assert "broken" not in requests.get(srv.metrics_url, timeout=10).text


def test_cli_serves_metrics_as_configured() -> None:
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "openinfer", "serve", "--http-port", "0", "--threads", "1",
         "--metrics-config", "histogram_latencies=true", "--allow-cpu-metrics=false"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            m = re.search(r"metrics at (http://\S+/metrics)", line)
            if m:
                url.append(m.group(1))
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(60), "".join(lines)
        f = {x.name: x for x in prometheus_parser.text_string_to_metric_families(requests.get(url[0], timeout=10).text)}
        assert "nv_inference_first_response_histogram_ms" in f and "nv_cpu_utilization" not in f
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_pending_includes_a_forming_batch(server: openinfer.Server) -> None:
    """Requests waiting in a dynamic batch that is still forming are pending, as in Triton's
    batcher, until the batch runs."""
    labels = {"model": "batched", "version": "1"}
    with ThreadPoolExecutor(4) as pool:
        first = [pool.submit(infer, server, "batched", [i, i], shape=[1, 2]) for i in (0, 1)]
        wait_for(lambda: sample(scrape(server), "nv_inference_pending_request_count", **labels) == 2,
                   "two requests in the forming batch")
        assert not any(f.done() for f in first)
        rest = [pool.submit(infer, server, "batched", [i, i], shape=[1, 2]) for i in (2, 3)]
        assert [f.result().status_code for f in first + rest] == [200] * 4
    f = scrape(server)
    assert sample(f, "nv_inference_pending_request_count", **labels) == 0
    assert sample(f, "nv_inference_exec_count", "nv_inference_exec_count_total", **labels) == 1


ADD_ONE_CONFIG = """
name: "add_one"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def test_statistics_follow_loads_and_unloads(tmp_path: Any) -> None:
    """A loaded version starts counting from zero (as Triton's does), an unloaded one has no
    statistics and leaves the metrics, and the counts of other models are untouched."""
    (tmp_path / "add_one" / "1").mkdir(parents=True)
    (tmp_path / "add_one" / "config.pbtxt").write_text(ADD_ONE_CONFIG)
    (tmp_path / "add_one" / "1" / "model.py").write_text("def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0'] + 1}\n")
    with openinfer.serve(tmp_path, models=[Model("echo", echo, **ONE_INT)], http_port=0, log=False,
                         model_control_mode="explicit") as srv:
        with pytest.raises(openinfer.InferenceServerError, match="requested model 'add_one' is not available"):
            srv.statistics("add_one")
        srv.load_model("add_one")
        for _ in range(3):
            assert infer(srv, "add_one", [1, 2]).status_code == 200
        assert infer(srv, "echo", [1]).status_code == 200
        assert stats_of(srv.statistics("add_one"), "add_one")["inference_count"] == 3
        srv.load_model("add_one")  # a reload: a new version object, counting anew
        assert infer(srv, "add_one", [1]).status_code == 200
        assert stats_of(srv.statistics("add_one"), "add_one")["inference_count"] == 1
        srv.unload_model("add_one")
        r = requests.get(srv.url + "/v2/models/add_one/stats", timeout=10)
        assert r.status_code == 400 and r.json()["error"] == "requested model 'add_one' is not available"
        assert 'model="add_one"' not in requests.get(srv.metrics_url, timeout=10).text
        assert stats_of(srv.statistics("echo"), "echo")["inference_count"] == 1
