"""Hostile input for the public-key mode: key announcements (kind 3) fuzzed and mutated.

Joins the wire fuzzing of test_wire_properties.py: whatever arrives, the receiver's
PublicKeyDecoder only ever produces drops, never raises, and never learns a key from bytes that
are not exactly a valid announcement. And with any loss of announcements, data flows once one
gets through: every record is delivered or counted as dropped (never silently lost).
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from common.wire import Dropped, DropReason, Encoder, RecordBatch, WireConfig
from common.wire.envelope import HEADER
from tests.pubkey_support import SESSION, T0_MS, announcement, announcer, decoder
from tests.wire_support import drain

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_, VALID = announcement(not_after_ms=T0_MS + 3_600_000)


def _only_drops(data: bytes) -> None:
    dec = decoder()
    dec.receive_datagram(data, 0.0)
    events = drain(dec)
    assert events
    assert all(isinstance(e, Dropped) for e in events), events
    assert len(dec.keyring) == 0
    dec.handle_timer(1e9)
    assert all(isinstance(e, Dropped) for e in drain(dec))


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_any_announcement_body_gives_only_drops(blob: bytes) -> None:
    header = HEADER.pack(b"KDIO", 1, 3, 0, 0, SESSION, 0, 1, 0, 1, len(blob))
    _only_drops(header + blob)
    _only_drops(b"KDIO\x01\x03" + blob)


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        pos = draw(st.integers(0, len(data) - 1)) if data else 0
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@FUZZ
@given(mutated())
def test_fuzz_mutated_announcements_never_teach_a_key(blob: bytes) -> None:
    dec = decoder()
    dec.receive_datagram(blob, 0.0)
    events = drain(dec)
    if blob == VALID:  # a mutation that undid itself
        assert len(dec.keyring) == 1
        return
    assert events
    assert all(isinstance(e, Dropped) for e in events), events
    assert len(dec.keyring) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 6))
# every announcement of the second key lost: the next burst sends the third key's first
@example(lost=[False] * 8 + [True] * 10, records_per_tick=1)
def test_with_lost_announcements_every_record_is_delivered_or_counted(lost, records_per_tick):
    """Announcements lost per the drawn pattern (data never lost): after the first one gets
    through, data flows; records before it are delivered (held) or counted as unknown_key."""
    ann = announcer(session_key_interval=4.0, announce_lead=1.0, announce_interval=0.5)
    dec = decoder(hold_datagrams=8, hold_timeout=2.0)
    enc = Encoder(WireConfig(), ann.keyring, session_id=SESSION)
    t = 0.0
    out = ann.start(t, T0_MS)
    offset = 0
    delivered: list[int] = []
    data_datagrams = 0
    for tick, drop in enumerate([*lost, *[False] * 12]):
        for d in out:
            if not (drop and tick < len(lost)):
                dec.receive_datagram(d.data, t)
        for _ in range(records_per_tick):
            batch = enc.add("t", 0, offset, 1, 1, None, b"x", (), t) + enc.flush()
            offset += 1
            for d in batch:
                data_datagrams += 1
                dec.receive_datagram(d.data, t)
        dec.handle_timer(t)
        delivered += [r.offset for e in drain(dec) if isinstance(e, RecordBatch) for r in e.records]
        t += 0.5
        out = ann.poll(t, T0_MS + int(t * 1000), offset * 10)
    dec.handle_timer(t + 10)
    drain(dec)
    unknown = dec.drops.get(DropReason.UNKNOWN_KEY, 0)
    assert len(delivered) == len(set(delivered))
    assert len(delivered) + unknown == data_datagrams == offset  # one record per datagram
    assert set(range(offset - 12 * records_per_tick, offset)) <= set(delivered)  # flows after
    assert set(dec.drops) <= {DropReason.UNKNOWN_KEY}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.floats(0.01, 3.0), st.integers(0, 5000)), min_size=1, max_size=60),
    st.integers(0, 20_000),
)
def test_the_key_schedule_announces_every_key_before_data_uses_it(steps, byte_limit):
    """Whatever the timing and the byte counts: the ring holds at most two keys, epochs count up
    by one, and every key the encoder can use was announced earlier (or in the same poll)."""
    ann = announcer(
        session_key_interval=2.0, announce_lead=0.5, announce_interval=0.4,
        session_key_bytes=byte_limit,
    )  # fmt: skip
    announced: set[int] = set()
    epochs: list[int] = []
    for d in ann.start(0.0, T0_MS):
        announced.add(int.from_bytes(d.data[32:36], "big"))
    t, sent = 0.0, 0
    for dt, nbytes in steps:
        t += dt
        sent += nbytes
        for d in ann.poll(t, T0_MS + int(t * 1000), sent):
            announced.add(int.from_bytes(d.data[32:36], "big"))
            epochs.append(int.from_bytes(d.data[24:32], "big"))
        assert len(ann.keyring) <= 2
        assert ann.keyring.active.key_id in announced
    if epochs:  # no epoch skipped
        assert sorted(set(epochs)) == list(range(min(epochs), max(epochs) + 1))
    assert ann.keys_made == ann.epoch + 1 + (len(ann.keyring) - 1)
