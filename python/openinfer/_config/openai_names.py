"""OpenAI's API over a model whose tensors of Triton's LLM conventions (text_input, text_output,
...) have names of its own: its config.pbtxt maps each, one parameter per tensor,

    parameters { key: "openai_text_input" value { string_value: "PROMPT" } }

and the /v1 endpoints use the model's names (csrc/server/api/openai_api.c)."""

from __future__ import annotations

from ..config import ConfigError, ModelConfig

PREFIX = "openai_"
# Each convention's tensor, and whether the model takes or gives it.
CONVENTIONS = {
    **dict.fromkeys(("text_input", "stream", "sampling_parameters", "exclude_input_in_output",
                     "return_finish_reason", "return_num_input_tokens", "return_num_output_tokens",
                     "return_logprobs"), "input"),
    **dict.fromkeys(("text_output", "finish_reason", "num_input_tokens", "num_output_tokens", "logprobs",
                     "embedding"), "output"),
}  # fmt: skip


def mapping(config: ModelConfig, source: str) -> tuple[tuple[str, str], ...]:
    """The (convention's name, model's name) pairs of the config's openai_<name> parameters.
    Raises ConfigError naming the parameter that names no convention's tensor, or a tensor
    the config does not declare."""
    pairs = []
    declared = {"input": {t.name for t in config.inputs}, "output": {t.name for t in config.outputs}}
    for key, value in sorted(config.parameters.items()):
        if not key.startswith(PREFIX):
            continue
        convention = key[len(PREFIX):]
        kind = CONVENTIONS.get(convention)
        if kind is None:
            raise ConfigError(
                f"{source}: parameters {key!r}: {convention!r} is no tensor of Triton's LLM conventions (the "
                f"openai_ parameters map {', '.join(sorted(CONVENTIONS))})"
            )
        if declared[kind] and value not in declared[kind]:
            raise ConfigError(f"{source}: parameters {key!r}: the model declares no {kind} {value!r}")
        pairs.append((convention, value))
    return tuple(pairs)
