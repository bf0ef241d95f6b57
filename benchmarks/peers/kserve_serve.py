"""Peer: KServe's Python model server (`kserve.ModelServer`) with custom Models implementing
openinfer's example semantics, V2 REST (JSON and the binary tensor extension) and gRPC.

    benchmarks/.venvs/kserve/bin/python benchmarks/peers/kserve_serve.py \
        --http-port P --grpc-port G

  simple         OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)
  identity_fp32  OUTPUT0 = INPUT0 (FP32, any shape)

KServe 0.21 binds uvicorn to host "0.0.0.0" and gRPC to "[::]:port" with no option to change
it; this launcher rewrites both to 127.0.0.1 before the server starts (the benchmarks listen
on loopback only). One uvicorn worker; the gRPC server is KServe's own child process.
"""

from __future__ import annotations

import argparse
import logging

import grpc.aio._server as _grpc_server
import uvicorn
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.utils import generate_uuid


def bind_loopback() -> None:
    """Make KServe's uvicorn and gRPC servers listen on 127.0.0.1 (patched on the classes, so
    it holds for the servers ModelServer makes later)."""
    config_init, add_port = uvicorn.Config.__init__, _grpc_server.Server.add_insecure_port

    def loopback_config(self, *a, **kw):
        kw["host"] = "127.0.0.1"
        config_init(self, *a, **kw)

    def loopback_port(self, address):
        return add_port(self, "127.0.0.1:" + address.rsplit(":", 1)[1])

    uvicorn.Config.__init__ = loopback_config
    _grpc_server.Server.add_insecure_port = loopback_port


def quiet_logs() -> None:
    """No per-request log lines (access log, latency trace), as the other servers run at
    warning level."""
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _respond(model: Model, req: InferRequest, outs: dict) -> InferResponse:
    binary = {o.name: o.parameters.get("binary_data", req.use_binary_outputs)
              for o in (req.request_outputs or []) if o.parameters} if not req.from_grpc else {}
    infer_outputs = []
    for name, (arr, dtype) in outs.items():
        o = InferOutput(name=name, shape=list(arr.shape), datatype=dtype)
        o.set_data_from_numpy(arr, binary_data=req.from_grpc or binary.get(name, req.use_binary_outputs))
        infer_outputs.append(o)
    # model_version "1": KServe would send null, which openinfer.Client rejects (see S4).
    return InferResponse(response_id=req.id or generate_uuid(), model_name=model.name, infer_outputs=infer_outputs,
                         model_version="1",
                         use_binary_outputs=req.use_binary_outputs,
                         requested_outputs=req.request_outputs)


def _inputs(req: InferRequest) -> dict:
    return {i.name: i.as_numpy() for i in req.inputs}


class Simple(Model):
    def __init__(self):
        super().__init__("simple")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None):
        x = _inputs(payload)
        a, b = x["INPUT0"], x["INPUT1"]
        return _respond(self, payload, {"OUTPUT0": (a + b, "INT32"), "OUTPUT1": (a - b, "INT32")})


class Identity(Model):
    def __init__(self):
        super().__init__("identity_fp32")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None):
        return _respond(self, payload, {"OUTPUT0": (_inputs(payload)["INPUT0"], "FP32")})


def serve(make_models, add_args=lambda ap: None, **server_kw) -> None:
    """Parse --http-port, --grpc-port (and what `add_args` adds), then run KServe's ModelServer
    on loopback, one uvicorn worker, quiet, with the models `make_models(args)` returns
    (also peers/kserve_openai_serve.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    add_args(ap)
    a, _ = ap.parse_known_args()  # the rest are KServe's own flags (read from sys.argv)
    bind_loopback()
    server = ModelServer(http_port=a.http_port, grpc_port=a.grpc_port, workers=1,
                         enable_latency_logging=False, enable_docs_url=False,
                         access_log_format=None, **server_kw)
    quiet_logs()
    print("PEER READY", flush=True)
    server.start(make_models(a))


if __name__ == "__main__":
    serve(lambda a: [Simple(), Identity()])
