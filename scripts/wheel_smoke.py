"""Smoke test of an installed openinfer, run in a clean environment after installing a wheel
(`make wheel` for each interpreter; cibuildwheel's test-command): serve the bundled example
repository and answer one infer over HTTP (standard library only) and one over gRPC
(openinfer's own client). Exits non-zero, saying what failed, on any difference.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

import numpy as np

import openinfer


def main() -> int:
    here = os.path.dirname(os.path.abspath(openinfer.__file__))
    if "site-packages" not in here:
        print(f"wheel_smoke: openinfer was imported from {here}, not from an installation", file=sys.stderr)
        return 1
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    with openinfer.serve(http_port=0, grpc_port=0, log=False) as server:
        body = json.dumps({"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()},
        ]}).encode()  # fmt: skip
        req = urllib.request.Request(server.url + "/v2/models/simple/infer", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            outputs = {o["name"]: o["data"] for o in json.load(r)["outputs"]}
        if outputs != {"OUTPUT0": (a + b).ravel().tolist(), "OUTPUT1": (a - b).ravel().tolist()}:
            print(f"wheel_smoke: HTTP infer answered {outputs}", file=sys.stderr)
            return 1
        with openinfer.Client(server.grpc_url) as client:
            got = client.infer("simple", {"INPUT0": a, "INPUT1": b})
        if not (np.array_equal(got["OUTPUT0"], a + b) and np.array_equal(got["OUTPUT1"], a - b)):
            print(f"wheel_smoke: gRPC infer answered {got}", file=sys.stderr)
            return 1
    print(f"wheel_smoke: openinfer {openinfer.__version__} from {here} served HTTP and gRPC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
