"""Rich display of servers and clients in notebooks (`_repr_html_`). Everything shown comes
from a server or its caller, so every piece of text is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape


def html(title: str, urls: Iterable[tuple[str, str]], index: Iterable[Mapping[str, str]] | None,
         error: str | None = None) -> str:
    """A small table: `title`, then (label, URL) rows, then one row per model version of a
    repository index (name, version, state, reason), or `error` where it could not be had."""
    rows = [f"<tr><th style='text-align:left'>{escape(label)}</th><td><code>{escape(url)}</code></td></tr>"
            for label, url in urls]
    out = [f"<div><strong>{escape(title)}</strong>", f"<table>{''.join(rows)}</table>"]
    if error is not None:
        out.append(f"<p style='color:#b00'>{escape(error)}</p>")
    elif index is not None:
        entries = list(index)
        if not entries:
            out.append("<p>no models</p>")
        else:
            head = "".join(f"<th style='text-align:left'>{h}</th>" for h in ("model", "version", "state", "reason"))
            body = "".join(
                "<tr>" + "".join(f"<td>{escape(str(e.get(k, '')))}</td>" for k in ("name", "version", "state", "reason"))
                + "</tr>"
                for e in entries
            )
            out.append(f"<table><tr>{head}</tr>{body}</table>")
    out.append("</div>")
    return "".join(out)
