"""Withheld offsets on the wire (``Encoder.withhold``, docs/protocol.md §5a), over the settings
that could break them: datagram size, compression, linger polls, flushes, heartbeats, large
records that fragment, many partitions, topic rename, interleaved allow/withhold patterns.

1. **Exactly once**: decoded, every offset the sender handled is either one record or inside one
   withheld range, never both, never neither; withheld ranges use the far-side topic names.
2. **Vouching never runs ahead**: when a datagram's ``completes`` says ``(topic, partition, h)``,
   every offset of that partition up to ``h`` that the sender handled is already decoded from
   that datagram and the ones before it (as a record or a withheld range). The sender commits and
   heartbeats ``sent_high`` from ``completes``, so a crash right after any datagram left can
   never lose an offset it committed.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import Decoder, Encoder, RecordBatch, WireConfig, Withheld
from tests.wire_support import SESSION, drain, ring

RENAME = {"a": "far-a"}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[WireConfig, int, list[tuple[str, int, bool, int, int]]]:
    config = WireConfig(
        max_datagram_size=draw(st.sampled_from([300, 600, 1452])),
        max_message_size=1024 * 1024,
        max_record_size=64 * 1024,
        compression=draw(st.sampled_from(["none", "gzip", "zstd"])),
        linger=draw(st.sampled_from([0.0, 0.01, 1.0])),
    )
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, 400))
    withhold_share = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
    rng = random.Random(seed)
    nxt: dict[tuple[str, int], int] = {}
    steps = []
    for _ in range(n):
        tp = (rng.choice("ab"), rng.randrange(3))
        offset = nxt.get(tp, rng.randrange(0, 1000))
        nxt[tp] = offset + rng.choice([1, 1, 1, 2, 50])
        size = rng.choice([0, 10, 100, 100, 2000])
        # action: 0 nothing, 1 poll past linger, 2 flush, 3 heartbeat
        steps.append(
            (tp[0], tp[1], rng.random() < withhold_share, size, rng.choice([0] * 12 + [1, 2, 3]))
        )
    return config, seed, [(t, p, w, s, a) for (t, p, w, s, a) in steps]


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_withheld_offsets_are_delivered_exactly_once_and_never_vouched_early(
    scenario: tuple[WireConfig, int, list[tuple[str, int, bool, int, int]]],
) -> None:
    config, seed, steps = scenario
    rng = random.Random(seed)
    keys = ring()
    encoder = Encoder(config, keys, session_id=SESSION, topic_map=RENAME)
    decoder = Decoder(config, keys)
    nxt: dict[tuple[str, int], int] = {}
    handled: dict[tuple[str, int], dict[int, bool]] = {}  # offset -> withheld?
    out = []
    now = 0.0
    for topic, partition, withheld, size, action in steps:
        tp = (topic, partition)
        offset = nxt.get(tp, rng.randrange(0, 1000))
        nxt[tp] = offset + rng.choice([1, 1, 1, 2, 50])
        handled.setdefault(tp, {})[offset] = withheld
        now += 0.001
        if withheld:
            out += encoder.withhold(topic, partition, offset, now)
        else:
            value = bytes(rng.getrandbits(8) for _ in range(size))
            out += encoder.add(topic, partition, offset, 0, 0, b"k", value, (), now)
        if action == 1:
            now += 2.0
            out += encoder.poll(now)
        elif action == 2:
            out += encoder.flush()
        elif action == 3:
            high = [(t, p, max(o)) for (t, p), o in handled.items()]
            low = [(t, p, min(o)) for (t, p), o in handled.items()]
            out += encoder.heartbeat(
                sender_id="s",
                started_at_ms=0,
                sent_at_ms=0,
                high_offsets=high,
                low_offsets=low,
                counters=(),
            )
    out += encoder.flush()
    assert encoder.pending_withheld == 0

    far_to_source = {far: source for source, far in RENAME.items()}
    seen: dict[tuple[str, int], dict[int, bool]] = {}
    for datagram in out:
        decoder.receive_datagram(datagram.data, now)
        for event in drain(decoder):
            if isinstance(event, RecordBatch):
                for r in event.records:
                    tp = (far_to_source.get(r.topic, r.topic), r.partition)
                    assert r.offset not in seen.setdefault(tp, {}), "delivered twice"
                    seen[tp][r.offset] = False
            elif isinstance(event, Withheld):
                for t, p, first, last in event.ranges:
                    assert t not in RENAME, "withheld ranges carry the far-side name"
                    tp = (far_to_source.get(t, t), p)
                    for o in range(first, last + 1):
                        assert o not in seen.setdefault(tp, {}), "withheld twice"
                        seen[tp][o] = True
        for topic, partition, high in datagram.completes:
            tp = (topic, partition)
            due = {o: w for o, w in handled[tp].items() if o <= high}
            got = {o: w for o, w in seen.get(tp, {}).items() if o <= high}
            assert got == due, f"{tp} vouched to {high} before all of it was on the wire"
    assert seen == handled
