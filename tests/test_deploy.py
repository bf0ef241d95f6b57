"""deploy/: what can be checked here without a container runtime or a cluster.

- The Helm chart renders (tests/helm_render.py stands in for `helm template`) and every
  manifest validates against the Kubernetes 1.37 JSON schemas (kubernetes-validate, strict:
  unknown fields are errors).
- The KServe ServingRuntime and InferenceService validate against KServe's API types (the
  model classes of the `kserve` package: every field known, every type right; the Kubernetes
  types inside them against the Kubernetes schemas).
- The command lines the Dockerfiles, the chart and the runtime give the container run here as
  they are (only the model path, the ports and the listen address are swapped for local ones):
  the server serves the example repository over HTTP, gRPC and /metrics, and SIGTERM drains
  it. (They run as this test's user: the interpreter here lives under /root, out of uid 1000's
  reach; the images' USER and the pod's securityContext are checked to be non-root instead.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import sys
import types
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import yaml
from referencing import Registry, Resource

import openinfer

import helm_render
from conftest import Cli, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "openinfer"
K8S_VERSION = "1.37.0"


def k8s_validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# ----------------------------------------------------------------------------- Helm


CHART_VARIANTS = {
    "defaults": {},
    "grpc probe, queue autoscaling, extra args, GPU": {
        "readinessProbe": {"protocol": "grpc"},
        "autoscaling": {"metric": "queue"},
        "extraArgs": ["--model-control-mode", "explicit", "--load-model", "*"],
        "image": {"tag": "cuda"},
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "fixed replicas, no PDB": {"autoscaling": {"enabled": False}, "podDisruptionBudget": {"enabled": False}},
}


@pytest.mark.parametrize("values", CHART_VARIANTS.values(), ids=CHART_VARIANTS.keys())
def test_chart_renders_valid_kubernetes_manifests(values: dict[str, Any]) -> None:
    docs = helm_render.render(CHART, "oi", values)
    kinds = sorted(d["kind"] for d in docs)
    want = {"Deployment", "Service"}
    if values.get("autoscaling", {}).get("enabled", True):
        want.add("HorizontalPodAutoscaler")
    if values.get("podDisruptionBudget", {}).get("enabled", True):
        want.add("PodDisruptionBudget")
    assert kinds == sorted(want)
    for doc in docs:
        k8s_validate(doc)


def test_chart_wiring() -> None:
    docs = {d["kind"]: d for d in helm_render.render(CHART, "oi")}
    deploy, svc = docs["Deployment"], docs["Service"]
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # The selector picks the pods; the Service, HPA and PDB point at them.
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    assert "replicas" not in deploy["spec"]  # the HPA owns it
    # Probes reach the ports the server is told to listen on.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = c["args"]
    assert int(args[args.index("--http-port") + 1]) == ports["http"]
    assert int(args[args.index("--grpc-port") + 1]) == ports["grpc"]
    assert int(args[args.index("--metrics-port") + 1]) == ports["metrics"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == set(ports)
    # The pod outlives its drain: grace + in-flight time < terminationGracePeriodSeconds.
    drain = float(args[args.index("--drain-grace-secs") + 1])
    shutdown = float(args[args.index("--shutdown-timeout") + 1])
    assert drain + shutdown < pod["terminationGracePeriodSeconds"]
    # The drain is long enough for readiness to be seen failing.
    probe = c["readinessProbe"]
    assert drain >= probe["periodSeconds"] * probe["failureThreshold"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    grpc_probe = {d["kind"]: d for d in helm_render.render(CHART, "oi", {"readinessProbe": {"protocol": "grpc"}})}
    probe = grpc_probe["Deployment"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["grpc"] == {"port": ports["grpc"]}  # grpc.health.v1, served by openinfer


def test_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("name: x\nversion: 0.1.0\n")
    (tmp_path / "values.yaml").write_text("a: 1\n")
    (tmp_path / "templates" / "x.yaml").write_text("v: {{ .Values.a | b64enc }}\n")
    with pytest.raises(helm_render.TemplateError, match="b64enc"):
        helm_render.render(tmp_path)
    (tmp_path / "templates" / "x.yaml").write_text("{{- if .Values.a }}\nv: 1\n")
    with pytest.raises(helm_render.TemplateError, match="end"):
        helm_render.render(tmp_path)


# ----------------------------------------------------------------------------- KServe


def _kserve_models() -> types.ModuleType:
    """kserve.models without running kserve/__init__.py (which starts importing the whole
    model server: fastapi, uvicorn, ...): a bare package object stands in for `kserve`."""
    spec = importlib.util.find_spec("kserve")
    assert spec is not None and spec.submodule_search_locations, "kserve is not installed (requirements-schemas.txt)"
    if "kserve" not in sys.modules:
        pkg = types.ModuleType("kserve")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = pkg
    return importlib.import_module("kserve.models")


class _Schemas:
    """Checks a manifest against KServe's API types: the `openapi_types` / `attribute_map` of
    its generated model classes; Kubernetes types inside them (V1Container, ...) against the
    Kubernetes JSON schemas' definitions."""

    def __init__(self) -> None:
        self.models = _kserve_models()
        root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
        version = max(p.name for p in root.iterdir() if p.name.endswith("-local-strict") and p.name.startswith("v1.37"))
        defs_doc = json.loads((root / version / "_definitions.json").read_text())
        self.defs = defs_doc["$defs"]
        self.registry = Resource.from_contents(defs_doc) @ Registry()
        self.defs_uri = defs_doc.get("$id", "")

    def k8s_definition(self, type_name: str) -> str:
        version, kind = re.fullmatch(r"V(\d+(?:alpha\d+|beta\d+)?)(\w+)", type_name).groups()
        hits = [k for k in self.defs if k.endswith(f".v{version}.{kind}")]
        core = [k for k in hits if k.startswith("io.k8s.api.core.")]
        assert len(core or hits) == 1, (type_name, hits)
        return (core or hits)[0]

    def check(self, value: Any, type_name: str, path: str) -> None:
        list_of = re.fullmatch(r"list\[(.+)\]", type_name)
        dict_of = re.fullmatch(r"dict\(str, (.+)\)", type_name)
        if list_of:
            assert isinstance(value, list), f"{path}: expected a list, got {value!r}"
            for i, v in enumerate(value):
                self.check(v, list_of.group(1), f"{path}[{i}]")
        elif dict_of:
            assert isinstance(value, dict), f"{path}: expected a map, got {value!r}"
            for k, v in value.items():
                self.check(v, dict_of.group(1), f"{path}.{k}")
        elif type_name in ("str", "int", "bool", "float"):
            want = {"str": str, "int": int, "bool": bool, "float": (int, float)}[type_name]
            assert isinstance(value, want) and not (type_name == "int" and isinstance(value, bool)), (
                f"{path}: expected {type_name}, got {value!r}")
        elif type_name == "object":
            pass
        elif hasattr(self.models, type_name):
            cls = getattr(self.models, type_name)
            assert isinstance(value, dict), f"{path}: expected {type_name}, got {value!r}"
            by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
            for key, v in value.items():
                assert key in by_json, f"{path}: {type_name} has no field {key!r} (has {sorted(by_json)})"
                self.check(v, cls.openapi_types[by_json[key]], f"{path}.{key}")
        else:  # a Kubernetes type
            ref = {"$ref": f"{self.defs_uri}#/$defs/{self.k8s_definition(type_name)}"}
            try:
                jsonschema.Draft202012Validator(ref, registry=self.registry).validate(value)
            except jsonschema.ValidationError as e:
                raise AssertionError(f"{path}: {e.message}") from None

    def validate(self, doc: dict[str, Any]) -> None:
        group, version = doc["apiVersion"].split("/")
        assert group == "serving.kserve.io", doc["apiVersion"]
        self.check(doc, f"V{version[1:]}{doc['kind']}", doc["kind"])


@pytest.fixture(scope="module")
def kserve_schemas() -> _Schemas:
    return _Schemas()


def kserve_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "kserve").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kserve_manifests_validate(kserve_schemas: _Schemas) -> None:
    docs = kserve_docs()
    assert sorted(d["kind"] for d in docs) == ["InferenceService", "InferenceService", "ServingRuntime"]
    for doc in docs:
        kserve_schemas.validate(doc)
    runtime = next(d for d in docs if d["kind"] == "ServingRuntime")
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"] for f in spec["supportedModelFormats"]} >= {"triton", "pytorch"}
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"  # the name KServe looks for
    args = c["args"]
    assert args[0] == "/mnt/models" and args[args.index("--http-port") + 1] == "8080"
    assert args[args.index("--grpc-port") + 1] == "9000"
    assert spec["annotations"]["prometheus.kserve.io/port"] == args[args.index("--metrics-port") + 1]
    for isvc in (d for d in docs if d["kind"] == "InferenceService"):
        assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
        if isvc["spec"]["predictor"]["model"]["protocolVersion"] == "grpc-v2":
            assert isvc["spec"]["predictor"]["model"]["ports"][0]["containerPort"] == 9000


def test_kserve_check_catches_mistakes(kserve_schemas: _Schemas) -> None:
    runtime = next(d for d in kserve_docs() if d["kind"] == "ServingRuntime")
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["protocolVersion"] = ["v2"]  # the field is protocolVersions
    with pytest.raises(AssertionError, match="protocolVersion"):
        kserve_schemas.validate(bad)
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["containers"][0]["port"] = 8080  # not a Container field
    with pytest.raises(AssertionError, match="port"):
        kserve_schemas.validate(bad)


# ----------------------------------------------------------------------------- the container's command line


def dockerfile_command(path: Path) -> list[str]:
    """ENTRYPOINT + CMD of the final stage (exec form), and its USER."""
    text = path.read_text()
    final = text[text.rindex("\nFROM "):]
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", final, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", final, re.M).group(1))
    user = re.findall(r"^USER (\S+)$", final, re.M)
    assert user and user[-1] not in ("0", "root"), f"{path.name} runs as root"
    return entry + cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def container_command_lines() -> dict[str, list[str]]:
    lines = {p.name: dockerfile_command(p) for p in sorted((DEPLOY / "docker").glob("Dockerfile*"))}
    assert set(lines) == {"Dockerfile", "Dockerfile.cuda"}
    entry = lines["Dockerfile"][:2]
    assert entry == ["openinfer", "serve"]
    (c,) = next(d for d in kserve_docs() if d["kind"] == "ServingRuntime")["spec"]["containers"]
    lines["ServingRuntime"] = entry + c["args"]  # args replace the image's CMD
    deploy = next(d for d in helm_render.render(CHART, "oi") if d["kind"] == "Deployment")
    lines["Helm"] = entry + deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return lines


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda", "ServingRuntime", "Helm"])
def test_container_command_line_serves_and_drains(name: str, tmp_path: Path) -> None:
    argv = container_command_lines()[name]
    # Local stand-ins: the bundled example repository for /mnt/models (the package's own copy, as
    # the sanitizer run installs it: its PT2 examples build on first use), free loopback ports, and
    # a grace the test cuts short with its second SIGTERM (the image's 5 s can pass, on a loaded
    # machine, before the test has seen readiness turn false).
    ports = {flag: free_port() for flag in ("--http-port", "--grpc-port", "--metrics-port")}
    local = [sys.executable, "-m", "openinfer"]
    for i, a in enumerate(argv[1:], start=1):
        prev = argv[i - 1]
        local.append(str(openinfer.examples_path()) if a == "/mnt/models"
                     else "127.0.0.1" if prev == "--host"
                     else "600" if prev == "--drain-grace-secs"
                     else str(ports[prev]) if prev in ports else a)
    assert "--drain-grace-secs" in local
    env = dict(os.environ, OPENINFER_CACHE_DIR=str(tmp_path / "cache"))
    cli = Cli(argv=local, env=env)
    try:
        http = f"http://127.0.0.1:{ports['--http-port']}"
        assert requests.get(http + "/v2/health/ready", timeout=10).status_code == 200
        assert requests.get(http + "/v2/models/simple/ready", timeout=10).status_code == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['--grpc-port']}")
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        assert client.infer("simple", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
        client.close()
        metrics = requests.get(f"http://127.0.0.1:{ports['--metrics-port']}/metrics", timeout=10).text
        assert 'nv_inference_request_success{model="simple",version="1"} 1' in metrics
        cli.proc.send_signal(signal.SIGTERM)  # what the kubelet sends
        wait_for(lambda: requests.get(http + "/v2/health/ready", timeout=10).status_code == 400, "unready")
        assert requests.get(http + "/v2/models/simple/ready", timeout=10).status_code == 200  # still serving
        cli.proc.send_signal(signal.SIGTERM)
        # The stop waits (up to its 30 s) for an example still loading after start-up: the tiny
        # Llama's first build into this fresh cache takes that long under the sanitizers.
        rc, out = cli.wait(timeout=120)
        assert rc == 0, out
    finally:
        cli.kill()
