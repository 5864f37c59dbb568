"""Resend bundles: the authenticated file an operator carries from the low side to the high side.

A bundle lists, per source (topic, partition), the offset ranges the low side is missing. It is
JSON so a person can read it, and it is authenticated so the high side can trust that our low side
made it and nobody changed it on the way: HMAC-SHA256 over the canonical JSON of every field but
``auth``, under a key derived from the shared link key with HKDF-SHA256
(``info = b"kafka-diode bundle v1"``), so the bundle MAC never reuses the AES-GCM key directly.
In the public-key mode the low side signs instead with its own Ed25519 key (``sign_ed25519``,
``auth.alg = "Ed25519"``) and the high side verifies with that key's public half from its trusted
list: no secret crosses, and a high-side compromise cannot forge bundles.

Canonical JSON: ``json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``.
The full format is in ``docs/resend.md``. Verification refuses, with a ``BundleError`` that says
why: files over ``MAX_BUNDLE_BYTES``, bad JSON, another format or version, an unknown key id, a
wrong MAC, and contents that contradict themselves (overlapping or inverted ranges, counts that do
not add up). Pure: bytes in, bundle out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.errors import BundleError
from common.wire.pubkey import SigningKey, TrustedKeys, format_fingerprint

FORMAT = "kafka-diode-bundle"
VERSION = 1
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
MAX_RANGES = 1_000_000
_HKDF_INFO = b"kafka-diode bundle v1"
_SIGN_LABEL = b"kafka-diode bundle signature v1\x00"


@dataclass(frozen=True, slots=True)
class PartitionRanges:
    """The missing offsets of one source partition."""

    topic: str
    """Source topic name."""
    partition: int
    """Source partition."""
    ranges: tuple[tuple[int, int], ...]
    """Sorted, disjoint, non-adjacent inclusive ``(first, last)`` offset ranges."""

    @property
    def records(self) -> int:
        """How many offsets the ranges cover."""
        return sum(last - first + 1 for first, last in self.ranges)


@dataclass(frozen=True, slots=True)
class Bundle:
    """A verified (or about to be signed) resend bundle."""

    bundle_id: str
    """Random hex id; the resend marker on the wire carries it so the low side can correlate."""
    created_at_ms: int
    """When the low side made it, in Unix milliseconds."""
    gap_count: int
    """How many gap-topic entries (open gaps) were merged into these ranges."""
    partitions: tuple[PartitionRanges, ...]
    """Ranges per source partition, sorted by (topic, partition)."""

    @property
    def record_count(self) -> int:
        """Total offsets listed."""
        return sum(p.records for p in self.partitions)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sort and merge overlapping or adjacent inclusive ranges."""
    merged: list[list[int]] = []
    for first, last in sorted(ranges):
        if first > last:
            raise BundleError(f"range [{first}, {last}] is inverted")
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return tuple((a, b) for a, b in merged)


def build(
    gaps: Iterable[tuple[str, int, int, int]],
    *,
    bundle_id: str,
    created_at_ms: int,
    max_records: int | None = None,
) -> Bundle:
    """Build a bundle from ``(topic, partition, first, last)`` gaps, merging per partition.

    ``max_records`` keeps the lowest offsets of each partition first, in (topic, partition) order,
    and cuts the last range it touches so the bundle lists at most that many offsets.
    """
    per_partition: dict[tuple[str, int], list[tuple[int, int]]] = {}
    count = 0
    for topic, partition, first, last in gaps:
        per_partition.setdefault((topic, partition), []).append((first, last))
        count += 1
    budget = max_records
    parts: list[PartitionRanges] = []
    for (topic, partition), ranges in sorted(per_partition.items()):
        merged = merge_ranges(ranges)
        if budget is not None:
            kept: list[tuple[int, int]] = []
            for first, last in merged:
                if budget <= 0:
                    break
                end = min(last, first + budget - 1)
                kept.append((first, end))
                budget -= end - first + 1
            merged = tuple(kept)
        if merged:
            parts.append(PartitionRanges(topic, partition, merged))
    return Bundle(bundle_id, created_at_ms, count, tuple(parts))


def _mac_key(link_key: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(link_key)


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _document(bundle: Bundle) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "bundle_id": bundle.bundle_id,
        "created_at_ms": bundle.created_at_ms,
        "gap_count": bundle.gap_count,
        "record_count": bundle.record_count,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "records": p.records,
                "ranges": [[a, b] for a, b in p.ranges],
            }
            for p in bundle.partitions
        ],
    }


def sign(bundle: Bundle, *, key_id: int, link_key: bytes) -> bytes:
    """Serialise ``bundle`` as authenticated, human-readable JSON (UTF-8, trailing newline)."""
    doc = _document(bundle)
    mac = hmac.new(_mac_key(link_key), _canonical(doc), hashlib.sha256).hexdigest()
    doc["auth"] = {"alg": "HMAC-SHA256", "key_id": key_id, "mac": mac}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def sign_ed25519(bundle: Bundle, signing_key: SigningKey) -> bytes:
    """Serialise ``bundle`` signed with the low side's Ed25519 key (public-key mode).

    The signature covers ``SIGN_LABEL || canonical JSON of every field but auth``; the high side
    verifies it with the low side's public key from its trusted list, so no secret is shared.
    """
    doc = _document(bundle)
    signature = signing_key.sign(_SIGN_LABEL + _canonical(doc))
    doc["auth"] = {
        "alg": "Ed25519",
        "key": format_fingerprint(signing_key.fingerprint),
        "signature": signature.hex(),
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _verify_ed25519(doc: dict[str, Any], auth: Mapping[str, Any], trusted: TrustedKeys) -> None:
    stated = auth.get("key")
    entry = next(
        (
            k
            for k in trusted
            if isinstance(stated, str) and format_fingerprint(k.fingerprint) == stated
        ),
        None,
    )
    if entry is None:
        raise BundleError(
            f"bundle is signed by key {stated!r}, which is not a trusted low-side key"
            " (bundle_trusted_keys_file)"
        )
    verifier = trusted.verifier(entry.fingerprint)
    assert verifier is not None
    try:
        signature = bytes.fromhex(str(auth.get("signature")))
        verifier.verify(signature, _SIGN_LABEL + _canonical(doc))
    except (ValueError, InvalidSignature):
        raise BundleError(
            "bundle authentication failed: it was altered or signed with another key"
        ) from None


def _int(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BundleError(f"field {name!r} must be a non-negative integer")
    return value


def verify(data: bytes, keys: Mapping[int, bytes], *, trusted: TrustedKeys | None = None) -> Bundle:
    """Check ``data`` and return the bundle it holds.

    Args:
        data: the bundle file's bytes.
        keys: link keys by key id (the high side's key ring), for HMAC-SHA256 bundles.
        trusted: the low side's Ed25519 public keys, for signed bundles (public-key mode).

    Raises:
        BundleError: the file is too large, not JSON, of another format or version, signed with a
            key id not in ``keys``, altered (MAC mismatch), or internally inconsistent.
    """
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"bundle is {len(data)} bytes, over the {MAX_BUNDLE_BYTES}-byte limit")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"bundle is not valid JSON (truncated or damaged?): {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError("not a kafka-diode bundle (field 'format' missing or different)")
    if doc.get("version") != VERSION:
        raise BundleError(
            f"bundle version {doc.get('version')!r} is not supported"
            f" (this version reads {VERSION});"
            " make the bundle with the same kafka-diode version on both sides"
        )
    auth = doc.pop("auth", None)
    if isinstance(auth, dict) and auth.get("alg") == "Ed25519":
        if trusted is None:
            raise BundleError(
                "bundle is signed with Ed25519 (public-key mode); configure the low side's "
                "public key (bundle_trusted_keys_file) to verify it"
            )
        _verify_ed25519(doc, auth, trusted)
        return _parse(doc)
    if not isinstance(auth, dict) or auth.get("alg") != "HMAC-SHA256":
        raise BundleError("bundle has no HMAC-SHA256 authentication block")
    key_id = auth.get("key_id")
    if not isinstance(key_id, int) or key_id not in keys:
        raise BundleError(
            f"bundle is signed with key id {key_id!r}, which is not in this key ring"
            " (wrong key file, or the low side rotated keys: add its key to the ring)"
        )
    mac = auth.get("mac")
    expected = hmac.new(_mac_key(keys[key_id]), _canonical(doc), hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
        raise BundleError("bundle authentication failed: it was altered or made with another key")
    return _parse(doc)


def _parse(doc: Mapping[str, Any]) -> Bundle:
    parts_raw = doc.get("partitions")
    if not isinstance(parts_raw, list):
        raise BundleError("field 'partitions' must be a list")
    parts: list[PartitionRanges] = []
    total_ranges = 0
    for entry in parts_raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str):
            raise BundleError("each partition entry needs a string 'topic'")
        ranges_raw = entry.get("ranges")
        if not isinstance(ranges_raw, list):
            raise BundleError("each partition entry needs a list 'ranges'")
        total_ranges += len(ranges_raw)
        if total_ranges > MAX_RANGES:
            raise BundleError(f"bundle lists more than {MAX_RANGES} ranges")
        ranges: list[tuple[int, int]] = []
        for pair in ranges_raw:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair)
            ):
                raise BundleError(f"range {pair!r} is not a pair of non-negative offsets")
            ranges.append((pair[0], pair[1]))
        if tuple(ranges) != merge_ranges(ranges):
            raise BundleError(f"ranges of {entry['topic']} are not sorted, disjoint and merged")
        part = PartitionRanges(entry["topic"], _int(entry, "partition"), tuple(ranges))
        if part.records != _int(entry, "records"):
            raise BundleError(f"record count of {part.topic}:{part.partition} does not add up")
        parts.append(part)
    bundle = Bundle(
        bundle_id=str(doc.get("bundle_id", "")),
        created_at_ms=_int(doc, "created_at_ms"),
        gap_count=_int(doc, "gap_count"),
        partitions=tuple(parts),
    )
    if bundle.record_count != _int(doc, "record_count"):
        raise BundleError("total record count does not add up")
    return bundle


def summary_rows(bundle: Bundle) -> list[tuple[str, int, int, int, str]]:
    """``(topic, partition, ranges, records, first ranges as text)`` per partition, for tables."""
    rows = []
    for p in bundle.partitions:
        shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in p.ranges[:5])
        if len(p.ranges) > 5:
            shown += f", … (+{len(p.ranges) - 5})"
        rows.append((p.topic, p.partition, len(p.ranges), p.records, shown))
    return rows
