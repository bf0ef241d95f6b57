"""The model kinds besides a plain Python `Model`: TorchScript, PyTorch 2 packages, ONNX, identity
and ensembles, and a Python model's instances in worker processes. Private."""
