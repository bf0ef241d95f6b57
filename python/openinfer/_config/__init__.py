"""config.pbtxt as Triton reads it: the schema and its refuse/warn policy (triton_config),
sequence_batching (sequence) and the files a configuration names (paths). Private:
openinfer.config is the public side."""
