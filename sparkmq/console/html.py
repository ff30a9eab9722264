"""HTML building blocks of the console: the page frame, tables, forms, and how values
are shown. Every value that reaches a page goes through :func:`esc` (``html.escape``
with quotes) here; callers pass raw values and pre-built ``Markup`` only for HTML
this module made. No scripts: the pages work with JavaScript off, and the
Content-Security-Policy in :data:`SECURITY_HEADERS` forbids any.

Pure functions of their arguments (thread-safe).
"""
from __future__ import annotations

import datetime as _dt
import html
from typing import Iterable, Sequence

BODY_PREVIEW_BYTES = 160         # what a result table shows of a body
BODY_DETAIL_BYTES = 64 * 1024    # what a message's own page shows of it

SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
     "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),    # not no-referrer: Chromium then sends Origin: null
    ("Cache-Control", "no-store"),
)

NAV = (("Cluster", "/console"), ("Topics", "/console/topics"),
       ("Consumers", "/console/groups"), ("Messages", "/console/messages"))

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{background:#1f3a5f;color:#fff;padding:.6em 1em;display:flex;gap:1.2em;align-items:center}
header a{color:#fff;text-decoration:none}header a.on{text-decoration:underline}
header .who{margin-left:auto;font-size:.9em}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#eef2f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.body{font-family:monospace;white-space:pre-wrap;word-break:break-all;max-width:40em}
.notice{background:#e6f4ea;border:1px solid #9c9;padding:.5em}
.error{background:#fdecea;border:1px solid #d99;padding:.5em}
form.inline{display:inline}fieldset{margin:.5em 0 1em;max-width:48em}
label{margin-right:1em}
"""


class Markup(str):
    """HTML that :func:`esc` passes through unchanged (made by this module)."""


def esc(value) -> Markup:
    """``value`` as HTML text (None as an empty string); ``Markup`` as it is."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable) -> Markup:
    return Markup("".join(esc(p) for p in parts))


def attrs(**values) -> Markup:
    """HTML attributes: ``class_`` is written ``class``, ``data_x`` ``data-x``; a True
    value bare, a None/False one left out."""
    out = []
    for k, v in values.items():
        if v is None or v is False:
            continue
        k = k.rstrip("_").replace("_", "-")
        out.append(f" {k}" if v is True else f' {k}="{esc(v)}"')
    return Markup("".join(out))


def tag(name: str, content="", /, **attributes) -> Markup:
    """``<name attributes>content</name>`` (see :func:`attrs`)."""
    return Markup(f"<{name}{attrs(**attributes)}>{esc(content)}</{name}>")


def link(text, href: str) -> Markup:
    return tag("a", text, href=href)


def table(headers: Sequence[str], rows: Iterable[Sequence], *, numeric: Sequence[int] = (),
          id_: str | None = None, empty: str = "none") -> Markup:
    """A table; cells in the ``numeric`` columns are right-aligned."""
    head = join(tag("th", h) for h in headers)
    body = [Markup("<tr>" + join(tag("td", c, class_="num" if i in numeric else None)
                                 for i, c in enumerate(r)) + "</tr>") for r in rows]
    if not body:
        body = [Markup(f'<tr><td colspan="{len(headers)}">{esc(empty)}</td></tr>')]
    return tag("table", Markup(f"<thead><tr>{head}</tr></thead><tbody>{join(body)}</tbody>"),
               id=id_)


def field_input(label: str, name: str, value="", *, type_: str = "text", **more) -> Markup:
    """A labelled ``<input>``."""
    return tag("label", join([label, " ", Markup(
        f"<input{attrs(type=type_, name=name, value=value, **more)}>")]))


def hidden(name: str, value) -> Markup:
    return Markup(f"<input{attrs(type='hidden', name=name, value=value)}>")


def confirm_box(text: str) -> Markup:
    """The checkbox every write asks for (the server refuses a form without it)."""
    return Markup(f'<label><input type="checkbox" name="confirm" value="yes"> {esc(text)}</label>')


def form(action: str, content, *, method: str = "post", button: str = "Submit",
         class_: str | None = None, legend: str | None = None) -> Markup:
    inner = join([tag("legend", legend) if legend else "", content, " ",
                  tag("button", button, type="submit")])
    if legend:
        inner = tag("fieldset", inner)
    return tag("form", inner, method=method, action=action, class_=class_)


def page(title: str, content, *, active: str = "", who: str | None = None,
         notice: str | None = None, error: str | None = None, nav_links=NAV) -> str:
    """The whole document: header with the navigation (``nav_links``: (text, href)
    pairs), then ``content``."""
    nav = join(tag("a", text, href=href, class_="on" if href == active else None)
               for text, href in nav_links)
    logout = "" if who is None else form("/console/logout", "", button="Log out",
                                         class_="inline")
    head = tag("header", join([tag("strong", "SparkMQ Console"), nav,
                               tag("span", join([who or "", " ", logout]), class_="who")]))
    flash = join([tag("p", notice, class_="notice") if notice else "",
                  tag("p", error, class_="error") if error else ""])
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)} - SparkMQ Console</title><style>{STYLE}</style></head>"
            f"<body>{head}<main><h1>{esc(title)}</h1>{flash}{esc(content)}</main></body></html>")


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 24,
              label: str = "") -> Markup:
    """``values`` (oldest first) as an inline SVG line, no script; its ``<title>``
    says the last, least and greatest value. Empty for fewer than one value."""
    if not values:
        return Markup("")
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1
    step = (width - 2) / max(1, len(values) - 1)
    points = " ".join(f"{1 + i * step:.1f},{height - 2 - (v - lo) * (height - 4) / span:.1f}"
                      for i, v in enumerate(values))
    if len(values) == 1:
        points += f" {width - 1:.1f},{points.split(',')[1]}"
    title = f"{label}{' ' if label else ''}last {values[-1]:g}, min {lo:g}, max {hi:g} " \
            f"({len(values)} samples)"
    return Markup(f'<svg class="spark" width="{width}" height="{height}" '
                  f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
                  f"<title>{esc(title)}</title>"
                  f'<polyline fill="none" stroke="#1f3a5f" stroke-width="1.5" '
                  f'points="{points}"/></svg>')


def rate_text(per_s: float | None) -> str:
    """Messages per second as shown: blank when unknown, else two decimals."""
    return "" if per_s is None else f"{per_s:.2f}"


def when(ms: int | None) -> str:
    """A millisecond timestamp as UTC ``YYYY-MM-DD HH:MM:SS.mmm``."""
    if ms is None:
        return ""
    t = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{int(ms) % 1000:03d}"


def body_text(body: bytes | None, limit: int = BODY_PREVIEW_BYTES) -> str:
    """The first ``limit`` bytes of a body as text (UTF-8, bad bytes replaced), with
    a note of the size when cut."""
    body = body or b""
    text = body[:limit].decode("utf-8", errors="replace")
    return text if len(body) <= limit else f"{text}… ({len(body)} bytes)"


def parse_time_ms(value: str) -> int:
    """A time given in a form, as ms since the epoch: digits are ms already; else
    ISO 8601 (``datetime-local``'s ``YYYY-MM-DDTHH:MM[:SS]``), UTC unless it says."""
    value = value.strip()
    if value.isdigit():
        return int(value)
    t = _dt.datetime.fromisoformat(value)
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return int(t.timestamp() * 1000)


def time_input_value(ms: int) -> str:
    """``ms`` as a ``datetime-local`` input value (UTC, to the second)."""
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
