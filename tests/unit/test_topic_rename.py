"""Topic rename (sender ``rename``): applied on the wire, everything else in source names."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import settings
from common.errors import ConfigError
from common.wire import Decoder, Encoder, Heartbeat, Key, KeyRing, Record, RecordBatch, WireConfig
from common.wire.events import ResendMarker
from sender.config import SenderConfig
from tests.wire_support import SESSION, encode_all, feed

BASE = {
    "bootstrap_servers": "127.0.0.1:9092",
    "target": "127.0.0.1:9000",
    "topics": ["orders", "audit"],
    "insecure_cleartext": True,
}


def _config(**overrides: object) -> SenderConfig:
    return settings.build(SenderConfig, file_values={**BASE, **overrides})


def test_rename_entries_become_the_topic_map() -> None:
    cfg = _config(rename=["orders=site1.orders", "audit = site1.audit", "same=same"])
    assert cfg.topic_map() == {"orders": "site1.orders", "audit": "site1.audit"}
    env = {"DIODE_SENDER_RENAME": "orders=o2,audit=a2"}
    from_env = settings.build(SenderConfig, file_values=BASE, env=env, env_prefix="DIODE_SENDER_")
    assert from_env.topic_map() == {"orders": "o2", "audit": "a2"}


@pytest.mark.parametrize(
    ("rename", "says"),
    [
        (["orders"], "is not SOURCE=FAR"),
        (["orders=bad name"], "is not a Kafka topic name"),
        (["orders=.."], "is not a Kafka topic name"),
        (["orders=a", "orders=b"], "twice"),
        (["orders=x", "audit=x"], "renames two topics to 'x'"),
        (["orders=audit"], "is also read under its own name"),
    ],
)
def test_a_bad_rename_stops_start_up_naming_the_key(rename: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(rename=rename)
    assert info.value.key == "rename"
    assert says in str(info.value)


def test_swapping_two_names_is_allowed() -> None:
    assert _config(rename=["orders=audit", "audit=orders"]).topic_map() == {
        "orders": "audit",
        "audit": "orders",
    }


_TOPICS = st.sampled_from(["orders", "audit", "metrics", "a.b-c_d"])


@given(
    st.lists(st.tuples(_TOPICS, st.integers(0, 3), st.binary(max_size=300)), max_size=60),
    st.dictionaries(_TOPICS, st.sampled_from(["far.1", "far.2", "far.3", "far.4"]), max_size=4),
)
def test_the_wire_carries_far_names_and_nothing_else_changes(
    items: list[tuple[str, int, bytes]], mapping: dict[str, str]
) -> None:
    mapping = {src: far for src, far in mapping.items() if list(mapping.values()).count(far) == 1}
    key = Key.generate()
    config = WireConfig(max_datagram_size=1472)
    records = [
        Record(topic, partition, offset, 1_700_000_000_000 + offset, 1, b"k", value, ())
        for offset, (topic, partition, value) in enumerate(items)
    ]
    plain = Encoder(config, KeyRing([key]), session_id=SESSION)
    renamed = Encoder(config, KeyRing([key]), session_id=SESSION, topic_map=mapping)
    sent_plain = encode_all(plain, records)
    sent_renamed = encode_all(renamed, records)
    # the sender's bookkeeping (completes -> commits, heartbeats) stays in source names
    assert [d.completes for d in sent_renamed] == [d.completes for d in sent_plain]
    got = [
        r
        for e in feed(Decoder(config, KeyRing([key])), sent_renamed)
        if isinstance(e, RecordBatch)
        for r in e.records
    ]
    expected = [dataclasses.replace(r, topic=mapping.get(r.topic, r.topic)) for r in records]
    assert sorted(got, key=lambda r: r.offset) == sorted(expected, key=lambda r: r.offset)


def test_heartbeats_and_resend_markers_carry_far_names() -> None:
    key = Key.generate()
    enc = Encoder(WireConfig(), KeyRing([key]), session_id=SESSION, topic_map={"orders": "far"})
    out = enc.heartbeat(
        sender_id="s", started_at_ms=1, sent_at_ms=2,
        high_offsets=[("orders", 0, 9), ("audit", 1, 4)],
        low_offsets=[("orders", 0, 0), ("audit", 1, 0)], counters=(),
    )  # fmt: skip
    out += enc.resend_marker(
        bundle_id="b", phase="start", ranges=[("orders", 0, 3, 5)], records_sent=0, sent_at_ms=3
    )
    events = feed(Decoder(WireConfig(), KeyRing([key])), out)
    (beat,) = [e for e in events if isinstance(e, Heartbeat)]
    assert beat.high_offsets == (("far", 0, 9), ("audit", 1, 4))
    assert beat.low_offsets == (("far", 0, 0), ("audit", 1, 0))
    (marker,) = [e for e in events if isinstance(e, ResendMarker)]
    assert marker.ranges == (("far", 0, 3, 5),)
