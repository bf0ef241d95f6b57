"""Triton's config.pbtxt: a protobuf text-format parser into plain dicts and lists, and the
`ModelConfig` fields that Triton users rely on.

The parser knows no schema, so it cannot tell a repeated field written once from a singular
one: a field written once is its value, a field written several times or with ``[a, b]`` list
syntax is a list. `ModelConfig` normalises the fields it knows; every other field is kept, as
parsed, in `ModelConfig.raw`, so configs written for Triton load without complaint.
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Value = Any  # str | int | float | bool | dict[str, Value] | list[Value]

# Triton's TYPE_* data types and the V2 datatype each one travels as.
TRITON_DATATYPES: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_BF16": "BF16",
    "TYPE_STRING": "BYTES",
}


class ConfigError(ValueError):
    """A config.pbtxt that cannot be read; the message says where (file:line:col) and what was
    expected."""


# ---------------------------------------------------------------------------------------------
# Tokenizer and parser

_TOKEN = re.compile(
    r"""
      (?P<space>(?:\s+|\#[^\n]*)+)
    | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fF]?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    | (?P<symbol>[{}<>\[\]:,;\-])
    """,
    re.VERBOSE,
)
_FLOAT_WORDS = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}
_SIMPLE_ESCAPES = {
    "n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v",
    "\\": b"\\", "'": b"'", '"': b'"', "?": b"?",
}  # fmt: skip
_WORD_CHAR = re.compile(r"[A-Za-z0-9_]")
_WORD = re.compile(r"[A-Za-z0-9_.+-]+")
_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))"
)


@dataclass(frozen=True)
class _Token:
    kind: str  # number, ident, string, symbol, eof
    text: str
    offset: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of file"
        if self.kind == "ident":
            return f"identifier {self.text!r}"
        return f"{self.kind} {self.text}" if self.kind != "symbol" else repr(self.text)


class _Parser:
    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = self._tokenize()
        self.pos = 0

    def error(self, offset: int, message: str) -> ConfigError:
        line = bisect.bisect_right(self.line_starts, offset)
        col = offset - self.line_starts[line - 1] + 1
        return ConfigError(f"{self.filename}:{line}:{col}: {message}")

    def _tokenize(self) -> list[_Token]:
        tokens: list[_Token] = []
        offset = 0
        while offset < len(self.text):
            match = _TOKEN.match(self.text, offset)
            if match is None:
                char = self.text[offset]
                if char in "\"'":
                    raise self.error(offset, "unterminated string (strings end on the same line)")
                raise self.error(offset, f"unexpected character {char!r}")
            kind = match.lastgroup
            assert kind is not None
            if kind == "number" and _WORD_CHAR.match(self.text, match.end()):
                word = _WORD.match(self.text, offset)
                assert word is not None
                raise self.error(offset, f"malformed number {word.group()!r}")
            if kind != "space":
                tokens.append(_Token(kind, match.group(), offset))
            offset = match.end()
        tokens.append(_Token("eof", "", len(self.text)))
        return tokens

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def accept(self, symbol: str) -> bool:
        token = self.peek()
        if token.kind == "symbol" and token.text == symbol:
            self.pos += 1
            return True
        return False

    def expected(self, what: str) -> ConfigError:
        token = self.peek()
        return self.error(token.offset, f"expected {what}, got {token.describe()}")

    def message(self, close: str | None) -> dict[str, Value]:
        """Fields up to `close` ('}' or '>'), or to the end of the file at top level."""
        values: dict[str, list[Value]] = {}
        listed: set[str] = set()  # fields that used [a, b] syntax stay lists even with one value
        while True:
            token = self.peek()
            if close is None and token.kind == "eof":
                break
            if close is not None and self.accept(close):
                break
            if token.kind != "ident":
                raise self.expected(
                    "a field name" if close is None else f"a field name or {close!r}"
                )
            name = self.take().text
            colon = self.accept(":")
            nxt = self.peek()
            if nxt.kind == "symbol" and nxt.text == "[":
                self.take()
                values.setdefault(name, []).extend(self.list(name))
                listed.add(name)
            elif nxt.kind == "symbol" and nxt.text in "{<":
                values.setdefault(name, []).append(self.submessage())
            elif colon:
                values.setdefault(name, []).append(self.scalar(name))
            else:
                raise self.expected(f"':' or '{{' after field name {name!r}")
            if not self.accept(";"):
                self.accept(",")
        return {k: v[0] if len(v) == 1 and k not in listed else v for k, v in values.items()}

    def submessage(self) -> dict[str, Value]:
        opening = self.take().text
        return self.message("}" if opening == "{" else ">")

    def list(self, name: str) -> list[Value]:
        items: list[Value] = []
        if self.accept("]"):
            return items
        while True:
            token = self.peek()
            if token.kind == "symbol" and token.text in "{<":
                items.append(self.submessage())
            else:
                items.append(self.scalar(name))
            if self.accept("]"):
                return items
            if not self.accept(","):
                raise self.expected(f"',' or ']' in the list of {name!r}")

    def scalar(self, name: str) -> Value:
        token = self.peek()
        if token.kind == "string":
            parts = []
            while self.peek().kind == "string":  # adjacent strings concatenate, as in C
                parts.append(self.string(self.take()))
            return "".join(parts)
        negative = self.accept("-")
        token = self.peek()
        if token.kind == "number":
            self.take()
            number = self.number(token)
            return -number if negative else number
        if token.kind == "ident":
            word = token.text
            if word.lower() in _FLOAT_WORDS:
                self.take()
                value = _FLOAT_WORDS[word.lower()]
                return -value if negative else value
            if not negative:
                self.take()
                if word in ("true", "True"):
                    return True
                if word in ("false", "False"):
                    return False
                return word  # an enum value such as KIND_GPU or TYPE_FP32
        raise self.expected(
            f"a number after '-' for {name!r}" if negative else f"a value for {name!r}"
        )

    def number(self, token: _Token) -> int | float:
        text = token.text
        if text[:2] in ("0x", "0X"):
            return int(text, 16)
        if any(c in text for c in ".eEfF"):
            return float(text.rstrip("fF"))
        if len(text) > 1 and text[0] == "0":
            try:
                return int(text, 8)  # protobuf text format reads a leading 0 as octal
            except ValueError:
                raise self.error(token.offset, f"malformed octal number {text!r}") from None
        return int(text)

    def string(self, token: _Token) -> str:
        body = token.text[1:-1]
        out = bytearray()
        last = 0
        for match in _ESCAPE.finditer(body):
            out += body[last : match.start()].encode()
            octal, hex_, u4, u8, other = match.groups()
            if octal is not None:
                out.append(int(octal, 8) & 0xFF)
            elif hex_ is not None:
                out.append(int(hex_, 16))
            elif u4 is not None or u8 is not None:
                code = int(u4 or u8, 16)
                if code > 0x10FFFF:
                    raise self.error(
                        token.offset + 1 + match.start(), f"invalid escape {match.group()!r}"
                    )
                out += chr(code).encode("utf-8", "surrogatepass")
            elif other in _SIMPLE_ESCAPES:
                out += _SIMPLE_ESCAPES[other]
            else:
                raise self.error(
                    token.offset + 1 + match.start(), f"unknown escape {match.group()!r}"
                )
            last = match.end()
        out += body[last:].encode()
        try:
            return out.decode()
        except UnicodeDecodeError:
            raise self.error(token.offset, "string is not valid UTF-8") from None


def parse(text: str, filename: str = "<string>") -> dict[str, Value]:
    """Parses protobuf text format into dicts (messages), lists (repeated fields), str
    (strings and enum identifiers), int, float and bool. Raises ConfigError."""
    return _Parser(text, filename).message(None)


# ---------------------------------------------------------------------------------------------
# ModelConfig


@dataclass(frozen=True)
class TensorConfig:
    """One `input` or `output` entry. `dims` exclude the batch dimension when the model's
    max_batch_size > 0, as in Triton; `reshape` is kept but not applied to Python models."""

    name: str
    datatype: str  # V2 name: TYPE_STRING becomes BYTES
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    label_filename: str | None = None  # outputs: class labels, one a line, for classification
    optional: bool = False  # inputs: a request may leave it out (Triton's `optional: true`)


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy: what a request that waits past its timeout gets (REJECT:
    refused unrun with "Request timeout expired"; DELAY: it runs after the timely requests of
    its priority level), the timeout (µs, 0: none), whether the request's own "timeout"
    parameter replaces it, and how many requests the level may queue (0: no limit)."""

    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def check(self, where: str) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ConfigError(f"{where}.timeout_action must be REJECT or DELAY, got {self.timeout_action!r}")
        if not 0 <= self.default_timeout_microseconds < 1 << 64:
            raise ConfigError(
                f"{where}.default_timeout_microseconds must be an unsigned 64-bit integer, "
                f"got {self.default_timeout_microseconds}"
            )
        if not 0 <= self.max_queue_size < 1 << 32:
            raise ConfigError(f"{where}.max_queue_size must be an unsigned 32-bit integer, got {self.max_queue_size}")

    def as_tuple(self) -> tuple[bool, int, bool, int]:
        """What add_model takes for a level."""
        return (self.timeout_action == "DELAY", self.default_timeout_microseconds, self.allow_timeout_override,
                self.max_queue_size)


MAX_PRIORITY_LEVELS = 1 << 16  # the scheduler keeps two lists per level


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0  # default_queue_policy.max_queue_size when that is not given; 0: no limit
    # Triton's queue policies and priorities: a request's "priority" p (1 the highest) queues at
    # level p when 1 <= p <= priority_levels, else at default_priority_level.
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()
    preserve_ordering: bool = False

    def check(self, where: str = "dynamic_batching") -> None:
        """Raises ConfigError naming the field, with Triton's reason, for what Triton refuses."""
        self.default_policy().check(f"{where}.default_queue_policy")
        levels = self.priority_levels
        if not 0 <= levels <= MAX_PRIORITY_LEVELS:
            raise ConfigError(f"{where}.priority_levels must be in range [0, {MAX_PRIORITY_LEVELS}], got {levels}")
        if levels and not 1 <= self.default_priority_level <= levels:
            raise ConfigError(
                f"{where}.default_priority_level: default priority level must be in range [1, {levels}], "
                f"got {self.default_priority_level}"
            )
        for level, policy in self.priority_queue_policy:
            if levels and not 1 <= level <= levels:  # without levels Triton ignores them
                raise ConfigError(
                    f"{where}.priority_queue_policy: priority queue policy must have priority level in range "
                    f"[1, {levels}], got {level}"
                )
            policy.check(f"{where}.priority_queue_policy[{level}]")
        if self.preserve_ordering:
            for name, policy in [("default_queue_policy", self.default_policy())] + [
                (f"priority_queue_policy[{k}]", p) for k, p in self.priority_queue_policy
            ]:
                if policy.timeout_action == "DELAY" and policy.default_timeout_microseconds:
                    raise ConfigError(
                        f"{where}.{name}.timeout_action: Queue policy can not have DELAY as timeout action "
                        "when 'preserve_ordering' is true"
                    )

    def default_policy(self) -> QueuePolicy:
        return self.default_queue_policy or QueuePolicy(max_queue_size=self.max_queue_size)

    def level_policies(self) -> tuple[tuple[bool, int, bool, int], ...]:
        """add_model's policies, one per level from 1. As in Triton, the request's "timeout" counts
        only where allow_timeout_override says so (a model without dynamic_batching has no
        policy: its requests' timeouts always apply)."""
        explicit = dict(self.priority_queue_policy) if self.priority_levels else {}
        default = self.default_policy()
        return tuple(explicit.get(level, default).as_tuple() for level in range(1, max(self.priority_levels, 1) + 1))


@dataclass(frozen=True)
class VersionPolicy:
    """Which version directories are served; Triton's default is the latest one."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The available versions to serve, ascending. Specific versions that are not
        available are left out: the caller reports them."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a config.pbtxt that openinfer uses. `raw` is the whole parsed file,
    unknown fields included."""

    name: str | None = None
    platform: str | None = None
    backend: str | None = None
    max_batch_size: int = 0
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    version_policy: VersionPolicy = VersionPolicy()
    default_model_filename: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Value] = field(default_factory=dict)

    @property
    def instances(self) -> int:
        """Total model instances: Triton places `count` instances on each listed GPU."""
        if not self.instance_groups:
            return 1
        return sum(g.count * max(1, len(g.gpus)) for g in self.instance_groups)

    @classmethod
    def from_dict(cls, raw: dict[str, Value], source: str = "<config>") -> ModelConfig:
        """Extracts and checks the known fields; raises ConfigError naming `source` and the
        field."""
        f = _Fields(raw, source)
        max_batch_size = f.integer("max_batch_size", 0)
        if max_batch_size < 0:
            raise ConfigError(f"{source}: max_batch_size must be >= 0, got {max_batch_size}")
        return cls(
            name=f.string("name"),
            platform=f.string("platform"),
            backend=f.string("backend"),
            max_batch_size=max_batch_size,
            inputs=tuple(_tensor(m, source, "input") for m in f.messages("input")),
            outputs=tuple(_tensor(m, source, "output") for m in f.messages("output")),
            instance_groups=tuple(_instance_group(m, source) for m in f.messages("instance_group")),
            dynamic_batching=_dynamic_batching(f.message("dynamic_batching"), source),
            version_policy=_version_policy(f.message("version_policy"), source),
            default_model_filename=f.string("default_model_filename"),
            parameters=_parameters(f.messages("parameters"), source),
            raw=raw,
        )


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Reads and checks one config.pbtxt. Raises ConfigError (also for an unreadable file)."""
    filename = os.fspath(path)
    try:
        with open(filename, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{filename}: cannot read: {e}") from None
    return ModelConfig.from_dict(parse(text, filename), filename)


def load_model_config(model_dir: str | os.PathLike[str]) -> ModelConfig:
    """A repository model's config.pbtxt, read and checked as `load_config` does, opened as the
    files a configuration names are (paths.open_beneath: a link out of the model directory,
    to /etc/shadow say, is refused rather than parsed into an error message). Raises
    ConfigError, FileNotFoundError when there is none."""
    from ._config import paths

    filename = os.path.join(model_dir, "config.pbtxt")
    try:
        text = paths.read_beneath(Path(model_dir), "config.pbtxt", "config.pbtxt", Path(model_dir)).decode()
    except paths.PathError as e:
        raise ConfigError(f"{filename}: {e}") from None
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{filename}: cannot read: {e}") from None
    return ModelConfig.from_dict(parse(text, filename), filename)


class _Fields:
    """Typed access to one parsed message, with errors that name the field."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a message {{...}}, got {raw!r}")
        self.raw: dict[str, Value] = raw
        self.where = where

    def _single(self, key: str, kinds: tuple[type, ...], what: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            return None
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise ConfigError(f"{self.where}: {key} must be {what}, got {value!r}")
        return value

    def string(self, key: str) -> str | None:
        return self._single(key, (str,), "a single string")  # type: ignore[no-any-return]

    def integer(self, key: str, default: int) -> int:
        value = self._single(key, (int,), "a single integer")
        return default if value is None else value

    def integers(self, key: str) -> tuple[int, ...]:
        values = self.raw.get(key, [])
        values = values if isinstance(values, list) else [values]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{self.where}: {key} must hold integers, got {v!r}")
        return tuple(values)

    def message(self, key: str) -> dict[str, Value] | None:
        value = self.raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{self.where}: {key} must be a single message {{...}}, got {value!r}"
            )
        return value

    def messages(self, key: str) -> list[dict[str, Value]]:
        values = self.raw.get(key, [])
        values = values if isinstance(values, list) else [values]
        for v in values:
            if not isinstance(v, dict):
                raise ConfigError(f"{self.where}: {key} must hold messages {{...}}, got {v!r}")
        return values


def _tensor(raw: dict[str, Value], source: str, kind: str) -> TensorConfig:
    f = _Fields(raw, f"{source}: {kind}")
    name = f.string("name")
    if not name:
        raise ConfigError(f"{source}: every {kind} needs a name")
    f.where = f"{source}: {kind} {name!r}"
    data_type = f.raw.get("data_type")
    if not isinstance(data_type, str) or data_type not in TRITON_DATATYPES:
        raise ConfigError(
            f"{f.where}: data_type must be one of {', '.join(TRITON_DATATYPES)}, got {data_type!r}"
        )
    if "dims" not in raw:
        raise ConfigError(f"{f.where}: dims missing (Triton requires them, e.g. dims: [ 16 ])")
    dims = f.integers("dims")
    if any(d < -1 for d in dims):
        raise ConfigError(
            f"{f.where}: dims must be >= -1 (-1 for a variable dimension), got {list(dims)}"
        )
    reshape = f.message("reshape")
    return TensorConfig(
        name=name,
        datatype=TRITON_DATATYPES[data_type],
        dims=dims,
        reshape=None
        if reshape is None
        else _Fields(reshape, f"{f.where}: reshape").integers("shape"),
        label_filename=f.string("label_filename") or None,
        optional=f.raw.get("optional") is True,
    )


def _instance_group(raw: dict[str, Value], source: str) -> InstanceGroup:
    f = _Fields(raw, f"{source}: instance_group")
    count = f.integer("count", 1)
    if count < 1:
        raise ConfigError(f"{f.where}: count must be >= 1, got {count}")
    kind = f.raw.get("kind", "KIND_AUTO")
    if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"):
        raise ConfigError(
            f"{f.where}: kind must be KIND_AUTO, KIND_CPU, KIND_GPU or KIND_MODEL, got {kind!r}"
        )
    return InstanceGroup(count=count, kind=kind, gpus=f.integers("gpus"))


def _dynamic_batching(raw: dict[str, Value] | None, source: str) -> DynamicBatching | None:
    if raw is None:
        return None
    f = _Fields(raw, f"{source}: dynamic_batching")
    default = f.message("default_queue_policy")
    policies = raw.get("priority_queue_policy", [])
    entries = policies if isinstance(policies, list) else [policies]
    by_level: list[tuple[int, QueuePolicy]] = []
    for entry in entries:  # a map entry is { key: LEVEL value { ... } }
        e = _Fields(entry, f"{source}: dynamic_batching.priority_queue_policy")
        level = e.integer("key", 0)
        by_level.append((level, _queue_policy(e.message("value") or {}, f"{e.where}[{level}]")))
    batching = DynamicBatching(
        preferred_batch_size=f.integers("preferred_batch_size"),
        max_queue_delay_microseconds=f.integer("max_queue_delay_microseconds", 0),
        priority_levels=f.integer("priority_levels", 0),
        default_priority_level=f.integer("default_priority_level", 0),
        default_queue_policy=None if default is None else _queue_policy(default, f"{f.where}.default_queue_policy"),
        priority_queue_policy=tuple(by_level),
        preserve_ordering=bool(raw.get("preserve_ordering", False)),
    )
    batching.check(f"{source}: dynamic_batching")
    return batching


def _queue_policy(raw: dict[str, Value], where: str) -> QueuePolicy:
    f = _Fields(raw, where)
    action = raw.get("timeout_action", "REJECT")
    action = {0: "REJECT", 1: "DELAY"}.get(action, action) if isinstance(action, int) else action
    return QueuePolicy(
        timeout_action=action if isinstance(action, str) else repr(action),
        default_timeout_microseconds=f.integer("default_timeout_microseconds", 0),
        allow_timeout_override=bool(raw.get("allow_timeout_override", False)),
        max_queue_size=f.integer("max_queue_size", 0),
    )


def _version_policy(raw: dict[str, Value] | None, source: str) -> VersionPolicy:
    if raw is None:
        return VersionPolicy()
    where = f"{source}: version_policy"
    f = _Fields(raw, where)
    chosen = [k for k in ("latest", "all", "specific") if k in raw]
    if len(chosen) != 1:
        raise ConfigError(
            f"{where}: expected exactly one of latest {{...}}, all {{}} or specific {{...}}"
        )
    body = _Fields(f.message(chosen[0]) or {}, f"{where}: {chosen[0]}")
    if chosen[0] == "latest":
        num_versions = body.integer("num_versions", 1)
        if num_versions < 1:
            raise ConfigError(f"{body.where}: num_versions must be >= 1, got {num_versions}")
        return VersionPolicy("latest", num_versions=num_versions)
    if chosen[0] == "specific":
        versions = body.integers("versions")
        if not versions:
            raise ConfigError(f"{body.where}: versions must list at least one version")
        return VersionPolicy("specific", versions=versions)
    return VersionPolicy("all")


def _parameters(entries: list[dict[str, Value]], source: str) -> dict[str, str]:
    """Triton's `parameters` map, written as repeated { key: "k" value: { string_value: "v" } }."""
    parameters: dict[str, str] = {}
    for entry in entries:
        f = _Fields(entry, f"{source}: parameters")
        key = f.string("key")
        if key is None:
            raise ConfigError(f"{f.where}: every entry needs a key")
        value = _Fields(f.message("value") or {}, f"{f.where} {key!r}").string("string_value")
        parameters[key] = value if value is not None else ""
    return parameters


# ---------------------------------------------------------------------------------------------
# JSON model configurations (a load request's "config" parameter)

# ModelConfig fields of protobuf type int64/uint64, which protobuf's JSON mapping may write as
# strings ("dims": ["16"]); every other integer is a JSON number.
# Every integer field of model_config.proto: protobuf's JSON mapping takes each as a number
# or as a decimal string (Triton's model-control examples send {"max_batch_size": "16"}).
_INT_FIELDS = frozenset({
    "batch_size", "count", "default_priority_level", "default_timeout_microseconds", "device_id", "dim", "dims",
    "gather_kernel_buffer_threshold", "gpus", "int32_false_true", "level", "max_batch_size",
    "max_candidate_sequences", "max_inflight_requests", "max_queue_delay_microseconds", "max_queue_size",
    "max_sequence_idle_microseconds", "model_version", "num_versions", "preferred_batch_size", "priority",
    "priority_levels", "shape", "versions",
})
# Protobuf maps, which JSON writes as objects keyed by strings (their keys are names, not
# fields: never renamed); the text format (and so `parse`) as repeated {key, value} messages.
# Each map's key type: a uint64 key is a decimal string in JSON, a number in the text format.
# (ModelOptimizationPolicy's graph_spec `input` map shares its name with ModelConfig's input list.)
_MAP_FIELDS: dict[str, type] = {
    "parameters": str, "input_map": str, "output_map": str, "inputs": str, "cc_model_filenames": str,
    "metric_tags": str, "priority_queue_policy": int,
}
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


# JSON strings (their brackets do not nest), and what each byte does to the nesting depth.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NESTING = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_NESTING = bytes(b for b in range(256) if b not in b"[{]}")
DEFAULT_MAX_JSON_DEPTH = 64  # the core's --max-json-depth default


def json_depth(text: str | bytes) -> int:
    """How deeply the JSON document `text` nests (a top-level object is 1), found without
    parsing it, so that a document too deep for Python's recursive parser is told from a
    valid one (valid or not otherwise: the parser says that)."""
    import numpy as np

    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_NESTING).translate(_NESTING)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.int8)
    depth, deepest = 0, 0
    for start in range(0, len(steps), 1 << 20):  # bounded memory for large documents
        levels = np.cumsum(steps[start : start + (1 << 20)], dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


def check_json_depth(text: str | bytes, limit: int, what: str) -> None:
    """Raises ConfigError when `text` nests deeper than `limit` (--max-json-depth)."""
    depth = json_depth(text)
    if depth > limit:
        raise ConfigError(f"{what} nests {depth} levels deep, more than the limit of {limit} (--max-json-depth)")


def parse_json_config(
    text: str | bytes, source: str = "config override", max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> ModelConfig:
    """Reads a model configuration in Triton's JSON form (protobuf's JSON mapping of
    model_config.proto: what `GET /v2/models/{m}/config` returns and what a repository load's
    ``config`` parameter carries) into the same `ModelConfig` that `load_config` makes of a
    config.pbtxt. Field names may be lowerCamelCase, 64-bit integers strings, maps objects.
    A document nesting deeper than `max_depth` is refused before it is parsed. Raises
    ConfigError naming `source` and the field."""
    import json

    check_json_depth(text, max_depth, source)
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    return ModelConfig.from_dict(_from_json(raw, source), source)


def _from_json(value: Any, where: str, key: str = "") -> Any:
    """The JSON value as `parse` would have produced it from the text format."""
    if isinstance(value, dict):
        if key in _MAP_FIELDS:
            return [{"key": _map_key(k, _MAP_FIELDS[key]), "value": _from_json(v, f"{where}[{k}]")}
                    for k, v in value.items()]
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = _CAMEL.sub(lambda m: "_" + m.group(1).lower(), k)
            if name in out:
                raise ConfigError(f"{where}: field {name!r} is given twice")
            out[name] = _from_json(v, f"{where}: {name}", name)
        return out
    if isinstance(value, list):
        return [_from_json(v, where, key) for v in value]
    if value is None:
        raise ConfigError(f"{where}: null is not a value")
    if key in _INT_FIELDS and isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value):
        return int(value)  # anything else is left for the field's own check to word
    if isinstance(value, float) and value.is_integer() and key in _INT_FIELDS:
        return int(value)
    return value


def _map_key(key: str, key_type: type) -> str | int:
    """A JSON map key as the text format writes it: a uint64 key's decimal string as a number
    (anything else is left for the field's own check to word)."""
    return int(key) if key_type is int and re.fullmatch(r"[0-9]+", key) else key
