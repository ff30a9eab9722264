"""SQL92 property filters: parser/evaluator units (incl. hypothesis against a Python
reference), and the broker end to end with the official client's SQL92 FilterExpression."""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration
import pytest
from hypothesis import given, settings, strategies as st
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import FilterType
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from sparkmq.broker.filter import FilterExpressionError, SqlFilter
from sparkmq.errors import UserError

from helpers.brokers import client_conf, msg

Code = pb.Code


def ev(expr: str, **props) -> bool:
    return SqlFilter(expr).evaluate({k: str(v) for k, v in props.items()})


# ---------------------------------------------------------------- units
@pytest.mark.parametrize("expr,props,want", [
    ("a > 5", {"a": 6}, True),
    ("a > 5", {"a": 5}, False),
    ("a >= 5 AND b = 'x'", {"a": 5, "b": "x"}, True),
    ("a >= 5 AND b = 'x'", {"a": 5, "b": "y"}, False),
    ("a < 5 OR b = 'x'", {"a": 9, "b": "x"}, True),
    ("a <= 2.5", {"a": "2.5"}, True),
    ("a <> 3", {"a": 4}, True),
    ("a != 3", {"a": 3}, False),
    ("a = 10", {"a": "10.0"}, True),                 # numeric compare, not textual
    ("a > 9", {"a": "10"}, True),                    # not lexicographic for numbers
    ("s > 'abc'", {"s": "abd"}, True),               # strings compare as strings
    ("s < 'abc'", {"s": "abd"}, False),
    ("NOT a > 5", {"a": 1}, True),
    ("NOT (a > 5 OR b = 'x')", {"a": 1, "b": "y"}, True),
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a IN (1, 2, 3)", {"a": "2"}, True),
    ("a BETWEEN 1 AND 3", {"a": 3}, True),
    ("a BETWEEN 1 AND 3", {"a": 4}, False),
    ("a NOT BETWEEN 1 AND 3 AND b = 'x'", {"a": 4, "b": "x"}, True),
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": 1}, False),
    ("a IS NOT NULL", {"a": 1}, True),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("flag = TRUE", {"flag": "true"}, True),
    ("flag = FALSE", {"flag": "TRUE"}, False),
    ("name = 'it''s'", {"name": "it's"}, True),
    ("TAGS = 'TagA' AND a > 1", {"TAGS": "TagA", "a": 2}, True),
    ("a contains 'ell' and b startswith 'he' and c endswith 'lo'",
     {"a": "hello", "b": "hello", "c": "hello"}, True),
    ("a > -1", {"a": "0"}, True),
    ("(a = 1) AND ((b = 2) OR (c = 3))", {"a": 1, "c": 3}, True),
])
def test_evaluates(expr, props, want):
    assert ev(expr, **props) is want


@pytest.mark.parametrize("expr,props", [
    ("a > 5", {}),                      # missing property: UNKNOWN
    ("NOT a > 5", {}),                  # NOT UNKNOWN is UNKNOWN, not TRUE
    ("a > 5", {"a": "abc"}),            # not a number: UNKNOWN
    ("a NOT IN ('x')", {}),
    ("a NOT BETWEEN 1 AND 2", {}),
    ("NOT (a = 1 OR b = 2)", {"a": 0}),  # FALSE OR UNKNOWN = UNKNOWN
])
def test_unknown_does_not_pass(expr, props):
    assert ev(expr, **props) is False


def test_three_valued_or_and():
    assert ev("a > 5 OR b = 1", b=1) is True          # UNKNOWN OR TRUE = TRUE
    assert ev("a > 5 AND b = 1", b=2) is False         # UNKNOWN AND FALSE = FALSE
    assert ev("NOT (a > 5 AND b = 1)", b=2) is True


@pytest.mark.parametrize("expr,fragment", [
    ("", "empty"),
    ("a >", "expected a property name or a literal"),
    ("a > 5 AND", "expected a property name"),
    ("(a > 5", "expected ')'"),
    ("a = 'unterminated", "unterminated string"),
    ("a IN ()", "expected a literal"),
    ("a BETWEEN 1 2", "AND (of BETWEEN)"),
    ("a IS 5", "expected NULL"),
    ("a ~ 5", "unexpected character"),
    ("a > 5 b < 3", "expected AND, OR or end of expression"),
    ("a", "expected a comparison"),
    ("(" * 5000 + "a=1" + ")" * 5000, "nested too deeply"),
])
def test_malformed_is_refused_with_a_clear_message(expr, fragment):
    with pytest.raises(FilterExpressionError) as ei:
        SqlFilter(expr)
    assert fragment in str(ei.value)
    assert isinstance(ei.value, UserError) and isinstance(ei.value, ValueError)


_names = st.sampled_from(["a", "b", "c"])
_ints = st.integers(-5, 5)


@st.composite
def _cmp_expr(draw):
    """(SQL text, Python reference over a dict of ints) for a random boolean expression."""
    depth = draw(st.integers(0, 3))
    return _build(draw, depth)


def _build(draw, depth):
    kind = draw(st.sampled_from(["cmp", "between", "in", "null"] + ["and", "or", "not"] * (depth > 0)))
    if kind == "cmp":
        n, op, v = draw(_names), draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="])), draw(_ints)
        py = {"=": "==", "<>": "!="}.get(op, op)
        return f"{n} {op} {v}", lambda p: None if p.get(n) is None else eval(f"{p[n]} {py} {v}")
    if kind == "between":
        n, lo, hi = draw(_names), draw(_ints), draw(_ints)
        return f"{n} BETWEEN {lo} AND {hi}", lambda p: None if p.get(n) is None else lo <= p[n] <= hi
    if kind == "in":
        n, vals = draw(_names), draw(st.lists(_ints, min_size=1, max_size=3))
        return (f"{n} IN ({', '.join(map(str, vals))})",
                lambda p: None if p.get(n) is None else p[n] in vals)
    if kind == "null":
        n = draw(_names)
        return f"{n} IS NULL", lambda p: p.get(n) is None
    if kind == "not":
        s, f = _build(draw, depth - 1)
        return f"NOT ({s})", lambda p: None if f(p) is None else not f(p)
    (s1, f1), (s2, f2) = _build(draw, depth - 1), _build(draw, depth - 1)
    op = kind.upper()

    def three(p):
        x, y = f1(p), f2(p)
        if op == "AND":
            return False if False in (x, y) else (None if None in (x, y) else True)
        return True if True in (x, y) else (None if None in (x, y) else False)
    return f"({s1}) {op} ({s2})", three


@settings(max_examples=300, deadline=None)
@given(_cmp_expr(), st.dictionaries(_names, _ints))
def test_matches_a_python_reference_with_three_valued_logic(case, values):
    sql, reference = case
    props = {k: str(v) for k, v in values.items()}
    assert SqlFilter(sql).evaluate(props) is (reference(values) is True)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_is_refused_never_crashes(text):
    try:
        f = SqlFilter(text)
    except FilterExpressionError:
        return
    assert f.evaluate({"a": "1"}) in (True, False)


# ---------------------------------------------------------------- broker, end to end
@pytest.mark.integration
def test_official_client_sql92_filter_at_the_broker(make_broker, clients):
    b = make_broker(enablePropertyFilter="true")
    producer = clients(Producer(client_conf(b), ("T",)))
    for i in range(8):
        m = msg("T", f"m{i}".encode(), tag="TagA" if i % 2 else "TagB")
        m.add_property("a", str(i))
        m.add_property("region", "eu" if i < 4 else "us")
        producer.send(m)
    expr = FilterExpression("a > 2 AND region IN ('us') AND TAGS = 'TagA'", FilterType.SQL)
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"T": expr}, await_duration=2))
    got = []
    for _ in range(5):
        got += consumer.receive(32, 30)
        if len(got) >= 2:
            break
    assert sorted(m.body for m in got) == [b"m5", b"m7"]
    assert all(m.properties["region"] == "us" for m in got)
    for m in got:
        consumer.ack(m)
    assert consumer.receive(32, 30) == []


@pytest.mark.integration
def test_malformed_or_disabled_sql_is_refused_and_the_broker_keeps_serving(make_broker):
    on = make_broker(enablePropertyFilter="true")
    off = make_broker("broker-b")
    for b in (on, off):
        b.store.create_topic("T")

    def receive(b, expression, ftype=pb.SQL):
        with grpc.insecure_channel(b.endpoint) as ch:
            s = MessagingServiceStub(ch)
            return [r.status for r in s.ReceiveMessage(spb.ReceiveMessageRequest(
                group=pb.Resource(name="G"), message_queue=pb.MessageQueue(topic=pb.Resource(name="T")),
                batch_size=1, long_polling_timeout=Duration(nanos=100_000_000),
                filter_expression=pb.FilterExpression(type=ftype, expression=expression)),
                timeout=10) if r.HasField("status")]

    bad = receive(on, "a > AND b")
    assert [x.code for x in bad] == [Code.ILLEGAL_FILTER_EXPRESSION]
    assert "expected a property name or a literal" in bad[0].message
    assert [x.code for x in receive(off, "a > 1")] == [Code.UNSUPPORTED]
    assert "enablePropertyFilter" in receive(off, "a > 1")[0].message
    # the broker is still serving: a good SQL receive is answered (nothing there yet)
    assert [x.code for x in receive(on, "a > 1")] == [Code.MESSAGE_NOT_FOUND]
