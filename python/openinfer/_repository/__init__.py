"""A model repository read into loaded models (repository) and their warm-up samples (warmup).
Private: openinfer.examples_path is the public name."""
