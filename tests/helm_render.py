"""Renders deploy/helm/openinfer the way `helm template` does, for the tests.

No helm binary is packaged for Debian or on PyPI, so this evaluates the small subset of Go
templates (with helm's sprig functions) that the chart uses: `.Values.x.y`, `.Release.Name`,
`.Chart.Name` / `.Chart.AppVersion`, `if` / `else` / `end`, `with`, the functions `not`, `eq`,
`add`, `toYaml`, and the pipes `quote` and `nindent N`, with `{{-` / `-}}` trimming. Anything
else raises, so a template that grows beyond the subset fails the tests instead of being
rendered wrongly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


class TemplateError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", body) in order, with helm's whitespace trimming applied."""
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        out.append(("action", m.group(2)))
        trim_next = bool(m.group(3))
        pos = m.end()
    chunk = text[pos:]
    out.append(("text", chunk.lstrip() if trim_next else chunk))
    return out


def _parse(tokens: list[tuple[str, str]], i: int = 0, stop: tuple[str, ...] = ()) -> tuple[list[Any], int, str]:
    """A block of nodes up to one of `stop` ("else", "end"); returns (nodes, next index, stopper)."""
    nodes: list[Any] = []
    while i < len(tokens):
        kind, body = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", body))
            continue
        word = body.split(" ", 1)[0]
        if word in stop:
            return nodes, i, word
        if word in ("if", "with"):
            then, i, how = _parse(tokens, i, ("else", "end"))
            other: list[Any] = []
            if how == "else":
                other, i, how = _parse(tokens, i, ("end",))
            if how != "end":
                raise TemplateError(f"{{{{ {body} }}}} has no end")
            nodes.append((word, body.split(" ", 1)[1], then, other))
        elif word in ("else", "end", "range", "define", "template", "include", "block"):
            raise TemplateError(f"unsupported or unmatched {{{{ {body} }}}}")
        else:
            nodes.append(("expr", body))
    if stop:
        raise TemplateError(f"missing {{{{ {stop[-1]} }}}}")
    return nodes, i, ""


def _value(term: str, dot: Any, top: dict[str, Any]) -> Any:
    m = _STRING.fullmatch(term)
    if m:
        return m.group(1)
    if re.fullmatch(r"-?\d+", term):
        return int(term)
    if term == ".":
        return dot
    if term.startswith("."):
        node: Any = top
        for part in term[1:].split("."):
            if not isinstance(node, dict):
                raise TemplateError(f"{term}: {part} of a non-map")
            node = node.get(part)
        return node
    raise TemplateError(f"unsupported term {term!r}")


def _truthy(v: Any) -> bool:
    return bool(v)  # Go templates: false, 0, nil, and empty strings, maps and lists are false


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _quote(v: Any) -> str:
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _call(words: list[str], piped: list[Any], dot: Any, top: dict[str, Any]) -> Any:
    name, args = words[0], [_value(w, dot, top) for w in words[1:]] + piped
    if name.startswith(".") or _STRING.fullmatch(name) or name.lstrip("-").isdigit():
        if len(words) > 1 or piped:
            raise TemplateError(f"{name} takes no arguments")
        return _value(name, dot, top)
    funcs = {
        "not": lambda a: not _truthy(a),
        "eq": lambda a, b: a == b,
        "add": lambda *a: sum(int(x) for x in a),
        "toYaml": _to_yaml,
        "quote": _quote,
        "nindent": lambda n, s: "\n" + "\n".join(" " * n + line for line in str(s).split("\n")),
    }
    if name not in funcs:
        raise TemplateError(f"unsupported function {name!r}")
    return funcs[name](*args)


def _eval(expr: str, dot: Any, top: dict[str, Any]) -> Any:
    result: list[Any] = []
    for stage in expr.split("|"):
        words = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', stage.strip())
        result = [_call(words, result, dot, top)]
    return result[0]


def _render(nodes: list[Any], dot: Any, top: dict[str, Any]) -> str:
    out = []
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "expr":
            v = _eval(node[1], dot, top)
            out.append("" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
        else:
            kind, expr, then, other = node
            v = _eval(expr, dot, top)
            if _truthy(v):
                out.append(_render(then, v if kind == "with" else dot, top))
            else:
                out.append(_render(other, dot, top))
    return "".join(out)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(chart: Path, release: str = "openinfer", values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's manifests (parsed YAML documents, empty ones dropped) with `values` merged
    over values.yaml, as `helm template RELEASE CHART -f values` renders them."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    top = {
        "Values": _merge(yaml.safe_load((chart / "values.yaml").read_text()), values or {}),
        "Release": {"Name": release, "Namespace": "default"},
        "Chart": {k[:1].upper() + k[1:]: v for k, v in meta.items()},
    }
    docs: list[dict[str, Any]] = []
    for path in sorted((chart / "templates").glob("*.yaml")):
        nodes, _, _ = _parse(_tokens(path.read_text()))
        docs += [d for d in yaml.safe_load_all(_render(nodes, top, top)) if d]
    return docs
