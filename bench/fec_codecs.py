"""Compare the two erasure-code libraries the FEC design could use, at our block sizes.

For each (k, overhead) a block of k random symbols of SYMBOL bytes (a padded datagram) is
encoded into ceil(k * overhead) repair symbols, then decoded with the first ceil(k * overhead)
source symbols missing (the worst case the block still survives). Reports MB/s of source data
through encode and decode, per library, measured back to back in one run. Last line: one JSON.

    .venv/bin/python bench/fec_codecs.py [--symbol 1400] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable

import raptorq
import zfec


def _rate(fn: Callable[[], object], data_bytes: int, seconds: float) -> float:
    fn()  # warm
    n = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        n += 1
    return n * data_bytes / elapsed / 1e6


def bench_zfec(k: int, m: int, symbols: list[bytes], seconds: float) -> tuple[float, float]:
    enc = zfec.Encoder(k, k + m)
    wanted = tuple(range(k, k + m))
    src = tuple(symbols)
    repairs = enc.encode(src, wanted)
    lost = min(m, k)
    dec = zfec.Decoder(k, k + m)
    have = tuple(symbols[lost:]) + tuple(repairs[:lost])
    nums = tuple(range(lost, k)) + tuple(range(k, k + lost))
    out = dec.decode(have, nums)
    assert list(out) == symbols
    size = k * len(symbols[0])
    return (
        _rate(lambda: enc.encode(src, wanted), size, seconds),
        _rate(lambda: dec.decode(have, nums), size, seconds),
    )


def bench_raptorq(k: int, m: int, symbols: list[bytes], seconds: float) -> tuple[float, float]:
    size = len(symbols[0])
    data = b"".join(symbols)
    mtu = size + 4  # 4-byte payload id per packet; symbol size = mtu - 4 with the defaults

    def encode() -> list[bytes]:
        return list(raptorq.Encoder.with_defaults(data, mtu).get_encoded_packets(m))

    packets = encode()
    lost = min(m, k)
    have = packets[lost:]

    def decode() -> bytes | None:
        dec = raptorq.Decoder.with_defaults(len(data), mtu)
        for p in have:
            out = dec.decode(bytes(p))
            if out is not None:
                return bytes(out)
        return None

    assert decode() == data
    return _rate(encode, len(data), seconds), _rate(decode, len(data), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--symbol", type=int, default=1400)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    rows = []
    for k in (8, 32, 64):
        for overhead in (0.1, 0.2, 0.5):
            m = max(1, math.ceil(k * overhead))
            symbols = [os.urandom(args.symbol) for _ in range(k)]
            z_enc, z_dec = bench_zfec(k, m, symbols, args.seconds)
            r_enc, r_dec = bench_raptorq(k, m, symbols, args.seconds)
            row = {
                "k": k,
                "m": m,
                "zfec_encode_mb_s": round(z_enc, 1),
                "zfec_decode_mb_s": round(z_dec, 1),
                "raptorq_encode_mb_s": round(r_enc, 1),
                "raptorq_decode_mb_s": round(r_dec, 1),
            }
            rows.append(row)
            print(
                f"k={k:3d} m={m:3d}  zfec enc {z_enc:8.1f} dec {z_dec:8.1f} MB/s   "
                f"raptorq enc {r_enc:8.1f} dec {r_dec:8.1f} MB/s"
            )
    print(json.dumps({"bench": "fec_codecs", "symbol": args.symbol, "rows": rows}))


if __name__ == "__main__":
    main()
