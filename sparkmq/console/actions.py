"""The console's writes (POST): login and logout (the session cookie), create a topic,
resend a dead letter. ``ROUTES`` maps paths to them.

The guard has already checked the credential (except for the login itself), that
the body is a form and that it came from this endpoint's own page (``Origin``).
Here every state change also needs ``confirm=yes`` (the form's checkbox): a form
without it gets a page that repeats it with the box to tick, and changes nothing.
Nothing is written while the broker is not running (503).
"""
from __future__ import annotations

import logging

from ..errors import SparkMQError, TopicNotFoundError, UserError
from . import html as h
from .pages import (ORIGIN_MESSAGE_ID, ORIGIN_TOPIC, create_topic_form, dlq_url,
                    message_url, topic_url)

log = logging.getLogger("sparkmq.console")

DLQ_PROPERTIES = (ORIGIN_TOPIC, ORIGIN_MESSAGE_ID, "DLQ_ORIGIN_QUEUE", "DLQ_ORIGIN_QUEUE_OFFSET")


def _page(status: int, title: str, content, **kw):
    from . import Page
    return Page(status, h.page(title, content, who="admin", **kw))


def _cookie_header(req, value: str, *, max_age: int | None = None) -> tuple[str, str]:
    """``Set-Cookie`` of the console session: HttpOnly, SameSite=Strict, Path=/console,
    Secure on https; no Max-Age: it lasts the browser session."""
    name, _ = req.guard.console_cookie()
    parts = [f"{name}={value}", "Path=/console", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if req.broker.config.admin_scheme == "https":
        parts.append("Secure")
    return "Set-Cookie", "; ".join(parts)


def login(req):
    """Check the token (constant time) and set the session cookie; back to ``next``."""
    from . import Page, redirect
    from .pages import login_form, safe_next
    next_path = safe_next(req.form.get("next", "/console"))
    if not req.guard.token_matches(req.form.get("token", "")):
        log.warning("console login refused: wrong token")
        return Page(401, h.page("Log in", login_form(next_path), error="Wrong admin token."))
    _, value = req.guard.console_cookie()
    return redirect(next_path, (_cookie_header(req, value),))


def logout(req):
    from . import redirect
    return redirect("/console/login", (_cookie_header(req, "", max_age=0),))


def _writable(req) -> str | None:
    """Why the broker cannot take a write now, or None."""
    b = req.broker
    if not b.is_running:
        return f"the broker is {b.state.value}; try again when it is running"
    return b.ha.write_refusal()


def create_topic(req):
    """Create a topic from the form: name, queueNums, messageType, retentionMs."""
    from . import redirect
    name = req.arg("name")
    queues, mtype, retention = req.arg("queueNums"), req.arg("messageType"), req.arg("retentionMs")
    form = create_topic_form(name, queues, mtype or "NORMAL", retention)
    if not name:
        return _page(400, "Create topic", form, error="Give the topic's name.")
    if not req.confirmed:
        return _page(400, "Create topic", form,
                     error=f"Nothing was created: tick the box to confirm creating topic {name}.")
    refusal = _writable(req)
    if refusal:
        return _page(503, "Create topic", form, error=refusal)
    if name in req.broker.store.topics():
        return _page(409, "Create topic", form, error=f"Topic {name} exists already.")
    request = {"name": name, "messageType": mtype or None,
               "queueNums": int(queues) if queues else None,
               "retentionMs": int(retention) if retention else None}
    if any(v is not None and v < 1 for v in (request["queueNums"], request["retentionMs"])):
        raise UserError("queues and retention must be positive")
    req.broker.admin.create_topic(request)
    log.info("console: created topic %s", name)
    return redirect(topic_url(name) + "&notice=created")


def resend(req):
    """Append a copy of a dead letter to its original topic (``DLQ_ORIGIN_TOPIC``),
    without the DLQ's own properties; the dead letter stays where it is."""
    from ..log.message import Message
    group_name, mid = req.arg("group"), req.arg("id")
    store = req.broker.store
    m = store.lookup(mid) if mid else None
    if m is None or m.topic != "%DLQ%" + group_name:
        raise UserError(f"no dead letter {mid!r} of group {group_name!r}")
    origin = m.properties.get(ORIGIN_TOPIC)
    if not origin:
        raise UserError(f"dead letter {mid} does not say its original topic")
    if not req.confirmed:
        ask = h.form("/console/dlq/resend", h.join([
            h.hidden("group", group_name), h.hidden("id", mid),
            h.confirm_box(f"Yes, send this message to {origin} again")]), button="Resend")
        return _page(400, "Resend", ask, error="Nothing was sent: tick the box to confirm.")
    refusal = _writable(req)
    if refusal:
        return _page(503, "Resend", "", error=refusal)
    if origin not in store.topics():
        raise TopicNotFoundError(f"the original topic {origin} no longer exists")
    props = {k: v for k, v in m.properties.items() if k not in DLQ_PROPERTIES}
    sender = req.broker.sender      # the same writability and replication as a send
    try:
        sender.check_append()
    except SparkMQError as e:
        return _page(503, "Resend", "", error=str(e))
    [r] = store.append([Message(topic=origin, body=m.body, tags=m.tags, keys=m.keys,
                                properties=props, born_timestamp=m.born_timestamp,
                                born_host=m.born_host, message_group=m.message_group,
                                unique_key=m.unique_key)],
                       limits_checked=True)     # accepted at its first send
    if not r.ok:
        return _page(409, "Resend", "", error=f"the store refused it: {r.status.name}")
    status = sender.replicated(r)
    if status is not r.status:      # stored, but not on the replica in time (SYNC_MASTER)
        return _page(504, "Resend", "", error=f"stored as {r.message_id} but {status.name}: "
                     "the replica did not acknowledge it in time")
    log.info("console: resent dead letter %s of %s to %s as %s", mid, group_name, origin,
             r.message_id)
    return _page(200, "Resent", h.join([
        h.tag("p", h.join(["Dead letter ", h.link(m.unique_key or mid, message_url(mid)),
                           " was sent to ", h.link(origin, topic_url(origin)),
                           f" queue {r.queue_id} at offset {r.queue_offset} as message ",
                           h.link(r.message_id, message_url(r.message_id)), "."]),
              id="resent"),
        h.link(f"Back to the dead letters of {group_name}", dlq_url(group_name))]),
        notice="Resent.")


ROUTES = {"/console/login": login, "/console/logout": logout, "/console/topics": create_topic,
          "/console/dlq/resend": resend}
