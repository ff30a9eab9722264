"""The web console over plain HTTP: who the admin guard lets in (token header, the
login cookie, nothing), CSRF (Origin and form type on POSTs), the confirm step of
writes, and that what the pages show is escaped."""
from __future__ import annotations

import pytest

from helpers.console import call, login_cookie
from sparkmq.log.message import Message

pytestmark = [pytest.mark.integration]


def bearer(c) -> dict:
    return {"Authorization": f"Bearer {c.token}"}


@pytest.mark.parametrize("path", ["/console", "/console/topics", "/console/groups",
                                  "/console/messages?topic=x&key=k", "/console/dlq?group=g"])
def test_without_the_token_every_page_is_refused_with_the_login_form(console, path):
    status, headers, body = call(console.base, "GET", path)
    assert status == 401
    assert 'action="/console/login"' in body and 'name="token"' in body
    assert headers["WWW-Authenticate"].startswith("Bearer")
    status, _, body = call(console.base, "GET", path,
                           headers={"Cookie": "sparkmq_console_x=forged"})
    assert status == 401


def test_the_token_header_or_the_login_cookie_opens_the_console(console):
    console.broker.admin.create_topic({"name": "Orders", "queueNums": 2})
    status, _, body = call(console.base, "GET", "/console/topics", headers=bearer(console))
    assert status == 200 and "Orders" in body
    cookie = login_cookie(console.base, console.token)
    status, headers, body = call(console.base, "GET", "/console/topics",
                                 headers={"Cookie": f"other=1; {cookie}; more=2"})
    assert status == 200 and "Orders" in body
    assert "script-src" not in headers["Content-Security-Policy"]      # default-src 'none'
    assert headers["X-Frame-Options"] == "DENY"
    # the cookie is the console's only: the JSON admin API still wants the token
    assert call(console.base, "GET", "/status", headers={"Cookie": cookie})[0] == 401


def test_login_sets_an_httponly_samesite_strict_cookie_that_is_not_the_token(console):
    status, headers, _ = call(console.base, "POST", "/console/login",
                              form={"token": console.token, "next": "/console/groups"},
                              headers={"Origin": console.base})
    assert status == 303 and headers["Location"] == "/console/groups"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert console.token not in cookie
    # a wrong token sets nothing; an open redirect is not followed
    status, headers, body = call(console.base, "POST", "/console/login",
                                 form={"token": console.token + "x"},
                                 headers={"Origin": console.base})
    assert status == 401 and "Set-Cookie" not in headers and "Wrong admin token" in body
    for bad_next in ["//evil.example/", "http://evil.example/console",
                     "/console\r\nSet-Cookie: x=1", "/consolex"]:
        status, headers, _ = call(console.base, "POST", "/console/login",
                                  form={"token": console.token, "next": bad_next},
                                  headers={"Origin": console.base})
        assert status == 303 and headers["Location"] == "/console", bad_next
        assert headers.get_all("Set-Cookie") == [headers["Set-Cookie"]]


def test_console_posts_need_this_endpoints_origin_and_a_form(console):
    cookie = login_cookie(console.base, console.token)
    form = {"name": "Csrf", "queueNums": "1", "messageType": "NORMAL", "confirm": "yes"}
    for headers, expected in [({"Cookie": cookie}, 403),                         # no Origin
                              ({"Cookie": cookie, "Origin": "http://evil.example"}, 403),
                              ({"Cookie": cookie, "Origin": console.base,
                                "Sec-Fetch-Site": "cross-site"}, 403),
                              ({"Origin": console.base}, 401)]:               # no credential
        assert call(console.base, "POST", "/console/topics", form=form,
                    headers=headers)[0] == expected, headers
    status, _, _ = call(console.base, "POST", "/console/topics", form=form,
                        headers={"Cookie": cookie, "Origin": console.base,
                                 "Content-Type": "application/json"})
    assert status == 415
    assert call(console.base, "POST", "/console/login", form={"token": console.token})[0] == 403
    assert "Csrf" not in console.broker.store.topics()


def test_a_write_without_the_confirm_box_changes_nothing(console):
    cookie = login_cookie(console.base, console.token)
    headers = {"Cookie": cookie, "Origin": console.base}
    form = {"name": "Confirmed", "queueNums": "3", "messageType": "FIFO"}
    status, _, body = call(console.base, "POST", "/console/topics", form=form, headers=headers)
    assert status == 400 and "tick the box" in body
    assert "Confirmed" not in console.broker.store.topics()
    status, headers_out, _ = call(console.base, "POST", "/console/topics",
                                  form={**form, "confirm": "yes"}, headers=headers)
    assert status == 303 and headers_out["Location"].startswith("/console/topic?name=Confirmed")
    conf = console.broker.store.topics()["Confirmed"]
    assert conf.write_queue_nums == 3 and conf.attributes.get("message.type") == "FIFO"
    # with the token in the header (a tool, not a browser) no Origin is needed
    status, _, _ = call(console.base, "POST", "/console/topics",
                        form={"name": "ByTool", "confirm": "yes"}, headers=bearer(console))
    assert status == 303 and "ByTool" in console.broker.store.topics()


def test_what_the_pages_show_is_escaped(console):
    store = console.broker.store
    console.broker.admin.create_topic({"name": "Xss", "queueNums": 1})
    [r] = store.append([Message(topic="Xss", body=b"<script>alert(1)</script>",
                                keys=["<img src=x onerror=alert(2)>"], tags="<b>t</b>",
                                properties={"p": "\"><script>alert(3)</script>"})])
    for path in ["/console/messages?topic=Xss&key=%3Cimg%20src%3Dx%20onerror%3Dalert(2)%3E",
                 f"/console/message?id={r.message_id}"]:
        status, _, body = call(console.base, "GET", path, headers=bearer(console))
        assert status == 200, body
        assert "<script" not in body and "<img" not in body and "<b>t" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    status, _, body = call(console.base, "GET", "/console/topic?name=%3Cscript%3E",
                           headers=bearer(console))
    assert status == 400 and "<script" not in body and "&lt;script&gt;" in body


def test_resend_waits_as_a_send_does_and_a_sync_master_without_replica_stores_nothing(
        make_broker):
    """The console's resend goes through the send domain's checks: a SYNC_MASTER with
    no replica attached refuses it (as it refuses a producer's send) and stores nothing."""
    from helpers.net import free_port
    from sparkmq.broker.pop import TagFilter, dlq_topic
    b = make_broker(brokerRole="SYNC_MASTER", haListenPort=str(free_port()), haSecret="s" * 32)
    b.admin.create_topic({"name": "Payments", "queueNums": 1})
    b.store.append([Message(topic="Payments", body=b"poison", unique_key="P-1")])
    [d] = b.pop.pop("G", "Payments", batch_size=1, invisible_ms=60_000,
                    tag_filter=TagFilter("*"))
    b.pop.forward_to_dlq("G", d.receipt_handle, "Payments")
    [dead] = b.store.read(dlq_topic("G"), 0, 0, 1)
    before = b.store.max_offset("Payments", 0)
    status, _, body = call(f"http://127.0.0.1:{b.admin_port}", "POST", "/console/dlq/resend",
                           form={"group": "G", "id": dead.message_id, "confirm": "yes"},
                           headers={"Authorization": f"Bearer {b.admin_token}"})
    assert status == 503 and "no replica is attached" in body
    assert b.store.max_offset("Payments", 0) == before
