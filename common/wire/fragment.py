"""Reassembly of fragmented messages, bounded in count, bytes and time.

A message longer than one datagram's capacity is cut into ``fragment_count`` chunks sent with
consecutive sequence numbers; fragment ``i`` has sequence ``first + i``, so ``(session, sequence -
fragment_index)`` names the message. Every fragment is authenticated on its own before it gets
here. Guarantees (docs/protocol.md §6.3):

- at most ``max_reassemblies`` partial messages and ``max_bytes`` declared bytes are held; making
  room evicts the oldest partial message (counted as REASSEMBLY_OVERFLOW);
- a message's declared length is checked against ``max_message_size`` before anything is kept,
  and the bytes kept for it never exceed that declared length;
- a partial message older than ``timeout`` seconds is dropped (REASSEMBLY_TIMEOUT);
- fragments that disagree with their message (count, length, kind, compression) are dropped
  (FRAGMENT_MISMATCH) without disturbing it.
"""

from __future__ import annotations

from collections import OrderedDict

from common.errors import RemoteProtocolError
from common.wire.events import DropReason


class _Partial:
    __slots__ = ("chunks", "compression", "count", "deadline", "kind", "received", "total")

    def __init__(self, kind: int, compression: int, count: int, total: int, deadline: float):
        self.kind = kind
        self.compression = compression
        self.count = count
        self.total = total
        self.deadline = deadline
        self.chunks: dict[int, bytes] = {}
        self.received = 0


#: (session id, sequence of the first fragment)
MessageId = tuple[bytes, int]


class Reassembler:
    """Collects fragments into messages."""

    __slots__ = ("_bytes", "_max_bytes", "_max_count", "_partials", "_timeout", "evicted")

    def __init__(self, *, max_reassemblies: int, max_bytes: int, timeout: float) -> None:
        self._max_count = max_reassemblies
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._partials: OrderedDict[MessageId, _Partial] = OrderedDict()
        self._bytes = 0
        #: Message ids evicted to make room since the caller last cleared this list.
        self.evicted: list[MessageId] = []

    def __len__(self) -> int:
        return len(self._partials)

    def add(  # noqa: PLR0917  called per fragment from the decoder only
        self,
        session_id: bytes,
        sequence: int,
        index: int,
        count: int,
        total: int,
        kind: int,
        compression: int,
        chunk: bytes,
        now: float,
    ) -> bytes | None:
        """Keep one authenticated fragment; returns the whole message when it is complete.

        Raises:
            RemoteProtocolError: FRAGMENT_MISMATCH, or TOO_LARGE when the message could never fit.
        """
        mid = (session_id, sequence - index)
        partial = self._partials.get(mid)
        if partial is None:
            if total > self._max_bytes:
                raise RemoteProtocolError(DropReason.TOO_LARGE, f"message of {total} bytes")
            while self._partials and not self._fits(total):
                old_id, old = self._partials.popitem(last=False)
                self._bytes -= old.total
                self.evicted.append(old_id)
            partial = _Partial(kind, compression, count, total, now + self._timeout)
            self._partials[mid] = partial
            self._bytes += total
        elif (
            partial.count != count
            or partial.total != total
            or partial.kind != kind
            or partial.compression != compression
        ):
            raise RemoteProtocolError(
                DropReason.FRAGMENT_MISMATCH, f"fragment {index} disagrees with its message"
            )
        if index in partial.chunks:
            raise RemoteProtocolError(DropReason.DUPLICATE, f"fragment {index} again")
        if partial.received + len(chunk) > total:
            self._discard(mid)
            raise RemoteProtocolError(
                DropReason.FRAGMENT_MISMATCH, "fragments longer than the declared message"
            )
        partial.chunks[index] = chunk
        partial.received += len(chunk)
        if len(partial.chunks) < count:
            return None
        self._discard(mid)
        if partial.received != total:
            raise RemoteProtocolError(
                DropReason.FRAGMENT_MISMATCH, "fragments shorter than the declared message"
            )
        chunks = partial.chunks
        return b"".join(chunks[i] for i in range(count))

    def has_room(self, total: int) -> bool:
        """Whether a new message of ``total`` bytes would be kept without evicting another (the
        coalesced path, ``Decoder.receive_coalesced``, takes only such messages, so that it
        never skips an eviction the fragment-by-fragment path would have made)."""
        return total <= self._max_bytes and self._fits(total)

    def _fits(self, total: int) -> bool:
        """Whether the partial messages held leave room for one more of ``total`` bytes."""
        return len(self._partials) < self._max_count and self._bytes + total <= self._max_bytes

    def _discard(self, mid: MessageId) -> None:
        partial = self._partials.pop(mid, None)
        if partial is not None:
            self._bytes -= partial.total

    def expire(self, now: float) -> list[MessageId]:
        """Drop and return the partial messages whose deadline has passed."""
        expired: list[MessageId] = []
        partials = self._partials
        while partials:
            mid, partial = next(iter(partials.items()))
            if partial.deadline > now:
                break
            self._discard(mid)
            expired.append(mid)
        return expired

    def next_deadline(self) -> float | None:
        """When the oldest partial message expires (they expire in arrival order)."""
        for partial in self._partials.values():
            return partial.deadline
        return None
