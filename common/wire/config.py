"""Limits and choices of the wire protocol, shared by encoder and decoder (docs/protocol.md §6).

A :class:`WireConfig` is valid once constructed: ``__post_init__`` checks every field and the
relations between them (a maximal record must fit a message, a maximal message must fit
``max_fragments`` fragments) and raises :class:`~common.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.errors import ConfigError
from common.wire.envelope import HEADER_SIZE, TAG_SIZE, varint_size

MiB = 1024 * 1024

#: IPv6 header (40) + UDP header (8) subtracted from a 1500-byte Ethernet MTU. IPv4's header is
#: 20 bytes, so 1472 would do there; 1452 fits both without IP fragmentation (docs/protocol.md §6).
DEFAULT_DATAGRAM_SIZE = 1500 - 40 - 8
#: The largest UDP payload IPv4 can carry: 65535 - 20 (IPv4 header) - 8 (UDP header).
MAX_DATAGRAM_SIZE = 65507
#: Below this, the 44-byte header and 16-byte tag leave too little room to be useful.
MIN_DATAGRAM_SIZE = 256
#: fragment_index and fragment_count are 16-bit on the wire.
MAX_FRAGMENTS = 65535
#: Room for a record's topic name and per-record framing on top of ``max_record_size``.
MESSAGE_OVERHEAD_ALLOWANCE = 4096

COMPRESSIONS = ("none", "gzip", "zstd")

Compression = Literal["none", "gzip", "zstd"]
#: Levels each compression accepts (zstd's 20..22 need a huge window on both sides).
COMPRESSION_LEVELS = {"none": range(1, 10), "gzip": range(1, 10), "zstd": range(1, 20)}


@dataclass(frozen=True, kw_only=True)
class WireConfig:
    """Wire protocol limits and choices; every size is in bytes, every time in seconds."""

    max_datagram_size: int = DEFAULT_DATAGRAM_SIZE
    """Largest UDP payload sent; 1452 fits a 1500 MTU for IPv4 and IPv6 (up to 65507)."""
    compression: Compression = "none"
    """Payload compression before encryption: none, gzip or zstd (skipped when it does not
    shrink). The receiver reads every one without a setting."""
    compression_level: int = 1
    """gzip level 1 (fastest) to 9 (smallest); zstd 1 to 19."""
    max_record_size: int = 16 * MiB
    """Largest record (key + value + header names and values); larger ones are refused."""
    max_message_size: int = 17 * MiB
    """Largest message (a batch after compression, before fragmentation) sent or reassembled."""
    max_decompressed_size: int = 17 * MiB
    """Largest payload a compressed message may inflate to (gzip bomb guard)."""
    max_fragments: int = MAX_FRAGMENTS
    """Most fragments one message may have (wire maximum 65535)."""
    max_reassemblies: int = 64
    """Most fragmented messages in reassembly at once; the oldest is evicted beyond that."""
    max_reassembly_bytes: int = 128 * MiB
    """Total declared size of all messages in reassembly; the oldest is evicted beyond that."""
    reassembly_timeout: float = 10.0
    """Seconds a fragmented message may take to complete before it is dropped."""
    replay_window: int = 8192
    """Anti-replay window per session, in datagrams (how much reordering is tolerated)."""
    max_sessions: int = 64
    """Sender sessions whose replay windows are tracked at once (least recently used evicted)."""
    allow_cleartext: bool = False
    """Accept (decoder) or produce (encoder without key ring) cipher none; tests and demos only."""
    linger: float = 0.005
    """Seconds a record may wait for more records to fill its datagram."""

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, problem: str, fix: str) -> None:
            if not ok:
                raise ConfigError(key, problem, fix)

        for name in (
            "max_datagram_size",
            "compression_level",
            "max_record_size",
            "max_message_size",
            "max_decompressed_size",
            "max_fragments",
            "max_reassemblies",
            "max_reassembly_bytes",
            "replay_window",
            "max_sessions",
        ):
            value = getattr(self, name)
            need(
                isinstance(value, int) and not isinstance(value, bool),
                name,
                f"must be an integer, got {value!r}",
                "write a whole number",
            )
        need(
            MIN_DATAGRAM_SIZE <= self.max_datagram_size <= MAX_DATAGRAM_SIZE,
            "max_datagram_size",
            f"{self.max_datagram_size} is outside {MIN_DATAGRAM_SIZE}..{MAX_DATAGRAM_SIZE}",
            "use 1452 for a 1500-byte MTU, 8952 for 9000-byte jumbo frames",
        )
        need(
            self.compression in COMPRESSIONS,
            "compression",
            f"unknown compression {self.compression!r}",
            f"use one of {', '.join(COMPRESSIONS)}",
        )
        levels = COMPRESSION_LEVELS.get(self.compression, range(1, 10))
        need(
            self.compression_level in levels,
            "compression_level",
            f"{self.compression_level} is outside {levels.start}..{levels.stop - 1}"
            f" for {self.compression}",
            "use 1 for speed, 6 for ratio",
        )
        need(self.max_record_size >= 1, "max_record_size", "must be positive", "e.g. 16777216")
        need(
            self.max_message_size >= self.max_record_size + MESSAGE_OVERHEAD_ALLOWANCE,
            "max_message_size",
            f"{self.max_message_size} cannot hold a record of max_record_size "
            f"{self.max_record_size} plus framing",
            f"set it to at least max_record_size + {MESSAGE_OVERHEAD_ALLOWANCE}",
        )
        need(
            self.max_decompressed_size >= self.max_message_size,
            "max_decompressed_size",
            "must be at least max_message_size",
            f"set it to at least {self.max_message_size}",
        )
        need(
            1 <= self.max_fragments <= MAX_FRAGMENTS,
            "max_fragments",
            f"{self.max_fragments} is outside 1..{MAX_FRAGMENTS}",
            "fragment fields are 16-bit",
        )
        capacity = fragment_capacity(self.max_datagram_size)
        needed = -(-self.max_message_size // capacity)
        need(
            needed <= self.max_fragments,
            "max_fragments",
            f"a message of max_message_size {self.max_message_size} needs {needed} fragments "
            f"of {capacity} bytes",
            "raise max_fragments or max_datagram_size, or lower max_message_size",
        )
        need(self.max_reassemblies >= 1, "max_reassemblies", "must be positive", "e.g. 64")
        need(
            self.max_reassembly_bytes >= self.max_message_size,
            "max_reassembly_bytes",
            "must hold at least one message of max_message_size",
            f"set it to at least {self.max_message_size}",
        )
        for name in ("reassembly_timeout", "linger"):
            value = getattr(self, name)
            need(
                isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
                name,
                f"must be a non-negative number of seconds, got {value!r}",
                "e.g. 10 or 0.005",
            )
        need(self.reassembly_timeout > 0, "reassembly_timeout", "must be positive", "e.g. 10")
        need(
            64 <= self.replay_window <= 1 << 20,
            "replay_window",
            f"{self.replay_window} is outside 64..1048576",
            "e.g. 8192 datagrams",
        )
        need(self.max_sessions >= 1, "max_sessions", "must be positive", "e.g. 64")
        need(
            isinstance(self.allow_cleartext, bool),
            "allow_cleartext",
            "must be true or false",
            "write true or false",
        )


def fragment_capacity(max_datagram_size: int) -> int:
    """Largest plaintext chunk one datagram carries: size - header - length prefix - GCM tag.

    docs/protocol.md §6: ``44 + len(varint(zigzag(c + 16))) + c + 16 <= max_datagram_size``.
    """
    capacity = max_datagram_size - HEADER_SIZE - TAG_SIZE - 1
    while capacity > 0 and (
        HEADER_SIZE + varint_size((capacity + TAG_SIZE) << 1) + capacity + TAG_SIZE
        > max_datagram_size
    ):
        capacity -= 1
    return capacity
