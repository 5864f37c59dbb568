"""The receiver's decoder in public-key mode: learns session keys from announcements.

Theory of operation (docs/protocol.md §7.5). :class:`PublicKeyDecoder` is a
:class:`~common.wire.decoder.Decoder` whose key ring starts empty and is filled only by verified
key announcements (kind 3); every other datagram takes the shared-key path unchanged, so the data
path costs the same in both modes (one byte compared per datagram on top).

* **Announcement** (kind 3): an exact repeat of an accepted one whose key is still live costs a
  dictionary lookup. Anything else goes to :class:`~common.wire.announce.AnnouncementVerifier`;
  a refusal is a ``Dropped`` event with its own reason, an acceptance puts the key in the ring,
  emits :class:`KeyLearned`, and releases the datagrams held for that key id.
* **Held datagrams**: a datagram under a key id the ring does not (yet) hold — its announcement
  lost or still on the way — is held instead of dropped, bounded by ``hold_datagrams``,
  ``hold_bytes`` and ``hold_timeout``. When the key arrives the held datagrams are decoded in
  arrival order (their sequences were never accepted by the replay window, so they pass it);
  what overflows or times out is dropped as ``unknown_key``. A datagram lost this way loses its
  records, which the sender's next heartbeats report as a gap: nothing disappears silently.
* **Expiry**: a key leaves the ring when its validity ends (plus ``max_clock_skew``) and
  ``retire_grace`` seconds after a newer epoch of the same sender session was learned
  (:class:`KeyRetired`). Old keys are gone, so recorded traffic cannot be decrypted with what
  the receiver holds later (only the receiver's long-term private key could reopen old
  announcements; docs/protocol.md §7.5 "What each compromise allows").

The wall clock (validity is in Unix ms, set by the sender) is not read here: the caller passes
``sync_clock(wall_ms, now)`` from time to time, and wall time is ``wall_ms + (now' - now)``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Final, cast

from common.errors import ConfigError, KeyRingError, RemoteProtocolError
from common.wire.announce import AnnouncementVerifier
from common.wire.config import WireConfig
from common.wire.decoder import Decoder
from common.wire.envelope import KIND_KEY_ANNOUNCEMENT
from common.wire.events import Dropped, DropReason, Event
from common.wire.keyring import KeyRing

_KIND: Final = 5
_KEY_ID: Final = slice(32, 36)
MiB: Final = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class PublicKeyReceiveConfig:
    """Limits of the receiver's public-key mode (seconds, datagrams, bytes)."""

    retire_grace: float = 30.0
    """Seconds an older session key stays usable after a newer one of its session arrived."""
    hold_datagrams: int = 4096
    """Datagrams under a not-yet-announced key held for its announcement (0: drop at once)."""
    hold_bytes: int = 16 * MiB
    """Bytes of held datagrams at most."""
    hold_timeout: float = 5.0
    """Seconds a held datagram waits for its key before it is dropped as unknown_key."""

    def __post_init__(self) -> None:
        for name in ("retire_grace", "hold_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigError(name, f"must be a non-negative number, got {value!r}", "e.g. 5")
        for name in ("hold_datagrams", "hold_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"must be a whole number >= 0, got {value!r}", "e.g. 4096")


@dataclass(frozen=True, slots=True)
class KeyLearned:
    """A verified announcement put a session key in the ring."""

    session_id: bytes
    """The announcing sender session."""
    key_id: int
    """The new key's id."""
    epoch: int
    """Its epoch in the session."""
    signer: str
    """Name of the trusted signer."""
    signer_fingerprint: bytes
    """Fingerprint of the signer's key."""
    receiver_fingerprint: bytes
    """Fingerprint of the receiver key pair it was sealed to."""
    not_after_ms: int
    """End of its validity (Unix ms)."""
    released: int
    """Held datagrams decoded now that the key is known."""


@dataclass(frozen=True, slots=True)
class KeyRetired:
    """A session key left the ring."""

    key_id: int
    """The key's id."""
    why: str
    """``expired`` (validity over) or ``superseded`` (a newer epoch, after the grace)."""


def _as_event(event: KeyLearned | KeyRetired) -> Event:
    # The base decoder's queue is typed for its own events; ours share it so that order holds
    # (a KeyLearned precedes the batches it releases). ``next_event`` is typed for both.
    return cast("Event", event)


@dataclass(slots=True)
class _Live:
    deadline: float
    why: str
    announcements: list[bytes] = field(default_factory=list)


class PublicKeyDecoder(Decoder):
    """A :class:`Decoder` that learns its keys from key announcements (module docstring)."""

    def __init__(
        self,
        config: WireConfig,
        verifier: AnnouncementVerifier,
        pk_config: PublicKeyReceiveConfig | None = None,
    ) -> None:
        super().__init__(config, KeyRing())
        self.verifier = verifier
        self._pk = pk_config if pk_config is not None else PublicKeyReceiveConfig()
        self._wall_offset_ms = 0.0
        self._live: dict[int, _Live] = {}
        self._accepted: OrderedDict[bytes, int] = OrderedDict()
        self._max_accepted = 4 * config.max_sessions
        self._held: deque[tuple[float, int, bytes]] = deque()
        self._held_bytes = 0
        self.announcements_accepted = 0
        """Announcements that taught a new key."""
        self.announcements_repeated = 0
        """Exact repeats of an accepted announcement whose key is live (cheap, not drops)."""
        self.held_released = 0
        """Held datagrams decoded after their key arrived."""
        self._unknown_key = False

    @property
    def held(self) -> int:
        """Datagrams held for a key not yet learned."""
        return len(self._held)

    def sync_clock(self, wall_ms: float, now: float) -> None:
        """Tie the monotonic ``now`` to the wall clock (Unix ms) for validity checks."""
        self._wall_offset_ms = wall_ms - now * 1000.0

    def receive_datagram(self, data: bytes, now: float) -> None:
        """Process one datagram; never raises for bad input."""
        if len(data) > _KIND and data[_KIND] == KIND_KEY_ANNOUNCEMENT:
            self.datagrams += 1
            self._announcement(data, now)
            return
        Decoder.receive_datagram(self, data, now)
        if self._unknown_key:  # set by _open: hold the datagram instead of dropping it
            self._unknown_key = False
            events = self._events
            last = events[-1] if events else None
            if last.__class__ is Dropped and last.reason is DropReason.UNKNOWN_KEY:
                events.pop()
                self._uncount(DropReason.UNKNOWN_KEY)
                self.datagrams -= 1  # counted again when it is decoded or dropped for good
                self._hold(data, now)

    def _open(self, data: bytes, pos: int, session_id: bytes, sequence: int, key_id: int) -> bytes:
        # Only the general path reaches here (the fast path needs a known key), so the data path
        # pays nothing for holding: a flag is set only when the key is missing.
        keyring = self.keyring
        if self._pk.hold_datagrams and (keyring is None or keyring.get(key_id) is None):
            self._unknown_key = True
        return Decoder._open(self, data, pos, session_id, sequence, key_id)

    def _uncount(self, reason: DropReason) -> None:
        drops = self._drops
        drops[reason] -= 1
        if not drops[reason]:
            del drops[reason]

    def _hold(self, data: bytes, now: float) -> None:
        pk = self._pk
        held = self._held
        while held and (
            len(held) >= pk.hold_datagrams or self._held_bytes + len(data) > pk.hold_bytes
        ):
            self._drop_held(held.popleft(), "held datagram evicted for room")
        if len(data) > pk.hold_bytes:
            self.datagrams += 1
            self._drop(DropReason.UNKNOWN_KEY, "datagram larger than hold_bytes", None)
            return
        held.append((now, int.from_bytes(data[_KEY_ID], "big"), data))
        self._held_bytes += len(data)

    def _drop_held(self, item: tuple[float, int, bytes], why: str) -> None:
        _, key_id, data = item
        self._held_bytes -= len(data)
        self.datagrams += 1
        self._drop(DropReason.UNKNOWN_KEY, f"key id {key_id:08x}: {why}", bytes(data[8:24]))

    def _take_held(self, key_id: int) -> list[bytes]:
        if not self._held:
            return []
        keep: deque[tuple[float, int, bytes]] = deque()
        ready: list[bytes] = []
        for item in self._held:
            if item[1] == key_id:
                ready.append(item[2])
                self._held_bytes -= len(item[2])
            else:
                keep.append(item)
        self._held = keep
        return ready

    def _announcement(self, data: bytes, now: float) -> None:
        key_id = self._accepted.get(data)
        keyring = self.keyring
        assert keyring is not None
        if key_id is not None and key_id in keyring:
            self._accepted.move_to_end(data)
            self.announcements_repeated += 1
            return
        try:
            learned = self.verifier.verify(data, self._wall_offset_ms + now * 1000.0)
        except RemoteProtocolError as exc:
            reason = exc.reason if isinstance(exc.reason, DropReason) else DropReason.MALFORMED
            session = bytes(data[8:24]) if len(data) >= 24 else None
            self._drop(reason, exc.detail, session)
            return
        a = learned.announcement
        pk = self._pk
        if a.key_id not in keyring:
            try:
                keyring.add(learned.key)
            except KeyRingError as exc:  # another key with the same 32-bit id (2**-32)
                self._drop(DropReason.BAD_SEAL, str(exc), a.session_id)
                return
            self.announcements_accepted += 1
        end_mono = (
            a.not_after_ms + self.verifier.max_clock_skew * 1000.0 - self._wall_offset_ms
        ) / 1000.0
        live = self._live.get(a.key_id)
        if live is None:
            live = self._live[a.key_id] = _Live(end_mono, "expired")
        if len(live.announcements) < 4:
            live.announcements.append(data)
        for old in learned.superseded:
            old_live = self._live.get(old)
            if old_live is not None and now + pk.retire_grace < old_live.deadline:
                old_live.deadline = now + pk.retire_grace
                old_live.why = "superseded"
        self._accepted[data] = a.key_id
        if len(self._accepted) > self._max_accepted:
            self._accepted.popitem(last=False)
        ready = self._take_held(a.key_id)
        self._events.append(
            _as_event(
                KeyLearned(
                    a.session_id,
                    a.key_id,
                    a.epoch,
                    learned.signer_name,
                    a.sender_fingerprint,
                    a.receiver_fingerprint,
                    a.not_after_ms,
                    len(ready),
                )
            )
        )
        for held in ready:  # after the event: a KeyLearned precedes what it releases
            Decoder.receive_datagram(self, held, now)
        self.held_released += len(ready)

    def next_event(self) -> Event | KeyLearned | KeyRetired | None:  # type: ignore[override]
        """The next event, or None when none is queued."""
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` has work: reassembly, a held datagram or a key expiring."""
        deadlines = [live.deadline for live in self._live.values()]
        base = super().next_deadline()
        if base is not None:
            deadlines.append(base)
        if self._held:
            deadlines.append(self._held[0][0] + self._pk.hold_timeout)
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        """Time out reassemblies and held datagrams; retire expired keys."""
        super().handle_timer(now)
        held = self._held
        limit = now - self._pk.hold_timeout
        while held and held[0][0] <= limit:
            self._drop_held(held.popleft(), "its key was not announced in time")
        keyring = self.keyring
        assert keyring is not None
        for key_id in [k for k, live in self._live.items() if live.deadline <= now]:
            live = self._live.pop(key_id)
            if key_id in keyring:
                keyring.remove(key_id)
            for data in live.announcements:
                self._accepted.pop(data, None)
            self._events.append(_as_event(KeyRetired(key_id, live.why)))
