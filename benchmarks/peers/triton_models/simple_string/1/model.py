"""Triton Python-backend `simple_string`: the sum and difference of two BYTES tensors of
decimal integers, as decimal bytes (INT32 arithmetic, wrapping), the computation of
openinfer's examples/models/simple_string/1/model.py."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _decimal(values):
    return np.char.encode(values.astype(str)).astype(object)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().astype(np.int32)
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy().astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", _decimal(a + b)),
                pb_utils.Tensor("OUTPUT1", _decimal(a - b))]))
        return responses
