"""The QR form of a resend bundle (paper transfer), pure: bundle bytes <-> QR payload texts.

Each payload is ``KDB1 <i>/<n> <id>\n<base64 chunk>`` over the zlib-compressed compact bundle;
``<id>`` (8 hex digits of SHA-256 of the compressed bytes) keeps codes of different bundles from
being mixed. The low side makes them (``bundle qr``), the high side joins them (``bundle join``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Iterable

from common import bundle as bundle_format
from common.errors import BundleError

QR_MAGIC = "KDB1"
QR_CHUNK = 1400
"""Base64 characters per QR code (version ~30 at error correction M: scannable from paper)."""
MAX_QR_PARTS = 32
"""More codes than this is no longer a 'small' bundle: use --max-records."""


def qr_parts(data: bytes) -> list[str]:
    """Split a bundle into QR payloads: ``KDB1 <i>/<n> <id>\n<base64 chunk>``.

    The bundle is re-serialised compactly (the MAC covers the canonical form, so it still
    verifies), zlib-compressed and base64-encoded; ``<id>`` (8 hex digits of SHA-256 of the
    compressed bytes) keeps codes of different bundles from being mixed.

    Raises:
        BundleError: the bundle needs more than ``MAX_QR_PARTS`` codes.
    """
    compact = json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    packed = zlib.compress(compact, 9)
    digest = hashlib.sha256(packed).hexdigest()[:8]
    text = base64.b64encode(packed).decode("ascii")
    chunks = [text[i : i + QR_CHUNK] for i in range(0, len(text), QR_CHUNK)] or [""]
    if len(chunks) > MAX_QR_PARTS:
        raise BundleError(
            f"bundle needs {len(chunks)} QR codes (limit {MAX_QR_PARTS});"
            " make a smaller one with --max-records"
        )
    n = len(chunks)
    return [f"{QR_MAGIC} {i}/{n} {digest}\n{chunk}" for i, chunk in enumerate(chunks, 1)]


def join_parts(parts: Iterable[str]) -> bytes:
    """Reassemble QR payloads (any order, duplicates allowed) into the bundle's bytes.

    Raises:
        BundleError: a payload is malformed, parts of different bundles are mixed, one is
            missing, or the result is damaged.
    """
    chunks: dict[int, str] = {}
    total = digest = None
    for raw in parts:
        head, _, chunk = raw.strip().partition("\n")
        fields = head.split()
        if len(fields) != 3 or fields[0] != QR_MAGIC or "/" not in fields[1]:
            raise BundleError(f"not a kafka-diode bundle QR code: {head[:40]!r}")
        index_text, _, total_text = fields[1].partition("/")
        try:
            index, count = int(index_text), int(total_text)
        except ValueError:
            raise BundleError(f"bad part number {fields[1]!r}") from None
        if not 1 <= index <= count <= MAX_QR_PARTS:
            raise BundleError(f"bad part number {fields[1]!r}")
        if total is None:
            total, digest = count, fields[2]
        elif (count, fields[2]) != (total, digest):
            raise BundleError("QR codes of different bundles are mixed")
        chunks[index] = chunk.strip()
    if total is None:
        raise BundleError("no QR payloads given")
    missing = [i for i in range(1, total + 1) if i not in chunks]
    if missing:
        raise BundleError(f"QR codes {missing} of {total} are missing")
    try:
        packed = base64.b64decode("".join(chunks[i] for i in range(1, total + 1)), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BundleError(f"QR payload is damaged: {exc}") from exc
    if hashlib.sha256(packed).hexdigest()[:8] != digest:
        raise BundleError("QR payload is damaged (checksum mismatch)")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, bundle_format.MAX_BUNDLE_BYTES)
    except zlib.error as exc:
        raise BundleError(f"QR payload is damaged: {exc}") from exc
    if inflater.unconsumed_tail:
        raise BundleError("QR payload decompresses beyond the bundle size limit")
    return data
