"""The web console in headless Chromium (Playwright, Debian's browser) against a real
in-process broker: log in, every page shows the broker's real data, search finds a
sent message by id, key and time, a topic created from the console takes a send from
the official client, a dead letter resent from the console is back on its topic, and
without the token nothing is shown. A screenshot of each page goes to ``tmp_path``."""
from __future__ import annotations

import re

import pytest
from rocketmq import Producer

from helpers.brokers import client_conf, msg
from sparkmq.broker.pop import TagFilter, dlq_topic
from sparkmq.log.message import Message

pytestmark = [pytest.mark.integration]


def log_in(page, console, path="/console"):
    """Open ``path``, meet the login form (401), log in; the page is ``path`` after."""
    response = page.goto(console.url(path))
    assert response.status == 401
    page.fill("input[name=token]", console.token)
    go(page, "button:has-text('Log in')")
    assert page.url == console.url(path)


def go(page, target) -> None:
    """Click ``target`` (a selector or a locator) and wait for the page it loads."""
    with page.expect_navigation():
        if isinstance(target, str):
            page.click(target)
        else:
            target.click()


def cell_texts(page, selector: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in page.eval_on_selector_all(
        f"{selector} tbody tr",
        "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText))")]


def shot(page, tmp_path, name: str) -> None:
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


@pytest.fixture
def loaded(console):
    """The broker with topic Orders (2 queues, 5 messages with keys), group GroupA's
    committed offsets, and one dead letter of GroupA."""
    b = console.broker
    b.admin.create_topic({"name": "Orders", "queueNums": 2})
    sent = b.store.append([Message(topic="Orders", body=f"order-{i} <b>body</b>".encode(),
                                   keys=[f"key-{i}"], tags="TagA", unique_key=f"UNIQ-{i}")
                           for i in range(5)])
    b.store.commit_consumer_offsets("GroupA", {("Orders", 0): 1, ("Orders", 1): 0})
    b.admin.create_topic({"name": "Payments", "queueNums": 1})
    b.store.append([Message(topic="Payments", body=b"poison", keys=["bad"], unique_key="P-1")])
    [d] = b.pop.pop("GroupA", "Payments", batch_size=1, invisible_ms=60_000,
                    tag_filter=TagFilter("*"))
    b.pop.forward_to_dlq("GroupA", d.receipt_handle, "Payments")
    return console, sent


def test_every_page_shows_the_brokers_real_data(page, loaded, tmp_path):
    console, sent = loaded
    b = console.broker
    log_in(page, console)
    broker_rows = dict(r[:2] for r in cell_texts(page, "#broker"))
    assert broker_rows["Broker name"] == "broker-a" and broker_rows["State"] == "running"
    assert broker_rows["Role"] == b.role and broker_rows["Epoch"] == str(b.store.epoch)
    shot(page, tmp_path, "overview")

    go(page, "header >> text=Topics")
    topics = {r[0]: r for r in cell_texts(page, "#topics")}
    assert topics["Orders"][6] == "5" and topics["Orders"][4] == "2"
    assert topics[dlq_topic("GroupA")][1] == "DLQ"
    shot(page, tmp_path, "topics")

    go(page, "#topics >> text=Orders")
    ranges = b.store.queue_ranges("Orders")
    assert cell_texts(page, "#queues") == [
        [str(q), str(lo), str(hi), str(hi - lo)] for (_, q), (lo, hi) in sorted(ranges.items())]
    shot(page, tmp_path, "topic")

    go(page, "header >> text=Consumers")
    groups = {r[0]: r for r in cell_texts(page, "#groups")}
    lag = sum(hi for (_, q), (_, hi) in ranges.items()) - 1
    assert groups["GroupA"][5] == str(lag) and groups["GroupA"][7] == "1"
    shot(page, tmp_path, "groups")
    go(page, "#groups >> text=GroupA")
    assert [r[:2] + r[4:5] for r in cell_texts(page, "#lag") if r[0] == "Orders"] == [
        ["Orders", "0", str(ranges[("Orders", 0)][1] - 1)],
        ["Orders", "1", str(ranges[("Orders", 1)][1])]]
    shot(page, tmp_path, "group")


def test_search_finds_a_sent_message_by_id_key_and_time(page, loaded, tmp_path):
    console, sent = loaded
    log_in(page, console, "/console/messages")
    by_id = page.locator("form", has_text="By message id")
    by_id.locator("input[name=id]").fill("UNIQ-3")            # the id a client sees
    go(page, by_id.locator("button"))
    rows = cell_texts(page, "#results")
    assert len(rows) == 1 and rows[0][0] == "UNIQ-3" and rows[0][5] == "key-3"
    assert rows[0][7] == "order-3 <b>body</b>"                 # shown as text, escaped
    shot(page, tmp_path, "search-id")

    page.fill("form:has-text('By message id') input[name=id]", sent[1].message_id)  # store id
    go(page, "form:has-text('By message id') button")
    assert cell_texts(page, "#results")[0][3] == str(sent[1].queue_offset)

    by_key = page.locator("form", has_text="By key")
    by_key.locator("select[name=topic]").select_option("Orders")
    by_key.locator("input[name=key]").fill("key-2")
    go(page, by_key.locator("button"))
    [row] = cell_texts(page, "#results")
    assert row[0] == "UNIQ-2" and row[2] == str(sent[2].queue_id)
    shot(page, tmp_path, "search-key")

    by_time = page.locator("form", has_text="By store time")
    by_time.locator("select[name=topic]").select_option("Orders")
    by_time.locator("input[name=start]").fill("2000-01-01T00:00:00")
    go(page, by_time.locator("button"))
    assert sorted(r[0] for r in cell_texts(page, "#results")) == [f"UNIQ-{i}" for i in range(5)]
    shot(page, tmp_path, "search-time")

    go(page, "#results >> text=UNIQ-0")
    assert page.inner_text("#body") == "order-0 <b>body</b>"
    shot(page, tmp_path, "message")


def test_a_dead_letter_resent_from_the_console_is_back_on_its_topic(page, loaded, tmp_path):
    console, _ = loaded
    store = console.broker.store
    before = store.max_offset("Payments", 0)
    log_in(page, console, "/console/dlq?group=GroupA")
    [row] = cell_texts(page, "#dlq")
    assert row[0] == "P-1" and row[1] == "Payments" and row[8] == "poison"
    shot(page, tmp_path, "dlq")
    go(page, "#dlq button:has-text('Resend')")               # without the box: nothing
    assert "tick the box" in page.inner_text(".error")
    assert store.max_offset("Payments", 0) == before
    page.check("input[name=confirm]")
    go(page, "button:has-text('Resend')")
    assert "was sent to Payments" in page.inner_text("#resent")
    shot(page, tmp_path, "resent")
    assert store.max_offset("Payments", 0) == before + 1
    [back] = store.read("Payments", 0, before, 1)
    assert back.body == b"poison" and back.unique_key == "P-1"
    assert not any(k.startswith("DLQ_ORIGIN") for k in back.properties)


def test_a_topic_created_from_the_console_accepts_a_send(page, console, clients, tmp_path):
    log_in(page, console, "/console/topics")
    form = page.locator("form", has_text="Create topic")
    form.locator("input[name=name]").fill("FromConsole")
    form.locator("input[name=queueNums]").fill("3")
    form.locator("input[name=confirm]").check()
    shot(page, tmp_path, "create-topic")
    go(page, form.locator("button"))
    page.wait_for_url(re.compile(r".*/console/topic\?name=FromConsole.*"))
    assert "Topic created." in page.inner_text(".notice")
    assert [r[0] for r in cell_texts(page, "#queues")] == ["0", "1", "2"]
    producer = clients(Producer(client_conf(console.broker), ("FromConsole",)))
    receipt = producer.send(msg("FromConsole", b"hello console", keys="k-console"))
    page.reload()
    assert sum(int(r[3]) for r in cell_texts(page, "#queues")) == 1
    page.goto(console.url("/console/messages?id=" + receipt.message_id))
    [row] = cell_texts(page, "#results")
    assert row[1] == "FromConsole" and row[7] == "hello console"
    shot(page, tmp_path, "created-topic")


def test_without_the_token_the_browser_sees_only_the_login_form(page, loaded, tmp_path):
    console, _ = loaded
    response = page.goto(console.url("/console/topics"))
    assert response.status == 401
    assert "Orders" not in page.content() and page.is_visible("input[name=token]")
    page.fill("input[name=token]", "not-the-token")
    go(page, "button:has-text('Log in')")
    assert "Wrong admin token" in page.inner_text(".error")
    shot(page, tmp_path, "login-refused")
    page.fill("input[name=token]", console.token)
    go(page, "button:has-text('Log in')")
    page.wait_for_url(console.url("/console/topics"))
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["value"] != console.token
    go(page, "button:has-text('Log out')")
    assert page.goto(console.url("/console/topics")).status == 401
