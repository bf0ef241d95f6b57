"""Chat templates of text models, for /v1/chat/completions: a request's messages rendered into
the prompt its model takes, with the template in the model's folder, as Hugging Face lays it out
(``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template``, with its
``bos_token`` and ``eos_token``). A model of Triton's vLLM backend keeps a ``model.json`` of vLLM's
engine arguments in its version folder instead: its template is that of the Hugging Face folder
the arguments name (``tokenizer``, else ``model``), the one vLLM tokenizes with.

The template comes from the model's folder, which a client may have sent with a load request, so
it runs in Jinja's immutable sandbox (as transformers runs it) and its files are read only through
`read_beneath`. The core calls `ChatTemplates.render` once per request, on a worker thread, never
per token.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InferenceServerError
from .._config.paths import read_beneath

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _bad(message: str) -> InferenceServerError:
    return InferenceServerError(400, message)


def _content(index: int, content: object) -> str:
    """A message's content as text: a string, or a list of text parts (other parts, such as
    images, are refused: no served model takes them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"Invalid 'messages[{index}].content': only text parts are served, got {kind!r}.")
            texts.append(part["text"])
        return "".join(texts)
    if content is None:
        return ""
    raise _bad(f"Invalid type for 'messages[{index}].content': expected a string or an array of text parts.")


def messages_of(body: bytes) -> list[dict[str, str]]:
    """The messages array (already well-formed JSON, read by the core) checked and reduced to
    what templates use: role, content and, where given, name."""
    items = json.loads(body)
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, dict):
            raise _bad(f"Invalid type for 'messages[{i}]': expected an object.")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"Invalid value for 'messages[{i}].role': expected one of {sorted(ROLES)}, got {role!r}.")
        message = {"role": role, "content": _content(i, m.get("content"))}
        if isinstance(m.get("name"), str):
            message["name"] = m["name"]
        out.append(message)
    return out


def _token(config: dict[str, Any], key: str) -> str:
    """A special token of tokenizer_config.json: a string, or an AddedToken's {"content": ...}."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class _Template:
    """One model folder's compiled template and its special tokens."""

    def __init__(self, model_dir: Path) -> None:
        config: dict[str, Any] = {}
        try:
            config = json.loads(read_beneath(model_dir, "tokenizer_config.json", "tokenizer config", model_dir))
        except FileNotFoundError:
            pass
        except ValueError as e:
            raise InferenceServerError(500, f"tokenizer_config.json is not valid JSON: {e}") from None
        try:
            source = read_beneath(model_dir, "chat_template.jinja", "chat template", model_dir).decode()
        except FileNotFoundError:
            source = config.get("chat_template")
            if isinstance(source, list):  # named templates: the default one
                source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            raise _bad(f"model '{model_dir.name}' has no chat template (chat_template.jinja, or chat_template in "
                       "tokenizer_config.json): it serves /v1/completions only")
        try:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise InferenceServerError(
                501, "chat templates need jinja2: pip install 'openinfer[llm]'") from None

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise InferenceServerError(
                500, f"model '{model_dir.name}': its chat template does not compile: {e}") from None
        self.tokens = {"bos_token": _token(config, "bos_token"), "eos_token": _token(config, "eos_token")}

    def render(self, messages: list[dict[str, str]]) -> str:
        from jinja2.exceptions import TemplateError

        try:
            return str(self.template.render(messages=messages, add_generation_prompt=True, **self.tokens))
        except TemplateError as e:  # the template refused these messages (raise_exception)
            raise _bad(f"Invalid 'messages': the model's chat template refused them: {e}") from None


def _stamp(model_dir: Path) -> tuple[int, ...]:
    """When the template's files last changed, so that a reloaded folder is read again."""
    stamps = []
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        try:
            stamps.append(os.stat(model_dir / name, follow_symlinks=False).st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


# vLLM's engine arguments in a version folder (Triton's vLLM backend), and those naming the folder
# whose tokenizer vLLM uses, in vLLM's order.
ENGINE_ARGS = "model.json"
_TOKENIZER_ARGS = ("tokenizer", "model")


def template_folder(model_dir: Path, version: int) -> Path:
    """The folder whose chat template model version `version` uses: the local Hugging Face
    folder its model.json names, for a model of Triton's vLLM backend; else the model's own.
    model.json is read beneath the version folder; a relative name is vLLM's, from the server's
    working directory."""
    try:
        args = json.loads(read_beneath(model_dir / str(version), ENGINE_ARGS, "vLLM engine arguments", model_dir))
    except (OSError, ValueError):  # none (or no such version): the model's own folder
        return model_dir
    for key in _TOKENIZER_ARGS:
        named = args.get(key) if isinstance(args, dict) else None
        if isinstance(named, str) and named and os.path.isdir(named):
            return Path(os.path.abspath(named))
    return model_dir


class ChatTemplates:
    """The chat templates of the served models, compiled once per folder (and again when its
    files change). `model_dir` names a model's folder, None when it has none."""

    def __init__(self, model_dir: Callable[[str], Path | None]) -> None:
        self._model_dir = model_dir
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[int, ...], _Template]] = {}

    def render(self, model: str, version: int, messages: bytes) -> str:
        """The prompt for `messages` (the request's JSON array) with model `model`'s template."""
        model_dir = self._model_dir(model)
        if model_dir is None or not model_dir.is_dir():
            raise _bad(f"model '{model}' has no folder with a chat template: it serves /v1/completions only")
        model_dir = template_folder(model_dir, version)
        stamp = _stamp(model_dir)
        with self._lock:
            cached = self._cache.get(model_dir)
        if cached is None or cached[0] != stamp:
            cached = (stamp, _Template(model_dir))
            with self._lock:
                self._cache[model_dir] = cached
        return cached[1].render(messages_of(messages))
