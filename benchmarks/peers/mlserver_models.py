"""Peer: MLServer custom runtimes with openinfer's example semantics (V2 REST JSON and gRPC).

  simple         OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)
  identity_fp32  OUTPUT0 = INPUT0 (FP32, any shape)

benchmarks/peers.py writes the settings.json / model-settings.json repository that points at
these classes (`mlserver_models.Simple`, `mlserver_models.Identity`) and starts
`mlserver start` with this folder on PYTHONPATH.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


def _inputs(req: InferenceRequest) -> dict:
    return {i.name: NumpyCodec.decode_input(i) for i in req.inputs}


class Simple(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = _inputs(payload)
        a, b = x["INPUT0"], x["INPUT1"]
        return InferenceResponse(
            model_name=self.name, id=payload.id,
            outputs=[NumpyCodec.encode_output("OUTPUT0", a + b),
                     NumpyCodec.encode_output("OUTPUT1", a - b)])


class Identity(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = _inputs(payload)["INPUT0"]
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("OUTPUT0", x)])
