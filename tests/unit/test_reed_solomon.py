"""The repair encoder (common/wire/reed_solomon.py): ISA-L's repairs are zfec's, byte for byte.

The wire protocol names zfec's code (docs/protocol.md §13.2); ISA-L only computes it faster. If
the two ever differ, a receiver would rebuild garbage (dropped as ``fec_mismatch``), so every
shape of block the protocol allows is compared here.
"""

from __future__ import annotations

import os
import random

import pytest
import zfec
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import reed_solomon
from common.wire.reed_solomon import RepairEncoder, zfec_rows

ACCELERATED = RepairEncoder().accelerated
ZFEC = RepairEncoder(accelerate=False)

needs_isal = pytest.mark.skipif(
    not ACCELERATED and os.environ.get("CI") != "true",
    reason="libisal2 not installed (make tools installs it); CI must have it",
)


def test_ci_has_isal() -> None:
    """CI installs ISA-L (make tools), so the accelerated path is what CI tests."""
    if os.environ.get("CI") == "true":
        assert ACCELERATED, reed_solomon.ACCELERATION


@st.composite
def blocks(draw: st.DrawFn, *, large: bool) -> tuple[bytearray, int, int, int]:
    """A block the protocol allows: k + m <= 256; ``large`` ones are big enough for ISA-L."""
    k = draw(st.integers(1, 255) | st.integers(1, 40))
    m = draw(st.integers(1, 256 - k) if k > 200 else st.integers(1, min(40, 256 - k)))
    least = -(-reed_solomon._ISAL_MIN_WORK // (k * m)) if large else 1
    size = draw(st.integers(least, max(least, 1500)))
    data = random.Random(draw(st.integers(0, 2**32))).randbytes(k * size)
    return bytearray(data), k, m, size


@needs_isal
@settings(max_examples=150, deadline=None)
@given(blocks(large=True))
def test_isal_repairs_equal_zfec_repairs(block: tuple[bytearray, int, int, int]) -> None:
    data, k, m, size = block
    assert RepairEncoder().encode(data, k, m, size) == ZFEC.encode(data, k, m, size)
    assert RepairEncoder().encode(data, k, m, size, room=17) == ZFEC.encode(
        data, k, m, size, room=17
    )


@settings(max_examples=100, deadline=None)
@given(blocks(large=False), st.integers(0, 40))
def test_any_block_gives_zfecs_repairs_after_room_left_zero(
    block: tuple[bytearray, int, int, int], room: int
) -> None:
    data, k, m, size = block
    symbols = [bytes(data[i * size : (i + 1) * size]) for i in range(k)]
    expected = zfec.Encoder(k, k + m).encode(symbols, tuple(range(k, k + m)))
    out = RepairEncoder().encode(data, k, m, size, room=room)
    assert out == b"".join(bytes(room) + bytes(r) for r in expected)


@needs_isal
def test_a_full_block_of_random_datagrams_rebuilds_with_zfecs_decoder() -> None:
    k, m, size = 32, 7, 1365
    data = bytearray(os.urandom(k * size))
    out = RepairEncoder().encode(data, k, m, size)
    repairs = [bytes(out[j * size : (j + 1) * size]) for j in range(m)]
    kept = list(range(m, k))  # the first m sources lost
    shares = [bytes(data[i * size : (i + 1) * size]) for i in kept] + repairs
    decoded = zfec.Decoder(k, k + m).decode(shares, kept + list(range(k, k + m)))
    assert b"".join(bytes(s) for s in decoded) == bytes(data)


@needs_isal
def test_large_blocks_take_the_isal_path(monkeypatch: pytest.MonkeyPatch) -> None:
    isal = reed_solomon._ISAL
    assert isal is not None
    calls = []
    real = isal.encode_data
    monkeypatch.setattr(isal, "encode_data", lambda *a: calls.append(a[:3]) or real(*a))
    RepairEncoder().encode(bytearray(32 * 1365), 32, 7, 1365)
    RepairEncoder().encode(bytearray(3 * 101), 3, 2, 101)  # too small to pay for the call
    assert calls == [(1365, 32, 7)]


def test_zfec_rows_are_the_coefficients_of_each_source() -> None:
    # repair j of a block whose source i is all ones but zero elsewhere is row j, column i
    k, m = 5, 3
    rows = zfec_rows(k, m)
    for i in range(k):
        data = bytearray(k * 4)
        data[i * 4 : (i + 1) * 4] = b"\x01" * 4
        out = ZFEC.encode(data, k, m, 4)
        for j in range(m):
            assert out[j * 4 : (j + 1) * 4] == bytes([rows[j * k + i]]) * 4


@pytest.mark.parametrize(
    ("k", "m", "size", "room"),
    [(0, 1, 10, 0), (1, 0, 10, 0), (200, 57, 10, 0), (2, 1, 0, 0), (3, 1, 7, 0), (2, 1, 10, -1)],
)
def test_impossible_blocks_are_refused(k: int, m: int, size: int, room: int) -> None:
    with pytest.raises(ValueError, match=r"block of|room"):
        RepairEncoder().encode(bytearray(20), k, m, size, room=room)
