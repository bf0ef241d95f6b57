"""Drives openinfer with TensorRT Inference Server 1.11's own Python client (the `tensorrtserver`
wheel), in a process of its own: its generated modules register proto files whose names clash
with tritonclient's, and its library needs LD_LIBRARY_PATH set at start. Run by
tests/test_legacy_api.py as `python legacy_client.py HTTP_URL GRPC_URL`; prints one JSON object.

Two shims let the 2020 client run on today's runtimes without touching what goes on the wire:
numpy 2 has no `np.object`, and protobuf's Python parser wants bytes where the client hands it
a ctypes buffer."""

from __future__ import annotations

import json
import sys

import numpy as np

np.object = object  # type: ignore[attr-defined]

from tensorrtserver.api import (  # noqa: E402
    InferContext,
    InferenceServerException,
    ProtocolType,
    ServerHealthContext,
    ServerStatusContext,
    server_status_pb2,
)

_parse = server_status_pb2.ServerStatus.ParseFromString
server_status_pb2.ServerStatus.ParseFromString = lambda self, b: _parse(self, bytes(b))  # type: ignore[method-assign]


def entries(field):  # a map field, whichever way this protobuf runtime builds it
    return dict(field) if hasattr(field, "keys") else {e.key: e.value for e in field}


def run(proto, url: str) -> dict:
    out: dict = {}
    health = ServerHealthContext(url, proto)
    out["live"], out["ready"] = health.is_live(), health.is_ready()
    status = ServerStatusContext(url, proto, "simple").get_server_status()
    simple = entries(status.model_status)["simple"]
    versions = entries(simple.version_status)
    out["status"] = {"id": status.id, "models": sorted(entries(status.model_status)),
                     "max_batch_size": simple.config.max_batch_size,
                     "inputs": [i.name for i in simple.config.input],
                     "ready": {str(v): s.ready_state for v, s in versions.items()}}
    all_status = ServerStatusContext(url, proto).get_server_status()
    out["all_models"] = sorted(entries(all_status.model_status))

    ctx = InferContext(url, proto, "simple", -1)
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, 3, dtype=np.int32)
    r = ctx.run({"INPUT0": (a, a * 2), "INPUT1": (b, b)},
                {"OUTPUT0": InferContext.ResultFormat.RAW, "OUTPUT1": (InferContext.ResultFormat.CLASS, 2)}, 2)
    out["sum"] = [x.tolist() for x in r["OUTPUT0"]]
    out["diff_top2"] = [[list(c) for c in row] for row in r["OUTPUT1"]]

    ctx = InferContext(url, proto, "simple_string", -1)
    s0 = np.array([str(i) for i in range(16)], dtype=object)
    s1 = np.array(["1"] * 16, dtype=object)
    r = ctx.run({"INPUT0": (s0,), "INPUT1": (s1,)}, {"OUTPUT0": InferContext.ResultFormat.RAW}, 1)
    out["strings"] = [x.decode() for x in r["OUTPUT0"][0]]

    ctx = InferContext(url, proto, "scores", -1)
    x = np.array([0.1, 0.7, 0.2, 0.7], dtype=np.float32)
    r = ctx.run({"SCORES": (x,)}, {"PROB": (InferContext.ResultFormat.CLASS, 3)}, 1)
    out["labelled"] = [[list(c) for c in row] for row in r["PROB"]]

    try:
        InferContext(url, proto, "simple", -1).run({"INPUT0": (a,), "INPUT1": (b,)},
                                                    {"NOPE": InferContext.ResultFormat.RAW}, 1)
        out["unknown_output"] = None
    except InferenceServerException as e:
        out["unknown_output"] = e.message()

    if proto == ProtocolType.GRPC:
        ctx = InferContext(url, proto, "simple", -1, streaming=True)
        sums = []
        for k in range(3):
            r = ctx.run({"INPUT0": (a + k,), "INPUT1": (b,)}, {"OUTPUT0": InferContext.ResultFormat.RAW}, 1)
            sums.append(int(r["OUTPUT0"][0][0]))
        out["stream_first"] = sums
        ctx.close()
    return out


if __name__ == "__main__":
    result = {"http": run(ProtocolType.HTTP, sys.argv[1]), "grpc": run(ProtocolType.GRPC, sys.argv[2])}
    print(json.dumps(result))
