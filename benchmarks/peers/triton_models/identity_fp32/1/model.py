"""Triton Python-backend `identity_fp32`: OUTPUT0 = INPUT0 (FP32), as openinfer's
examples/models/identity_fp32/1/model.py."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
