"""Input limits through the Store API (sparkmq/log/limits.py): every limit of the
RocketMQ 5 proxy refuses a bad message with its status (Store.append with Message
objects, and Store.append_batch with Arrow columns), a message at the limit is stored,
the limits are configurable with the proxy's names, names are matched whole, and an
out-of-range query time is refused. Fast tier: real files, no servers."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq import Message, Store
from sparkmq.errors import InvalidNameError, MessageLimitError
from sparkmq.log import format as fmt
from sparkmq.log import limits

KIB, MIB = 1 << 10, 1 << 20
TOO_FAR_MS = 2**62 * 1000            # 2^62 s: past int64 ms (Message objects only)

# (id, Message fields, the proxy's status)
BAD = [
    ("129 properties", dict(properties={f"k{i}": "v" for i in range(129)}),
     "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("properties over 16 KiB", dict(properties={"p": "v" * (16 * KIB)}),
     "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("a 1 MiB property", dict(properties={"big": "v" * MIB}), "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("a 17 KiB tag", dict(tags="t" * (17 * KIB)), "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("5000 keys", dict(keys=[f"k{i:04d}" for i in range(5000)]),
     "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("a reserved-looking property with a newline", dict(properties={"a\n": "b"}),
     "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("a property value with a control character", dict(properties={"a": "b\x00"}),
     "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("a tag with '|'", dict(tags="a|b"), "ILLEGAL_MESSAGE_TAG"),
    ("a blank tag", dict(tags="  "), "ILLEGAL_MESSAGE_TAG"),
    ("a tag with a newline", dict(tags="TagA\n"), "ILLEGAL_MESSAGE_TAG"),
    ("a blank key", dict(keys=["ok", " "]), "ILLEGAL_MESSAGE_KEY"),
    ("a key with a control character", dict(keys=["k\x07"]), "ILLEGAL_MESSAGE_KEY"),
    ("a 64-byte message group", dict(message_group="g" * 64), "ILLEGAL_MESSAGE_GROUP"),
    ("a 4 MiB message group", dict(message_group="g" * (4 * MIB)), "ILLEGAL_MESSAGE_GROUP"),
    ("a message group with a newline", dict(message_group="GNL\n"), "ILLEGAL_MESSAGE_GROUP"),
    ("a 129-byte message id", dict(unique_key="i" * 129), "ILLEGAL_MESSAGE_ID"),
    ("a 1 MiB message id", dict(unique_key="i" * MIB), "ILLEGAL_MESSAGE_ID"),
    ("born 2^62 s", dict(born_timestamp=TOO_FAR_MS), "BAD_REQUEST"),
    ("born before 1970", dict(born_timestamp=-1), "BAD_REQUEST"),
    ("delivered at 2^62 s", dict(delivery_timestamp=TOO_FAR_MS), "ILLEGAL_DELIVERY_TIME"),
    ("message type 99", dict(message_type=99), "BAD_REQUEST"),
    ("message type -5", dict(message_type=-5), "BAD_REQUEST"),
    ("whole message over maxMessageSize", dict(body=b"x" * (4 * MIB - 10),
                                               properties={"p": "v" * 100}),
     "MESSAGE_BODY_TOO_LARGE"),
]

# messages exactly at a limit: stored
AT_LIMIT = [
    ("128 properties", dict(properties={f"k{i:03d}": "v" for i in range(128)})),
    ("properties of exactly 16 KiB", dict(properties={"p": "v" * (16 * KIB - 1)})),
    ("a 63-byte message group", dict(message_group="g" * 63)),
    ("a 128-byte message id", dict(unique_key="i" * 128)),
    ("a whole message of exactly maxMessageSize", dict(body=b"x" * (4 * MIB - 1))),  # + "T"
    ("unicode tag, keys and properties", dict(tags="标签", keys=["ключ"], properties={"é": "ü"})),
    ("born at 9999-12-31", dict(born_timestamp=253_402_300_799_999)),
    # the proxy's SendMessageActivity has no blank check for properties (only the broker's
    # Message.putUserProperty, which it does not call, has one)
    ("empty and blank property keys and values", dict(properties={"": "", " ": "v", "k": " "})),
]


@pytest.fixture
def store(tmp_path):
    s = Store.open(str(tmp_path / "s"), start_services=False)
    s.create_topic("T")
    yield s
    s.close()


def _message(**fields) -> Message:
    fields.setdefault("body", b"body")
    return Message(topic="T", **fields)


def _count(store) -> int:
    return sum(store.max_offset("T", q) for q in range(store.topics()["T"]["writeQueueNums"]))


@pytest.mark.parametrize("fields,status", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_store_append_refuses_a_message_past_a_limit(store, fields, status):
    with pytest.raises(MessageLimitError) as info:
        store.append(_message(**fields))
    assert info.value.status == status
    assert info.value.code == "SPARKMQ_MESSAGE_LIMIT" and info.value.message
    assert _count(store) == 0


def _table(fields: dict) -> pa.Table:
    """One row of ``fields`` as Arrow columns in the segment schema's types."""
    cols = {"topic": pa.array(["T"]), "body": pa.array([fields.get("body", b"body")])}
    for name, value in fields.items():
        if name == "body":
            continue
        col = "tags" if name == "tags" else name
        if name in ("born_timestamp", "delivery_timestamp") and value == TOO_FAR_MS:
            value = 2**62                       # the farthest an int64 of ms holds
        typ = fmt.SEGMENT_SCHEMA.field(col).type
        if name == "properties":
            value = list(value.items())
        cols[col] = pa.array([value], typ)
    return pa.table(cols)


@pytest.mark.parametrize("fields,status", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_store_append_batch_refuses_a_row_past_a_limit(store, fields, status):
    with pytest.raises(MessageLimitError) as info:
        store.append_batch(_table(fields))
    assert info.value.status == status and "row 0" in info.value.message
    assert _count(store) == 0


@pytest.mark.parametrize("fields,status", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_the_no_cast_segment_batch_path_refuses_the_row_among_good_ones(store, fields, status):
    from sparkmq.log.batch import build_segment_batch
    good = _table({}).to_batches()[0]
    bad = _table(fields)
    table = pa.concat_tables([pa.table(good), bad], promote_options="permissive")
    cols = {name: table.column(name).combine_chunks() for name in table.column_names}
    batch = build_segment_batch(cols, 2, store_host="h", now_ms=1_700_000_000_000)
    with pytest.raises(MessageLimitError) as info:
        store.append_batch(batch)
    assert info.value.status == status and "row 1" in info.value.message


@pytest.mark.parametrize("fields", [c[1] for c in AT_LIMIT], ids=[c[0] for c in AT_LIMIT])
def test_a_message_at_a_limit_is_stored_both_ways(store, fields):
    store.append(_message(**fields))
    store.append_batch(_table(fields))
    assert _count(store) == 2


def test_limits_are_configurable_with_the_proxys_names(tmp_path):
    s = Store.open(str(tmp_path / "c"), start_services=False, userPropertyMaxNum=2,
                   maxUserPropertySize=10, maxMessageGroupSize=4, maxMessageIdSize=3,
                   maxMessageSize=100)
    try:
        s.create_topic("T")
        for fields, status in [(dict(properties={"a": "1", "b": "2", "c": "3"}),
                                "MESSAGE_PROPERTIES_TOO_LARGE"),
                               (dict(tags="elevenchars"), "MESSAGE_PROPERTIES_TOO_LARGE"),
                               (dict(message_group="four"), "ILLEGAL_MESSAGE_GROUP"),
                               (dict(unique_key="four"), "ILLEGAL_MESSAGE_ID"),
                               (dict(body=b"x" * 99, tags="ab"), "MESSAGE_BODY_TOO_LARGE")]:
            with pytest.raises(MessageLimitError) as info:
                s.append(_message(**fields))
            assert info.value.status == status, fields
        s.append(_message(properties={"a": "1"}, message_group="abc", unique_key="abc"))
    finally:
        s.close()


@pytest.mark.parametrize("name", ["Known\n", "a\nb", "\nKnown", "Known\r"])
def test_topic_and_group_names_are_matched_whole(store, name):
    with pytest.raises(InvalidNameError):
        store.create_topic(name)
    with pytest.raises(InvalidNameError):
        store.commit_consumer_offsets(name, {("T", 0): 0})
    assert name not in store.topics()


def test_an_offset_query_outside_1970_to_9999_is_refused(store):
    store.append(_message())
    with pytest.raises(MessageLimitError) as info:
        store.offset_for_time("T", 0, TOO_FAR_MS)
    assert info.value.status == "BAD_REQUEST"
    assert store.offset_for_time("T", 0, 0) == 0


def test_the_broker_may_store_again_what_it_accepted_with_properties_of_its_own(store):
    """A DLQ or schedule re-append adds properties to a message that was at a limit:
    ``limits_checked=True`` (the broker's own re-appends) stores it; a user's append
    of the same message is refused."""
    at_limit = {f"k{i:03d}": "v" for i in range(128)}
    again = _message(properties={**at_limit, "ORIGIN_TOPIC": "T"})
    with pytest.raises(MessageLimitError):
        store.append(again)
    store.append(again, limits_checked=True)
    store.append_batch(_table({"properties": again.properties}), limits_checked=True)
    assert _count(store) == 2


def test_file_names_and_tokens_are_matched_whole():
    """The log's file-name patterns use fullmatch too: a trailing newline is no commit,
    checkpoint or segment, and no file-name token (job / writer ids)."""
    assert fmt.parse_commit_file("00000000000000000001.json") == 1
    assert fmt.parse_commit_file("00000000000000000001.json\n") is None
    assert fmt.parse_checkpoint_file("00000000000000000001.checkpoint.json\n") is None
    assert fmt.parse_segment_file("00000000000000000000.arrow\n") is None
    with pytest.raises(ValueError):
        fmt.staged_segment_file("job\n", "task")


_TEXT = st.text(alphabet=st.sampled_from(list("ab |\t\n\x85\u3000é ")), max_size=6) \
    | st.just("UNIQ_KEY")


@settings(max_examples=300, deadline=None)
@given(tag=st.none() | _TEXT, keys=st.lists(_TEXT, max_size=3),
       props=st.dictionaries(_TEXT, _TEXT, max_size=4), group=st.none() | _TEXT,
       message_id=st.none() | _TEXT, body_bytes=st.integers(0, 80),
       born=st.none() | st.integers(-5, 10) | st.just(limits.MAX_TIMESTAMP_MS + 1),
       mtype=st.integers(-1, 4))
def test_the_fast_path_never_passes_a_message_the_rules_refuse(tag, keys, props, group,
                                                               message_id, body_bytes, born,
                                                               mtype):
    """message_violation's C-level fast path (_surely_within) says "fine" only when
    every rule, applied one by one, finds nothing (small limits, so they are hit)."""
    small = limits.MessageLimits(max_message_size_bytes=100, max_user_property_size_bytes=12,
                                 user_property_max_num=3, max_message_group_size_bytes=4,
                                 max_message_id_size_bytes=4)
    args = (small, "T", body_bytes, tag, keys, props, group, message_id, None, None, born, None,
            mtype, limits.RESERVED_PROPERTY_KEYS)
    if limits._surely_within(*args):
        refused = (limits._property_violation(small, props, tag, keys,
                                              limits.RESERVED_PROPERTY_KEYS)
                   or limits._text_violation("ILLEGAL_MESSAGE_TAG", "tag", tag, extra="|")
                   or limits._keys_violation(keys) or limits._group_violation(small, group)
                   or limits._id_violation(small, message_id)
                   or limits._time_violation(born, None) or limits._type_violation(mtype))
        assert refused is None
        assert limits.message_size_bytes("T", body_bytes, tag, keys, props, group,
                                         message_id) <= small.max_message_size_bytes


def _verdict(batch: pa.RecordBatch, small: limits.MessageLimits) -> str | None:
    try:
        limits.check_batch(batch, small)
    except MessageLimitError as e:
        return e.status
    return None


@settings(max_examples=200, deadline=None)
@given(tag=st.none() | _TEXT, keys=st.none() | st.lists(_TEXT, max_size=3),
       props=st.none() | st.dictionaries(_TEXT, _TEXT, max_size=4), group=st.none() | _TEXT,
       message_id=st.none() | _TEXT, body=st.binary(max_size=80),
       born=st.none() | st.integers(-5, 10) | st.just(limits.MAX_TIMESTAMP_MS + 1),
       mtype=st.none() | st.integers(-1, 4))
def test_a_row_alone_and_the_same_row_among_others_get_the_same_verdict(
        tag, keys, props, group, message_id, body, born, mtype):
    """A row alone and the same row among others get the same verdict from check_batch,
    nulls included (without sparkmq._screen: the rule alone, and the numpy screen first;
    tests/log/test_screen.py holds the C screen to both)."""
    from sparkmq.log.batch import build_segment_batch
    small = limits.MessageLimits(max_message_size_bytes=100, max_user_property_size_bytes=12,
                                 user_property_max_num=3, max_message_group_size_bytes=4,
                                 max_message_id_size_bytes=4)
    row = {"topic": ["T"], "body": [body], "tags": [tag], "keys": [keys],
           "properties": [None if props is None else list(props.items())],
           "message_group": [group], "unique_key": [message_id]}
    cols = {k: pa.array(v, fmt.SEGMENT_SCHEMA.field(k).type) for k, v in row.items()}
    cols["born_timestamp"] = pa.array([born], pa.int64()).cast(fmt.TS)
    cols["message_type"] = pa.array([mtype], pa.int8())
    alone = build_segment_batch(cols, 1, store_host="h", now_ms=1_700_000_000_000)
    plain = build_segment_batch({"topic": ["T"], "body": [b"ok"]}, 1, store_host="h",
                                now_ms=1_700_000_000_000)
    others = [plain] * limits.SCREEN_MIN_ROWS             # (enough rows to be screened)
    among = pa.Table.from_batches([*others, alone, plain]).combine_chunks().to_batches()[0]
    assert among.num_rows == limits.SCREEN_MIN_ROWS + 2
    assert _verdict(alone, small) == _verdict(among, small)


@pytest.mark.parametrize("column, value, words", [
    ("keys", ["k", None], "ILLEGAL_MESSAGE_KEY: row {r}: key 1 is null"),
    ("properties", [("k", None)], "ILLEGAL_MESSAGE_PROPERTY_KEY: row {r}: property 'k' has no"),
])
@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("c_screen", [True, False], ids=["c", "numpy"])
def test_a_null_key_or_property_value_is_refused_and_nothing_is_stored(
        store, monkeypatch, column, value, words, n, c_screen):
    """(Before: a one-row batch raised TypeError in the rule; a longer one was stored.)"""
    if not c_screen:
        monkeypatch.setattr(limits, "_c_screen", None)
    r = n - 1
    values = [None] * n
    values[r] = value
    batch = pa.RecordBatch.from_pydict({
        "topic": ["T"] * n, "body": [b"x"] * n,
        column: pa.array(values, fmt.SEGMENT_SCHEMA.field(column).type)})
    with pytest.raises(MessageLimitError, match=words.format(r=r)):
        store.append_batch(batch)
    assert _count(store) == 0
