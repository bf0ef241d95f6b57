"""The metrics families and flags beyond the per-request counters (see test_statistics.py for
those): nv_model_load_duration_secs, the pinned memory pool, latency summaries
(--metrics-config summary_latencies=true, summary_quantiles), --metrics-address,
--metrics-interval-ms, and what the metrics listener answers off /metrics, as tritonserver."""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Model

from conftest import wait_for
from test_statistics import ONE_INT, echo, infer, models, sample, scrape

prometheus_parser = pytest.importorskip("prometheus_client.parser")

SUMMARIES = ["nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us"]


def test_load_duration_and_pinned_memory_families() -> None:
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        f = scrape(srv)
    loads = {(s.labels["model"], s.labels["version"]): s.value for s in f["nv_model_load_duration_secs"].samples}
    assert set(loads) == {("echo", "1"), ("echo", "2"), ("refuse", "1"), ("batched", "1"), ("rows", "1")}
    assert all(0 < v < 600 for v in loads.values())
    assert f["nv_model_load_duration_secs"].type == "gauge"
    # No pinned memory pool: 0 bytes, as tritonserver with --pinned-memory-pool-byte-size 0.
    assert sample(f, "nv_pinned_memory_pool_total_bytes") == 0
    assert sample(f, "nv_pinned_memory_pool_used_bytes") == 0


SLOW_MODEL = '''
import time

import numpy as np

time.sleep(0.4)  # a slow load


def infer(inputs):
    return {"OUTPUT0": inputs["INPUT0"]}
'''

SLOW_CONFIG = '''
name: "slow"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''


def test_load_duration_follows_loads(tmp_path: Path) -> None:
    """A model that takes at least 0.4 s to load reports at least that; a version loaded
    through the repository API gets its series, an unloaded one loses it."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    with openinfer.serve(tmp_path, http_port=0, log=False, model_control_mode="explicit") as srv:
        assert "nv_model_load_duration_secs" not in scrape(srv)
        r = requests.post(f"{srv.url}/v2/repository/models/slow/load", timeout=60)
        assert r.status_code == 200, r.text
        assert sample(scrape(srv), "nv_model_load_duration_secs", model="slow", version="1") >= 0.4
        assert requests.post(f"{srv.url}/v2/repository/models/slow/unload", timeout=60).status_code == 200
        wait_for(lambda: "nv_model_load_duration_secs" not in scrape(srv), "the unloaded model's series to go")


class Durations:
    """Echo that takes as long as each request's first element says, in milliseconds."""

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(int(inputs["INPUT0"][0]) / 1000)
        return {"OUTPUT0": inputs["INPUT0"]}


def test_latency_summaries() -> None:
    config = ["summary_latencies=true", "summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001"]
    ms = [0] * 18 + [600, 600]  # 90% quick, 10% at least 600 ms in the model
    with openinfer.serve(models=[Model("timed", Durations(), **ONE_INT), Model("idle", echo, **ONE_INT)],
                         http_port=0, log=False, metrics_config=config) as srv:
        for m in ms:
            assert infer(srv, "timed", [m]).status_code == 200
        text = requests.get(srv.metrics_url, timeout=10).text
    f = {fam.name: fam for fam in prometheus_parser.text_string_to_metric_families(text)}
    for name in SUMMARIES:
        assert f[name].type == "summary"
        timed = {"model": "timed", "version": "1"}
        assert sample(f, name, name + "_count", **timed) == len(ms)
        quantiles = {s.labels["quantile"]: s.value for s in f[name].samples
                     if s.name == name and s.labels["model"] == "timed"}
        assert list(quantiles) == ["0.5", "0.9", "0.99"]
        assert quantiles["0.5"] <= quantiles["0.9"] <= quantiles["0.99"]
        # A model with no request in the last minute: Nan, as prometheus-cpp writes an empty summary.
        idle = [s.value for s in f[name].samples if s.name == name and s.labels["model"] == "idle"]
        assert len(idle) == 3 and all(math.isnan(v) for v in idle)
    # _sum is the same total as the *_duration_us counter.
    infer_sum = sample(f, "nv_inference_compute_infer_summary_us", "nv_inference_compute_infer_summary_us_sum",
                       model="timed", version="1")
    assert infer_sum == sample(f, "nv_inference_compute_infer_duration_us",
                               "nv_inference_compute_infer_duration_us_total", model="timed", version="1")
    q = {s.labels["quantile"]: s.value for s in f["nv_inference_compute_infer_summary_us"].samples
         if s.name == "nv_inference_compute_infer_summary_us" and s.labels["model"] == "timed"}
    # The slowest 10% slept 600 ms in the model: the 0.99 quantile is at least that, within
    # the estimate's 3%; the median request did not sleep.
    assert q["0.99"] >= 600_000 * 0.97
    assert q["0.5"] < 600_000 * 0.97
    # Summaries stay off unless asked for.
    with openinfer.serve(models=[Model("timed", echo, **ONE_INT)], http_port=0, log=False) as srv:
        assert infer(srv, "timed", [1]).status_code == 200
        assert not any(name in scrape(srv) for name in SUMMARIES)


@pytest.mark.parametrize("config,message", [
    (["summary_quantiles=" + ",".join(f"0.{i}:0.01" for i in range(1, 18))], "at most 16 quantiles"),
    ({"summary_latencies": "sometimes"}, "summary_latencies must be true or false"),
])
def test_summary_config_errors(config: Any, message: str) -> None:
    with pytest.raises(ValueError) as e:
        openinfer.serve(models=models(), http_port=0, log=False, metrics_config=config)
    assert message in str(e.value)


def test_metrics_address() -> None:
    """The metrics listener binds --metrics-address; the API stays on --host."""
    with openinfer.serve(models=models(), http_port=0, log=False, metrics_address="127.0.0.2") as srv:
        assert srv.metrics_url == f"http://127.0.0.2:{srv.metrics_port}/metrics"
        assert requests.get(srv.metrics_url, timeout=10).status_code == 200
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.metrics_port), timeout=5).close()
        assert requests.get(srv.url + "/v2/health/live", timeout=10).status_code == 200
    # An address of no interface here (TEST-NET-1): the bind fails, nothing is sent anywhere.
    with pytest.raises(OSError, match="metrics: cannot listen on 192.0.2.1"):
        openinfer.serve(models=models(), http_port=0, log=False, metrics_address="192.0.2.1")


def test_metrics_interval() -> None:
    """CPU readings are refreshed by a poller, not by scrapes: with an interval of hours, two
    scrapes show the same reading whatever happens between them; with a short one the
    reading moves."""
    with openinfer.serve(models=models(), http_port=0, log=False, metrics_interval_ms=36_000_000) as srv:
        first = sample(scrape(srv), "nv_cpu_memory_used_bytes")
        ballast = np.ones(64 << 20, np.uint8)  # 64 MiB touched
        second = sample(scrape(srv), "nv_cpu_memory_used_bytes")
        del ballast
        assert first == second
    with openinfer.serve(models=models(), http_port=0, log=False, metrics_interval_ms=20) as srv:
        first = sample(scrape(srv), "nv_cpu_memory_used_bytes")
        ballast = np.ones(64 << 20, np.uint8)
        wait_for(lambda: sample(scrape(srv), "nv_cpu_memory_used_bytes") != first, "a new CPU reading")
        del ballast
    with pytest.raises(ValueError, match="metrics_interval_ms must be at least 1"):
        openinfer.serve(models=models(), http_port=0, log=False, metrics_interval_ms=0)


def test_listener_answers_off_metrics_as_triton() -> None:
    with openinfer.serve(models=models(), http_port=0, log=False) as srv:
        base = srv.metrics_url.removesuffix("/metrics")
        for path in ("/", "/foo", "/metricsx", "/v2/models/echo/infer"):
            r = requests.get(base + path, timeout=10)
            assert (r.status_code, r.content) == (200, b""), path
            assert r.headers["content-type"] == "text/plain; charset=utf-8"
        for method in ("POST", "PUT", "DELETE"):
            for path in ("/metrics", "/foo"):
                r = requests.request(method, base + path, timeout=10)
                assert r.status_code == 405 and r.json() == {"error": "Method Not Allowed"}, (method, path)
        assert "nv_inference_request_success" in requests.get(srv.metrics_url, timeout=10).text


def test_cli_metrics_flags() -> None:
    from openinfer import cli

    args = cli._parser().parse_args(["serve", "--metrics-address", "127.0.0.2", "--metrics-interval-ms", "500",
                                     "--metrics-config", "summary_latencies=true",
                                     "--metrics-config", "summary_quantiles=0.5:0.05"])
    assert (args.metrics_address, args.metrics_interval_ms) == ("127.0.0.2", 500)
    assert args.metrics_config == ["summary_latencies=true", "summary_quantiles=0.5:0.05"]


def test_workers_metrics_listener_answers_as_triton(tmp_path: Path) -> None:
    """`openinfer serve --workers 2 --metrics-address`: the parent's merged /metrics binds
    that address and answers off /metrics as each worker (and tritonserver) does."""
    from conftest import Cli

    metrics_port = socket.create_server(("127.0.0.2", 0))
    port = metrics_port.getsockname()[1]
    metrics_port.close()
    cli = Cli("--workers", "2", "--metrics-port", str(port), "--metrics-address", "127.0.0.2")
    try:
        base = f"http://127.0.0.2:{port}"

        def merged() -> bool:  # the workers may still be starting (slowly, under a sanitizer)
            try:
                return "nv_pinned_memory_pool_total_bytes" in requests.get(base + "/metrics", timeout=30).text
            except requests.RequestException:
                return False

        wait_for(merged, "the workers' metrics", bound=120)
        r = requests.get(base + "/foo", timeout=30)
        assert (r.status_code, r.content) == (200, b"")
        r = requests.post(base + "/metrics", timeout=30)
        assert r.status_code == 405 and r.json() == {"error": "Method Not Allowed"}
    finally:
        cli.kill()
