"""Public-key mode: key files, sealed and signed announcements, the receiver's key learning."""

from __future__ import annotations

import io
import os
import stat

import pytest
from fastavro import schemaless_reader

from common.errors import ConfigError, KeyRingError, RemoteProtocolError
from common.wire import Dropped, DropReason, Encoder, Heartbeat, RecordBatch, WireConfig
from common.wire.announce import (
    ANNOUNCEMENT_SCHEMA,
    SIGNATURE_SIZE,
    AnnounceConfig,
    parse_announcement,
)
from common.wire.envelope import HEADER_SIZE
from common.wire.keyring import Key
from common.wire.pubkey import (
    RECEIVER,
    SIGNING,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    format_fingerprint,
    public_keys_document,
    receiver_keys_document,
    signing_key_document,
)
from common.wire.pubkey_decoder import KeyLearned, KeyRetired, PublicKeyReceiveConfig
from runtime.key_files import (
    load_receiver_keys,
    load_receiver_public,
    load_signing_key,
    load_trusted,
    write_key_file,
)
from tests.pubkey_support import (
    OTHER_PAIR,
    RECEIVER_PAIR,
    SENDER,
    SESSION,
    STRANGER,
    T0_MS,
    announcement,
    announcer,
    decoder,
    public,
    verifier,
)
from tests.wire_support import drain


def _refusal(data: bytes, wall_ms: int = T0_MS, v=None) -> DropReason:
    with pytest.raises(RemoteProtocolError) as exc:
        (v or verifier()).verify(data, wall_ms)
    return exc.value.reason


def _batch(enc: Encoder, offset: int, now: float = 0.0) -> bytes:
    out = enc.add("t", 0, offset, 1, 1, b"k", b"v%d" % offset, (), now) + enc.flush()
    assert len(out) == 1
    return out[0].data


# -- key files ------------------------------------------------------------------------------------


def test_fingerprints_read_well_aloud_and_differ_by_key_type() -> None:
    text = format_fingerprint(RECEIVER_PAIR.fingerprint)
    groups = text.split("-")
    assert len(text) == 32
    assert [len(g) for g in groups] == [4, 4, 4, 4, 4, 4, 2]
    assert text.replace("-", "").isalnum()
    assert text.upper() == text
    assert SENDER.fingerprint != RECEIVER_PAIR.fingerprint


def test_key_files_round_trip_with_private_files_0600(tmp_path) -> None:
    priv, pub = tmp_path / "receiver.key", tmp_path / "receiver.pub"
    second = ReceiverKeyPair.generate()
    write_key_file(
        priv, receiver_keys_document(ReceiverKeys([RECEIVER_PAIR, second])), private=True
    )
    write_key_file(pub, public_keys_document(RECEIVER, [public(second)]), private=False)
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pub).st_mode) == 0o644
    keys = load_receiver_keys(priv)
    assert {p.fingerprint for p in keys} == {RECEIVER_PAIR.fingerprint, second.fingerprint}
    assert load_receiver_public(pub).public == second.public
    sk_path, trust = tmp_path / "sender.key", tmp_path / "trusted.pub"
    write_key_file(sk_path, signing_key_document(SENDER), private=True)
    write_key_file(trust, public_keys_document(SIGNING, [SENDER.public_entry()]), private=False)
    loaded = load_signing_key(sk_path)
    assert loaded.public == SENDER.public
    assert loaded.name == "high-1"
    assert [k.fingerprint for k in load_trusted(trust)] == [SENDER.fingerprint]
    with pytest.raises(KeyRingError, match="exists"):
        write_key_file(sk_path, signing_key_document(SENDER), private=True)
    assert "private" not in repr(loaded)
    assert loaded.private.__class__.__name__ not in repr(loaded)


def test_key_files_refuse_damage_and_the_wrong_kind(tmp_path) -> None:
    pub = tmp_path / "receiver.pub"
    doc = public_keys_document(RECEIVER, [public(RECEIVER_PAIR)])
    write_key_file(pub, doc, private=False)
    with pytest.raises(KeyRingError, match="needs ed25519-signing"):
        load_trusted(pub)  # a receiver key is not a trusted sender
    doc["keys"][0]["public"] = OTHER_PAIR.public.hex()  # swapped in transit
    write_key_file(pub, doc, private=False, overwrite=True)
    with pytest.raises(KeyRingError, match="fingerprint"):
        load_receiver_public(pub)
    (tmp_path / "junk").write_bytes(b"\xff" * 10)
    with pytest.raises(KeyRingError, match="not JSON"):
        load_signing_key(tmp_path / "junk")
    with pytest.raises(KeyRingError, match="cannot read"):
        load_trusted(tmp_path / "missing")


# -- announcements --------------------------------------------------------------------------------


def test_announcement_is_one_small_datagram_and_valid_avro() -> None:
    key, data = announcement()
    assert len(data) <= 256  # fits the smallest max_datagram_size
    parsed = parse_announcement(data)
    assert (parsed.session_id, parsed.epoch, parsed.key_id) == (SESSION, 0, key.key_id)
    payload = data[HEADER_SIZE + 2 :]
    datum = schemaless_reader(io.BytesIO(payload), ANNOUNCEMENT_SCHEMA, None)
    assert datum["sender_fingerprint"] == SENDER.fingerprint
    assert datum["receiver_fingerprint"] == RECEIVER_PAIR.fingerprint
    assert datum["signature"] == data[-SIGNATURE_SIZE:]
    assert datum["not_after_ms"] == T0_MS + 60_000


def test_a_valid_announcement_yields_its_key() -> None:
    key, data = announcement()
    learned = verifier().verify(data, T0_MS + 1)
    assert learned.key.material == key.material
    assert learned.signer_name == "high-1"


def test_each_refusal_has_its_own_reason() -> None:
    assert _refusal(announcement(signer=STRANGER)[1]) is DropReason.UNTRUSTED_SIGNER
    assert _refusal(announcement(pair=OTHER_PAIR)[1]) is DropReason.OTHER_RECEIVER
    expired = announcement(not_before_ms=T0_MS - 10_000_000, not_after_ms=T0_MS - 9_000_000)[1]
    assert _refusal(expired) is DropReason.ANNOUNCE_EXPIRED
    future = announcement(not_before_ms=T0_MS + 10_000_000, not_after_ms=T0_MS + 20_000_000)[1]
    assert _refusal(future) is DropReason.ANNOUNCE_EXPIRED
    assert _refusal(announcement(sealed=os.urandom(80))[1]) is DropReason.BAD_SEAL
    # a key sealed for one announcement does not open in another (HPKE info binds it)
    key, first = announcement(epoch=0)
    lifted = parse_announcement(first).sealed
    assert _refusal(announcement(key=key, epoch=1, sealed=lifted)[1]) is DropReason.BAD_SEAL
    tampered = bytearray(first)
    tampered[-1] ^= 1
    assert _refusal(bytes(tampered)) is DropReason.BAD_SIGNATURE


def test_rollback_within_a_session_is_refused() -> None:
    v = verifier()
    _, old = announcement(epoch=3)
    _, new = announcement(epoch=4)
    v.verify(old, T0_MS)
    learned = v.verify(new, T0_MS)
    assert learned.superseded == (parse_announcement(old).key_id,)
    assert _refusal(old, v=v) is DropReason.ANNOUNCE_ROLLBACK
    # the same epoch with another key (equivocation) is refused too
    assert _refusal(announcement(epoch=4)[1], v=v) is DropReason.ANNOUNCE_ROLLBACK
    # other sessions are independent
    v.verify(announcement(epoch=0, session=bytes(16))[1], T0_MS)


def test_every_single_bit_flip_of_a_valid_announcement_is_refused() -> None:
    _, data = announcement()
    v = verifier()
    reasons: set[DropReason] = set()
    for i in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        if i // 8 == 5:  # the kind byte: the decoder sends it down the shared-key path
            dec = decoder()
            dec.receive_datagram(bytes(flipped), 0.0)
            events = drain(dec)
            assert events, i
            assert all(isinstance(e, Dropped) for e in events), i
            reasons.update(e.reason for e in events)
            continue
        reasons.add(_refusal(bytes(flipped), v=v))
    assert DropReason.BAD_SIGNATURE in reasons
    assert DropReason.UNTRUSTED_SIGNER in reasons  # a flipped signer fingerprint
    assert DropReason.BAD_MAGIC in reasons
    v.verify(data, T0_MS)  # the original still verifies: nothing above changed the state


# -- the receiver's decoder -----------------------------------------------------------------------


def test_data_before_its_announcement_is_held_then_delivered() -> None:
    ann = announcer()
    first = ann.start(0.0, T0_MS)
    enc = Encoder(WireConfig(), ann.keyring, session_id=SESSION)
    dec = decoder()
    dec.receive_datagram(_batch(enc, 1), 0.1)
    assert drain(dec) == []
    assert dec.held == 1
    assert not dec.drops
    dec.receive_datagram(first[0].data, 0.2)
    events = drain(dec)
    assert [type(e) for e in events] == [KeyLearned, RecordBatch]
    assert events[0].released == 1
    assert events[1].records[0].offset == 1
    assert dec.datagrams == 2
    dec.receive_datagram(first[0].data, 0.3)  # a repeat: no cryptography, no event
    assert drain(dec) == []
    assert dec.announcements_repeated == 1


def test_held_datagrams_are_bounded_and_time_out_as_unknown_key() -> None:
    ann = announcer()
    ann.start(0.0, T0_MS)
    enc = Encoder(WireConfig(), ann.keyring, session_id=SESSION)
    dec = decoder(hold_datagrams=3, hold_timeout=2.0)
    for i in range(5):
        dec.receive_datagram(_batch(enc, i), 0.0)
    assert dec.held == 3
    assert dec.drops[DropReason.UNKNOWN_KEY] == 2
    assert dec.next_deadline() == pytest.approx(2.0)
    dec.handle_timer(2.0)
    assert dec.held == 0
    assert dec.drops[DropReason.UNKNOWN_KEY] == 5
    assert dec.datagrams == 5
    no_hold = decoder(hold_datagrams=0)
    no_hold.receive_datagram(_batch(enc, 9), 0.0)
    assert no_hold.drops[DropReason.UNKNOWN_KEY] == 1


def test_rotation_retires_old_keys_and_replays_of_them_are_refused() -> None:
    ann = announcer(session_key_interval=10.0, announce_lead=1.0)
    dec = decoder(retire_grace=3.0)
    enc = Encoder(WireConfig(), ann.keyring, session_id=SESSION)
    sent = []
    delivered: list[int] = []
    retired = []
    seen_announcements = []
    t = 0.0
    out = ann.start(t, T0_MS)
    offset = 0
    while ann.epoch < 5:
        for d in out:
            seen_announcements.append(d.data)
            dec.receive_datagram(d.data, t)
        dec.receive_datagram(_batch(enc, offset, t), t)
        sent.append(offset)
        offset += 1
        dec.handle_timer(t)
        for e in drain(dec):
            if isinstance(e, RecordBatch):
                delivered += [r.offset for r in e.records]
            elif isinstance(e, KeyRetired):
                retired.append(e)
            else:
                assert not isinstance(e, Dropped), e
        t += 0.5
        out = ann.poll(t, T0_MS + int(t * 1000), offset * 100)
    assert delivered == sent
    assert ann.keys_made == 6
    assert len(ann.keyring) == 1
    assert {r.why for r in retired} == {"superseded"}
    assert len(retired) >= 4
    assert len(dec.keyring) <= 2
    dec.receive_datagram(seen_announcements[0], t)  # epoch 0, retired long ago
    assert [e.reason for e in drain(dec)] == [DropReason.ANNOUNCE_ROLLBACK]


def test_keys_expire_at_the_end_of_their_validity() -> None:
    dec = decoder(max_clock_skew=0.0)
    key, data = announcement(not_after_ms=T0_MS + 5_000)
    dec.receive_datagram(data, 1.0)
    assert key.key_id in dec.keyring
    assert dec.next_deadline() == pytest.approx(5.0)
    dec.handle_timer(5.0)
    events = drain(dec)
    assert any(isinstance(e, KeyRetired) and e.why == "expired" for e in events)
    assert key.key_id not in dec.keyring
    dec.receive_datagram(data, 5.5)  # no longer a cheap repeat: checked again, and expired
    assert [e.reason for e in drain(dec) if isinstance(e, Dropped)] == [DropReason.ANNOUNCE_EXPIRED]


def test_refused_announcements_are_counted_by_reason_in_the_decoder() -> None:
    dec = decoder()
    for data in (
        announcement(signer=STRANGER)[1],
        announcement(pair=OTHER_PAIR)[1],
        announcement(not_before_ms=1, not_after_ms=2)[1],
        b"KDIO\x01\x03" + bytes(50),
    ):
        dec.receive_datagram(data, 0.0)
    assert dict(dec.drops) == {
        DropReason.UNTRUSTED_SIGNER: 1,
        DropReason.OTHER_RECEIVER: 1,
        DropReason.ANNOUNCE_EXPIRED: 1,
        DropReason.MALFORMED: 1,
    }
    assert len(dec.keyring) == 0


def test_heartbeats_under_the_session_key_flow_too() -> None:
    ann = announcer()
    first = ann.start(0.0, T0_MS)
    enc = Encoder(WireConfig(), ann.keyring, session_id=SESSION)
    dec = decoder()
    dec.receive_datagram(first[0].data, 0.0)
    hb = enc.heartbeat(
        sender_id="s",
        started_at_ms=1,
        sent_at_ms=2,
        high_offsets=[("t", 0, 5)],
        low_offsets=[("t", 0, 0)],
        counters=[],
    )
    dec.receive_datagram(hb[0].data, 0.0)
    assert any(isinstance(e, Heartbeat) for e in drain(dec))


def test_configs_name_the_bad_key() -> None:
    with pytest.raises(ConfigError, match="announce_lead"):
        AnnounceConfig(session_key_interval=5, announce_lead=5)
    with pytest.raises(ConfigError, match="announce_interval"):
        AnnounceConfig(announce_interval=0)
    with pytest.raises(ConfigError, match="session_key_bytes"):
        AnnounceConfig(session_key_bytes=-1)
    with pytest.raises(ConfigError, match="hold_datagrams"):
        PublicKeyReceiveConfig(hold_datagrams=-1)
    assert AnnounceConfig().validity == 2 * 3600 + 2


def test_bytes_trigger_a_new_session_key() -> None:
    ann = announcer(session_key_bytes=1000)
    ann.start(0.0, T0_MS)
    assert ann.poll(0.1, T0_MS, 999) == []
    out = ann.poll(0.2, T0_MS, 1000)
    assert [parse_announcement(d.data).epoch for d in out] == [1]
    ann.poll(1.3, T0_MS, 1500)  # lead over: the new key is active, the old one gone
    assert ann.epoch == 1
    assert len(ann.keyring) == 1
    assert Key.generate().key_id not in ann.keyring


def test_signing_key_repr_hides_the_private_key() -> None:
    key = SigningKey.generate(name="x")
    assert "private" not in repr(key)


def test_the_key_before_the_newest_may_arrive_late_once() -> None:
    """Its announcements were lost while the sender still used it: taken, as superseded."""
    v = verifier()
    _, old = announcement(epoch=3)
    _, new = announcement(epoch=4)
    v.verify(new, T0_MS)
    learned = v.verify(old, T0_MS)
    assert learned.superseded == (parse_announcement(old).key_id,)  # retired after the grace
    assert _refusal(announcement(epoch=3)[1], v=v) is DropReason.ANNOUNCE_ROLLBACK  # another key
    v2 = verifier()
    v2.verify(announcement(epoch=4)[1], T0_MS)
    assert _refusal(announcement(epoch=2)[1], v=v2) is DropReason.ANNOUNCE_ROLLBACK  # two back


def test_the_key_before_the_newest_may_arrive_late_after_an_older_one_was_taken() -> None:
    """Epoch 1 taken, every announcement of epoch 2 lost, then the sender's next burst: epoch 3
    first, then epoch 2 (it is still in use for ``announce_lead``); both taken, once each."""
    v = verifier()
    v.verify(announcement(epoch=1)[1], T0_MS)
    v.verify(announcement(epoch=3)[1], T0_MS)
    _, late = announcement(epoch=2)
    assert v.verify(late, T0_MS).superseded == (parse_announcement(late).key_id,)
    assert _refusal(announcement(epoch=2)[1], v=v) is DropReason.ANNOUNCE_ROLLBACK  # another key
    assert _refusal(announcement(epoch=1)[1], v=v) is DropReason.ANNOUNCE_ROLLBACK
