"""The receiver's glue takes a link's datagrams alike whether the kernel coalesces them or not.

A UDP GRO read holds consecutive datagrams of one size (the last may be shorter). The receiver
decodes a large message's fragments in one call, whole datagrams of a read in one loop
(``Receiver._on_singles``) and the rest one by one, and FEC repairs rebuild what was lost. Over
records of one-datagram and several-datagram sizes, FEC settings, lost and tampered datagrams,
the sink must get the same records, and the counters and FEC sources must be the same, as when
every datagram is read alone.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire import Encoder, Key, KeyRing, WireConfig
from common.wire.fec import FecConfig, FecEncoder
from runtime import key_files
from tests.receiver_support import glue_receiver

KEY = Key.from_material(b"r" * 32)
#: The most datagrams the kernel coalesces into one read (a GSO run's bound).
MAX_SEGMENTS = 64


def _reads(datagrams: list[bytes]) -> list[list[bytes]]:
    """The reads a GRO socket makes of these datagrams: runs of one size, the last shorter."""
    reads: list[list[bytes]] = []
    for data in datagrams:
        run = reads[-1] if reads else None
        if (
            run is None
            or len(run) >= MAX_SEGMENTS
            or len(data) > len(run[0])
            or len(run[-1]) < len(run[0])
        ):
            reads.append([data])
        else:
            run.append(data)
    return reads


@st.composite
def links(draw: st.DrawFn) -> list[bytes]:
    """What arrives: a session's datagrams (FEC repairs among them, or not), some lost, some
    with a flipped bit, some late; the first always arrives (the session becomes known)."""
    sizes = st.sampled_from([200, 1000, 1000, 1000, 3000, 9000])
    values = [bytes([n % 251]) * draw(sizes) for n in range(draw(st.integers(2, 40)))]
    encoder = Encoder(WireConfig(), KeyRing([KEY]), session_id=b"q" * 16)
    fec = None
    if draw(st.booleans()):
        fec = FecEncoder(
            FecConfig(
                overhead=draw(st.sampled_from([20.0, 50.0, 100.0])),
                block_size=draw(st.integers(2, 12)),
                interleave=draw(st.integers(1, 3)),
            ),
            KeyRing([KEY]),
            session_id=encoder.session_id,
            max_source_size=WireConfig().max_datagram_size,
        )
    sent: list[bytes] = []
    for offset, value in enumerate(values):
        out = encoder.add("t", 0, offset, 1, 0, b"k", value, (), 0.0)
        if draw(st.booleans()):
            out += encoder.flush()
        for datagram in out:
            sent.append(datagram.data)
            if fec is not None:
                sent += fec.add(datagram.data, 0, 0.0)
    for datagram in encoder.flush():
        sent.append(datagram.data)
        if fec is not None:
            sent += fec.add(datagram.data, 0, 0.0)
    if fec is not None:
        sent += [repair for _, repair in fec.flush()]
    arrived = [sent[0]]
    late: list[tuple[int, bytes]] = []  # (arrives after this many more datagrams, datagram)
    for data in sent[1:]:
        fate = draw(st.sampled_from(["arrives"] * 8 + ["lost", "flipped", "late"]))
        if fate == "arrives":
            arrived.append(data)
        elif fate == "flipped":
            at = draw(st.integers(0, len(data) - 1))
            arrived.append(data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :])
        elif fate == "late":  # reordered: after its block's repairs, it may rebuild others
            late.append((draw(st.integers(1, 30)), data))
        late = [(n - 1, d) for n, d in late]
        arrived += [d for n, d in late if n <= 0]
        late = [(n, d) for n, d in late if n > 0]
    return arrived + [d for _, d in late]


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(links())
def test_coalesced_reads_reach_the_sink_as_datagrams_read_alone(
    tmp_path: Path, arrived: list[bytes]
) -> None:
    key_file = tmp_path / "keys.json"
    if not key_file.exists():
        key_files.write_keyring(KeyRing([KEY]), key_file)
    alone, alone_sink = glue_receiver(key_file)
    reads, reads_sink = glue_receiver(key_file)
    try:
        for data in arrived:
            alone._on_datagram(data)
        for read in _reads(arrived):
            if len(read) > 1:
                reads._on_coalesced(b"".join(read), len(read[0]))
            else:
                reads._on_datagram(read[0])
    finally:
        for r in (alone, reads):
            assert r._loop is not None
            r._loop.close()
    assert reads_sink.records == alone_sink.records
    assert reads.stats.snapshot() == alone.stats.snapshot()
    assert dict(reads.fec.drops) == dict(alone.fec.drops)
    for receiver in (alone, reads):
        receiver.fec._index()
    assert reads.fec._sources.keys() == alone.fec._sources.keys()
