"""The repair code of docs/protocol.md §13.2: zfec's Reed-Solomon, encoded with SIMD when it can.

Theory of operation. The code is zfec's systematic Reed-Solomon over GF(2^8) (field polynomial
0x11d): repair symbol ``j`` of a block of ``k`` equal-length source symbols is, byte column by
byte column, ``sum_i A[j][i] * source_i`` for a fixed ``m x k`` matrix ``A`` (the lower rows of
zfec's systematic Vandermonde matrix). zfec computes it one multiply-add table lookup per byte,
~240 MB/s of source data at k 32, m 7 on our build VM: at 20 % overhead that was more than half
of what FEC costs the sender per record (docs/benchmarks.md, "Forward error correction").

ISA-L (Intel's Intelligent Storage Acceleration Library, the ``libisal2`` package of Debian and
Ubuntu, ``isa-l`` elsewhere) does the same GF(2^8) arithmetic with SIMD shuffles (AVX2, AVX-512,
NEON) over *any* coefficient matrix in the same field: ``ec_init_tables`` expands the matrix,
``ec_encode_data`` multiplies. Given zfec's own rows ``A`` (read out of zfec once per (k, m) by
encoding the identity: source ``i`` all zero but byte ``i``, so repair ``j`` holds row ``j``) it
produces zfec's repair bytes, about ten times faster (k 32, m 7: 17 µs a block against 182).
The wire does not change: a sender with ISA-L and one without send identical repairs, and the
receiver decodes with zfec either way (decoding only runs when datagrams were lost).

ISA-L is optional and loaded with ``ctypes`` (no build step, no Python package): when the
library is missing or fails the self-test at load (its bytes must equal zfec's on a test block,
so a library built for another field never goes unnoticed), :class:`RepairEncoder` uses zfec.
:data:`ACCELERATION` says which one runs (logged by the sender at start).

Pure (docs/design.md, "A sans-IO core"): no I/O; the one side effect is loading a shared library
at import.
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, TypeVar

import zfec

logger = logging.getLogger(__name__)

#: Shared-library names tried in order (the soname of ISA-L 2.x, then the unversioned link).
ISAL_LIBRARIES: Final = ("libisal.so.2", "libisal.so")
#: (k, m) pairs whose expanded tables and zfec coders are kept (each ISA-L table is 32 k m bytes).
_CACHE: Final = 64

#: Multiply-adds (k m size) below which zfec is faster: a ctypes call and its pointer arrays
#: cost ~4 µs, zfec's whole encode of a few small symbols less (measured: k 3, m 2, 101 bytes
#: 5.4 µs against 2.8; k 255, m 1, 100 bytes 38 against 48).
_ISAL_MIN_WORK: Final = 16 * 1024

_Pointers = ctypes.c_void_p
_K = TypeVar("_K")
_V = TypeVar("_V")


def bounded_get(
    cache: OrderedDict[_K, _V], key: _K, make: Callable[[], _V], limit: int = _CACHE
) -> _V:
    """``cache[key]``, made by ``make`` on a miss; beyond ``limit`` entries the oldest goes
    (the coders and tables of a few block shapes are reused; hostile shapes cannot grow it)."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
        if len(cache) > limit:
            cache.popitem(last=False)
    return value


class _Isal:
    """The two ISA-L functions we call, bound once."""

    def __init__(self, lib: ctypes.CDLL, name: str) -> None:
        self.name = name
        init = lib.ec_init_tables
        init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]
        init.restype = None
        encode = lib.ec_encode_data
        encode.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3
        encode.restype = None
        self.init_tables = init
        self.encode_data = encode


def _load_isal() -> _Isal | None:
    for name in ISAL_LIBRARIES:
        try:
            lib = ctypes.CDLL(name)
            return _Isal(lib, name)
        except (OSError, AttributeError):  # not installed / an old build without the EC API
            continue
    return None


def zfec_rows(k: int, m: int) -> bytes:
    """zfec's repair coefficients for (k, m): ``m`` rows of ``k`` bytes, row-major.

    Encoding the identity (source ``i`` is ``k`` zero bytes with a 1 at byte ``i``) makes byte
    column ``i`` of every repair the coefficient of source ``i``.
    """
    identity = tuple(bytes(i) + b"\x01" + bytes(k - 1 - i) for i in range(k))
    repairs = zfec.Encoder(k, k + m).encode(identity, tuple(range(k, k + m)))
    return b"".join(bytes(r) for r in repairs)


class RepairEncoder:
    """Repair symbols of a block, byte for byte zfec's, by ISA-L when available."""

    def __init__(self, *, accelerate: bool = True) -> None:
        """``accelerate=False`` always uses zfec (tests compare the two)."""
        self._isal = _ISAL if accelerate else None
        self._tables: OrderedDict[tuple[int, int], ctypes.Array[ctypes.c_char]] = OrderedDict()
        self._zfec: OrderedDict[tuple[int, int], zfec.Encoder] = OrderedDict()

    @property
    def accelerated(self) -> bool:
        """True when ISA-L computes the repairs."""
        return self._isal is not None

    def encode(self, block: bytearray, k: int, m: int, size: int, *, room: int = 0) -> bytearray:
        """The ``m`` repair symbols of ``k`` source symbols of ``size`` bytes each, laid out
        back to back in ``block`` (``len(block) == k * size``).

        Returns one buffer of ``m * (room + size)`` bytes: repair ``j`` at offset
        ``j * (room + size) + room``, each after ``room`` zero bytes the caller may fill (the
        repair's own header), so a repair's plaintext is one slice, never a concatenation.
        ``block`` is a bytearray so ISA-L can read it in place (``from_buffer`` wants a writable
        buffer; nothing is written to it).
        """
        if len(block) != k * size or not (k >= 1 and m >= 1 and k + m <= 256 and size >= 1):
            raise ValueError(f"block of {len(block)} bytes for k={k} m={m} size={size}")
        if room < 0:
            raise ValueError(f"room {room}")
        isal = self._isal
        if isal is None or k * m * size < _ISAL_MIN_WORK:
            return self._zfec_encode(block, k, m, size, room)
        return self._isal_encode(isal, block, k, m, size, room)

    def _zfec_encode(self, block: bytearray, k: int, m: int, size: int, room: int) -> bytearray:
        view = memoryview(block)
        symbols = tuple(view[i * size : (i + 1) * size] for i in range(k))
        repairs = self._zfec_encoder(k, m).encode(symbols, tuple(range(k, k + m)))
        if not room:
            return bytearray().join(repairs)
        pad = bytes(room)
        return bytearray().join(part for r in repairs for part in (pad, r))

    def _isal_encode(  # noqa: PLR0917  private
        self, isal: _Isal, block: bytearray, k: int, m: int, size: int, room: int
    ) -> bytearray:
        stride = room + size
        out = bytearray(m * stride)
        base = ctypes.addressof(ctypes.c_char.from_buffer(block))
        first = ctypes.addressof(ctypes.c_char.from_buffer(out)) + room
        sources = (_Pointers * k)(*range(base, base + k * size, size))
        targets = (_Pointers * m)(*range(first, first + m * stride, stride))
        isal.encode_data(size, k, m, self._isal_tables(isal, k, m), sources, targets)
        return out

    def _isal_tables(self, isal: _Isal, k: int, m: int) -> ctypes.Array[ctypes.c_char]:
        def expand() -> ctypes.Array[ctypes.c_char]:
            tables = ctypes.create_string_buffer(32 * k * m)
            isal.init_tables(k, m, zfec_rows(k, m), tables)
            return tables

        return bounded_get(self._tables, (k, m), expand)

    def _zfec_encoder(self, k: int, m: int) -> zfec.Encoder:
        return bounded_get(self._zfec, (k, m), lambda: zfec.Encoder(k, k + m))


def _self_test(isal: _Isal) -> bool:
    """ISA-L's bytes equal zfec's on an irregular block: an odd symbol size (the SIMD kernels'
    tail), 7 rows (ISA-L's 6-row and 1-row kernels both run)."""
    k, m, size = 11, 7, 227
    block = bytearray((i * 131 + 7) % 251 for i in range(k * size))
    coder = RepairEncoder(accelerate=False)
    for room in (0, 21):
        if coder._isal_encode(isal, block, k, m, size, room) != coder._zfec_encode(
            block, k, m, size, room
        ):
            return False
    return True


_ISAL: _Isal | None = None
_found = _load_isal()
if _found is not None:
    if _self_test(_found):
        _ISAL = _found
    else:  # pragma: no cover  a library for another field: zfec's bytes are the protocol
        logger.warning("%s does not reproduce zfec's repairs; FEC encodes with zfec", _found.name)

ACCELERATION: Final = f"isa-l ({_ISAL.name})" if _ISAL is not None else "none (zfec)"
"""Which arithmetic encodes repairs: ``isa-l (libisal.so.2)`` or ``none (zfec)``."""
