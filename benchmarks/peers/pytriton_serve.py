"""Peer: Triton Inference Server (the `tritonserver` binary that the nvidia-pytriton wheel
ships) serving Python functions through PyTriton, on 127.0.0.1 only.

    benchmarks/.venvs/triton/bin/python benchmarks/peers/pytriton_serve.py \
        --http-port P --grpc-port G --metrics-port M [--torch DIR]

Models, with openinfer's example semantics:
  simple         INT32 [-1,16] x2 -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
                 (max_batch_size 8, dynamic batching, as openinfer's examples/models/simple)
  identity_fp32  FP32 [-1] -> OUTPUT0 = INPUT0 (no batching: any length)
  mlp, cnn       (with --torch DIR) TorchScript DIR/<name>/1/model.pt called in-process by the
                 PyTriton function under torch.inference_mode, one intra-op thread
Started by benchmarks/peers.py; stops on SIGTERM/SIGINT (PyTriton stops tritonserver).
"""

from __future__ import annotations

import argparse
import signal
import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def simple(INPUT0, INPUT1):  # noqa: N803 - Triton's names
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def identity(INPUT0):  # noqa: N803
    return {"OUTPUT0": INPUT0}


def identity_fn(requests):
    return [{"OUTPUT0": r["INPUT0"]} for r in requests]


def torch_models(triton: Triton, root: str, max_batch: int) -> None:
    import torch
    torch.set_num_threads(1)
    specs = {
        "mlp": ("INPUT__0", (16,), [("OUTPUT__0", (4,))]),
        "cnn": ("image", (1, 28, 28), [("logits", (10,)), ("probabilities", (10,))]),
    }
    for name, (inp, dims, outs) in specs.items():
        module = torch.jit.load(f"{root}/{name}/1/model.pt").eval()

        def make(module=module, inp=inp, outs=outs):
            @batch
            def fn(**kw):
                with torch.inference_mode():
                    y = module(torch.from_numpy(kw[inp]))
                if isinstance(y, dict):
                    return {k: v.numpy() for k, v in y.items()}
                if isinstance(y, (tuple, list)):
                    return {o: t.numpy() for (o, _), t in zip(outs, y)}
                return {outs[0][0]: y.numpy()}
            return fn
        for suffix, batcher in (("", DynamicBatcher(max_queue_delay_microseconds=0)),
                                ("_batched", DynamicBatcher(max_queue_delay_microseconds=1000))):
            triton.bind(model_name=name + suffix, infer_func=make(),
                        inputs=[Tensor(name=inp, dtype=np.float32, shape=dims)],
                        outputs=[Tensor(name=o, dtype=np.float32, shape=d) for o, d in outs],
                        config=ModelConfig(max_batch_size=max_batch, batcher=batcher))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--torch", help="model repository with mlp/1/model.pt and cnn/1/model.pt")
    ap.add_argument("--max-batch", type=int, default=32)
    a = ap.parse_args()
    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port,
                          grpc_address="127.0.0.1", grpc_port=a.grpc_port,
                          metrics_address="127.0.0.1", metrics_port=a.metrics_port,
                          allow_metrics=False, log_verbose=0)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    with Triton(config=config) as triton:
        triton.bind(model_name="simple", infer_func=simple,
                    inputs=[Tensor(name="INPUT0", dtype=np.int32, shape=(16,)),
                            Tensor(name="INPUT1", dtype=np.int32, shape=(16,))],
                    outputs=[Tensor(name="OUTPUT0", dtype=np.int32, shape=(16,)),
                             Tensor(name="OUTPUT1", dtype=np.int32, shape=(16,))],
                    config=ModelConfig(max_batch_size=8))
        triton.bind(model_name="identity_fp32", infer_func=identity_fn,
                    inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
                    outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(batching=False))
        if a.torch:
            torch_models(triton, a.torch, a.max_batch)
        print("PEER READY", flush=True)
        triton.serve()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
