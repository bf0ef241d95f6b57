"""What a model configuration may ask for is bounded before it is paid (issue 38, point 1): a
load override (untrusted: it comes over the network) or a config.pbtxt that asks for millions of
instances, batch rows, queued requests, sequence slots, ensemble steps or warm-up runs is
refused, naming the field and the bound (--max-instances for instances of a load), before
anything is allocated or started.

The server runs in a subprocess whose address space is capped (prlimit --as) at a few times
what it needs, so that a regression fails the test (the load then answers 500, or the server
dies) instead of taking the machine down. Not under AddressSanitizer (make test-asan), whose
shadow memory reserves terabytes of address space: the plain run, first, holds the cap."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from conftest import INT32_IO, Cli, python_model

BOUND = 60.0  # seconds: a bound for a hung test, not a measurement
# A server with a Python model peaks near 0.65 GB of address space here; before the bounds, an
# override of 10,000,000 instances grew it past 2 GB.
ADDRESS_SPACE = 2 << 30
ASAN = "asan" in os.environ.get("LD_PRELOAD", "")
MAX_INSTANCES = 32
MODEL = "def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0'] + 1}\n"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("limits")
    python_model(repo, "add", MODEL, "instance_group [ { kind: KIND_MODEL } ]\n")
    python_model(repo, "huge", MODEL, "instance_group [ { count: 100000000 kind: KIND_MODEL } ]\n")
    python_model(repo, "queued", MODEL, "max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
                           "priority_queue_policy { key: 2 value { max_queue_size: 99999999 } } }\n")
    cap = [] if ASAN else ["prlimit", f"--as={ADDRESS_SPACE}"]
    argv = [*cap, sys.executable, "-m", "openinfer", "serve", "--http-port", "0",
            "--threads", "1", "--model-control-mode", "explicit", "--load-model", "add", "--load-model", "huge",
            "--load-model", "queued",
            "--max-instances", str(MAX_INSTANCES), str(repo)]
    cli = Cli(argv=argv)
    try:
        yield f"http://127.0.0.1:{cli.port}"
        assert cli.proc.poll() is None, cli.output()
    finally:
        cli.kill()


def _load(url: str, name: str, config: dict[str, Any]) -> requests.Response:
    body = {"parameters": {"config": json.dumps({"name": name, "backend": "python", **INT32_IO, **config})}}
    return requests.post(f"{url}/v2/repository/models/{name}/load", json=body, timeout=BOUND)


def _infer(url: str, name: str) -> int:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [41]}]}
    r = requests.post(f"{url}/v2/models/{name}/infer", json=body, timeout=BOUND)
    assert r.status_code == 200, r.text
    return int(r.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize(
    ("groups", "asked"),
    [
        ([{"count": 10_000_000}], 10_000_000),
        ([{"count": 50_000_000, "kind": "KIND_MODEL"}], 50_000_000),
        ([{"count": 2_147_483_647}, {"count": 2_147_483_647}], 4_294_967_294),  # 32-bit overflow
        ([{"count": 100_000, "kind": "KIND_GPU", "gpus": [0, 1, 2, 3]}], 400_000),  # count on each GPU
    ],
)
def test_an_override_asking_for_millions_of_instances_is_refused_at_once(
    url: str, groups: list[dict[str, Any]], asked: int
) -> None:
    r = _load(url, "add", {"instance_group": groups})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == (f"failed to load 'add': instance_group count {asked} exceeds the server's limit "
                                 f"of {MAX_INSTANCES} instances (--max-instances)")
    assert _infer(url, "add") == 42  # the model as it was, the server up


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_batch_size": 2_000_000}, "max_batch_size 2000000 is more than openinfer allows (1048576 rows per batch)"),
        ({"max_batch_size": 8, "dynamic_batching": {"default_queue_policy": {"max_queue_size": 4_000_000_000}}},
         "dynamic_batching.default_queue_policy.max_queue_size 4000000000 is more than openinfer allows "
         "(16777216 queued requests)"),
        ({"max_batch_size": 8, "instance_group": [{"count": 4, "kind": "KIND_MODEL"}],
          "sequence_batching": {"oldest": {"max_candidate_sequences": 1_000_000}}},
         "sequence_batching: 1000000 slots (oldest.max_candidate_sequences) x 4 instances = 4000000 is more than "
         "openinfer allows (1048576 sequence slots)"),
        ({"sequence_batching": {"state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
                                           "dims": [100_000, 100_000]}]}},
         "sequence_batching.state[0].dims [100000, 100000]: up to 80000000000 is more than openinfer allows "
         "(1073741824 bytes of one state)"),
        ({"max_batch_size": 8, "model_warmup": [{"name": "w", "batch_size": 1_000_000_000, "inputs": {
            "INPUT0": {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}}}]},
         "model_warmup[0].batch_size 1000000000 is more than openinfer allows (1048576 rows per batch)"),
        ({"model_warmup": [{"name": "w", "batch_size": 1, "count": 1_000_000_000, "inputs": {
            "INPUT0": {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}}}]},
         "model_warmup[0].count 1000000000 is more than openinfer allows (65536 runs of a sample)"),
    ],
    ids=["batch", "queue", "sequence-slots", "state", "warmup-batch", "warmup-count"],
)
def test_an_override_past_a_fixed_bound_is_refused_naming_the_field(
    url: str, config: dict[str, Any], message: str
) -> None:
    r = _load(url, "add", config)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == f"failed to load 'add': Invalid config override: {message}"
    assert _infer(url, "add") == 42


def test_an_ensemble_of_too_many_steps_is_refused(url: str) -> None:
    step = {"model_name": "add", "input_map": {"INPUT0": "INPUT0"}, "output_map": {"OUTPUT0": "OUTPUT0"}}
    config = {"name": "chain", "platform": "ensemble", **INT32_IO, "ensemble_scheduling": {"step": [step] * 5000}}
    body = {"parameters": {"config": json.dumps(config)}}
    r = requests.post(f"{url}/v2/repository/models/chain/load", json=body, timeout=BOUND)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == ("failed to load 'chain': Invalid config override: ensemble_scheduling.step count "
                                 "5000 is more than openinfer allows (1024 steps)")


def test_a_repository_config_past_the_bound_fails_that_model_only(url: str) -> None:
    # The repository's config.pbtxt is bounded too: the model is not served, with the reason.
    index = {m["name"]: m for m in requests.post(f"{url}/v2/repository/index", timeout=BOUND).json()}
    for name, reason in [
        ("huge", "instance_group count 100000000 is more than openinfer allows (16384 instances of one model)"),
        ("queued", "dynamic_batching.priority_queue_policy[2].max_queue_size 99999999 is more than openinfer "
                   "allows (16777216 queued requests)"),
    ]:
        assert index[name]["state"] == "UNAVAILABLE"
        assert index[name]["reason"].endswith(f"config.pbtxt: {reason}"), index[name]
        r = requests.post(f"{url}/v2/repository/models/{name}/load", timeout=BOUND)
        assert r.status_code == 400 and reason in r.json()["error"], r.text
    assert _infer(url, "add") == 42
