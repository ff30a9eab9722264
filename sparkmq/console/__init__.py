"""The web console: server-rendered HTML pages on the broker's admin endpoint, for an
operator used to rocketmq-dashboard. Open ``http(s)://<host>:<adminPort>/console``.

Pages (GET, :mod:`.pages`): ``/console`` the broker (cluster, name, role, state,
epoch, HA link and replica lag), ``/console/topics`` and ``/console/topic?name=``
(queues, min/max offset per queue, message type, permissions, retention, messages
in/out per second, the create-topic form), ``/console/groups`` and
``/console/group?name=`` (lag per queue from ``log.progress.group_lag``, and over the
last 10 minutes as an SVG sparkline), ``/console/dlq?group=`` (the group's ``%DLQ%``
topic), ``/console/messages`` (search by message id, by key, by store time range)
and ``/console/message?id=``; ``/console/api/summary`` is all of it as JSON for
the cluster console (:mod:`.api`, :mod:`.cluster`). Rates and lag over time come from the samples of
:mod:`.samples` (a ring in memory per broker).

Writes (POST, :mod:`.actions`): ``/console/login`` and ``/console/logout`` (the
session cookie), ``/console/topics`` (create a topic), ``/console/dlq/resend`` (send
a dead letter back to its original topic). A write happens only with
``confirm=yes`` in the form (a checkbox the operator ticks; without it the server
answers a page asking for it), and never while the broker is not running.

Who may do what is the admin guard's (``broker/admin_guard.py``): every console path
but ``/console/login`` needs the admin token, as ``Authorization: Bearer`` or as the
HttpOnly SameSite=Strict session cookie the login form sets; a console POST must be a
form and must come with this endpoint's own ``Origin`` (CSRF). The pages carry no
script and a Content-Security-Policy that allows none; every value shown is escaped
(:mod:`.html`).

Thread-safety: each request is handled on its own thread; the only shared state is
the sample rings of :mod:`.samples` (locked); what the pages read (store, broker
services) is thread-safe.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import parse_qs, urlsplit

from ..errors import SparkMQError, UserError
from . import html as h

log = logging.getLogger("sparkmq.console")

MAX_FORM_BYTES = 64 * 1024     # a console form's body, at most
HTML_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Page:
    """An answer: status, HTML (or text) body, content type, extra headers."""

    status: int
    body: str
    ctype: str = HTML_TYPE
    headers: tuple[tuple[str, str], ...] = h.SECURITY_HEADERS


@dataclass(frozen=True)
class Request:
    """One console request: the broker, its guard, the query string and (POST) form
    fields, first value of each."""

    broker: object
    guard: object
    method: str
    path: str
    query: Mapping[str, str]
    form: Mapping[str, str]
    headers: Mapping[str, str]

    def arg(self, name: str, default: str = "") -> str:
        """A field of the form (POST) or else of the query string, stripped."""
        value = self.form.get(name)
        if value is None:
            value = self.query.get(name, default)
        return value.strip()

    @property
    def confirmed(self) -> bool:
        return self.form.get("confirm") == "yes"


def _fields(text: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


def redirect(location: str, headers: tuple = ()) -> Page:
    """303 See Other to a console path (after a write: reloading does not repeat it)."""
    return Page(303, "", "text/plain", h.SECURITY_HEADERS + (("Location", location),) + headers)


def error_page(status: int, message: str, title: str = "Error") -> Page:
    return Page(status, h.page(title, "", error=message, who="admin"))


def refusal_page(refusal, target: str, nav_links=h.NAV) -> Page:
    """The guard's refusal as a page; a 401 shows the login form (back to ``target``,
    the path with its query)."""
    if refusal.status == 401:
        from .pages import login_form
        return Page(401, h.page("Log in", login_form(target), error="This console needs the "
                                "broker's admin token.", nav_links=nav_links),
                    headers=h.SECURITY_HEADERS + tuple(refusal.headers)
                    + (("Connection", "close"),))
    return Page(refusal.status, h.page("Refused", "", error=refusal.message,
                                       nav_links=nav_links),
                headers=h.SECURITY_HEADERS + (("Connection", "close"),))


def too_large() -> Page:
    return Page(413, h.page("Refused", "", error=f"a console form is at most {MAX_FORM_BYTES} "
                            "bytes, with a Content-Length"),
                headers=h.SECURITY_HEADERS + (("Connection", "close"),))


def handle(broker, guard, method: str, target: str, headers: Mapping[str, str],
           body: bytes) -> Page:
    """Answer one console request that the guard let through (``target``: the path
    with its query string; ``body``: a POST's form, url-encoded)."""
    from . import actions, api, pages
    url = urlsplit(target)
    path = url.path.rstrip("/") or "/"
    try:
        form = _fields(body.decode("utf-8")) if method == "POST" else {}
    except UnicodeDecodeError:
        return error_page(400, "the form is not UTF-8")
    req = Request(broker, guard, method, path, _fields(url.query), form, headers)
    routes = {**pages.ROUTES, **api.ROUTES} if method == "GET" else actions.ROUTES
    route = routes.get(path)
    if route is None:
        return error_page(404 if method == "GET" else 405, f"no console page {path}",
                          "Not found")
    try:
        return route(req)
    except UserError as e:
        return error_page(400, e.message)
    except SparkMQError as e:
        return error_page(409 if e.retriable else 500, f"{e.code}: {e.message}")
    except ValueError as e:        # a number or time field that does not parse
        return error_page(400, f"bad field: {e}")
    except Exception as e:  # the console answers 500 and keeps serving; logged
        log.exception("console %s %s failed", method, path)
        return error_page(500, f"{type(e).__name__}: {e}")
