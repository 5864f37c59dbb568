"""Public-key mode against shared-key mode: the data path and the announcement overhead, one run.

Same records (200-byte values, 50-byte keys), same 1452-byte datagrams, same process: rounds
alternate shared-key (a key-ring ``Encoder`` / ``Decoder``) and public-key (the ``Encoder`` on a
``KeyAnnouncer``'s ring, a ``PublicKeyDecoder`` that learned the key from a real announcement),
so load drifts hit both alike. Reported per mode: datagrams/s and CPU-µs per record to encode and
to decode (CPU of this process), best round; and the median per-round public/shared ratio.
Announcement overhead: CPU to make one (seal + sign), to verify a new one (signature + HPKE open),
to take a byte-identical repeat, and the link share of repeats at the default interval. The
last line is one JSON object.

    .venv/bin/python bench/pubkey_mode.py [--records 60000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.wire import Decoder, Encoder, Key, KeyRing, RecordBatch, WireConfig
from common.wire.announce import (
    AnnounceConfig,
    AnnouncementVerifier,
    KeyAnnouncer,
)
from common.wire.pubkey import (
    RECEIVER,
    PublicKey,
    ReceiverKeyPair,
    ReceiverKeys,
    SigningKey,
    TrustedKeys,
)
from common.wire.pubkey_decoder import PublicKeyDecoder

CONFIG = WireConfig()
SESSION = os.urandom(16)
WALL_MS = 1_700_000_000_000


def records(n: int) -> list[tuple[str, int, int, int, int, bytes, bytes, tuple[()]]]:
    value, key = os.urandom(200), os.urandom(50)
    return [("orders", i % 4, i // 4, WALL_MS + i, 1, key, value, ()) for i in range(n)]


def encode(ring: KeyRing, recs: list, session: bytes) -> tuple[list[bytes], float]:  # type: ignore[type-arg]
    enc = Encoder(CONFIG, ring, session_id=session)
    out: list[bytes] = []
    start = time.process_time()
    for r in recs:
        for d in enc.add(*r, 0.0):
            out.append(d.data)
    out += [d.data for d in enc.flush()]
    return out, time.process_time() - start


def decode(dec: Decoder, datagrams: list[bytes]) -> tuple[int, float]:
    count = 0
    start = time.process_time()
    for data in datagrams:
        dec.receive_datagram(data, 1.0)
        while (event := dec.next_event()) is not None:
            if type(event) is RecordBatch:
                count += event.count
    return count, time.process_time() - start


def timed(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    pair = ReceiverKeyPair.generate()
    signer = SigningKey.generate(name="bench")
    receiver_pub = PublicKey(RECEIVER, pair.public, pair.fingerprint)
    verifier = AnnouncementVerifier(ReceiverKeys([pair]), TrustedKeys([signer.public_entry()]))
    recs = records(args.records)
    shared_ring = KeyRing([Key.generate()])
    results: dict[str, dict[str, list[float]]] = {
        mode: {"enc_us": [], "dec_us": [], "enc_dps": [], "dec_dps": []}
        for mode in ("shared", "pubkey")
    }
    ratios: dict[str, list[float]] = {"enc": [], "dec": []}
    for _ in range(args.rounds):
        per_round = {}
        for mode in ("shared", "pubkey"):
            # a fresh session per run: a verifier refuses a second epoch-0 key for one session
            session = os.urandom(16)
            if mode == "shared":
                ring = shared_ring
                dec: Decoder = Decoder(CONFIG, shared_ring)
            else:
                announcer = KeyAnnouncer(AnnounceConfig(), signer, receiver_pub, session_id=session)
                first = announcer.start(0.0, WALL_MS)
                ring = announcer.keyring
                pk = PublicKeyDecoder(CONFIG, verifier)
                pk.sync_clock(WALL_MS, 0.0)
                pk.receive_datagram(first[0].data, 0.0)
                dec = pk
            datagrams, enc_cpu = encode(ring, recs, session)
            count, dec_cpu = decode(dec, datagrams)
            assert count == len(recs), (mode, count)
            r = results[mode]
            r["enc_us"].append(enc_cpu / len(recs) * 1e6)
            r["dec_us"].append(dec_cpu / len(recs) * 1e6)
            r["enc_dps"].append(len(datagrams) / enc_cpu)
            r["dec_dps"].append(len(datagrams) / dec_cpu)
            per_round[mode] = (enc_cpu, dec_cpu)
        ratios["enc"].append(per_round["pubkey"][0] / per_round["shared"][0])
        ratios["dec"].append(per_round["pubkey"][1] / per_round["shared"][1])
    announcer = KeyAnnouncer(AnnounceConfig(), signer, receiver_pub, session_id=SESSION)
    announcer.start(0.0, WALL_MS)
    make_us = timed(lambda: announcer._make(1, WALL_MS), 200)
    fresh = [announcer._make(2 + i, WALL_MS).datagram.data for i in range(200)]
    it = iter(fresh)
    verify_us = timed(lambda: verifier.verify(next(it), WALL_MS), 200)
    pk = PublicKeyDecoder(CONFIG, verifier)
    pk.sync_clock(WALL_MS, 0.0)
    pk.receive_datagram(fresh[-1], 0.0)
    repeat_us = timed(lambda: pk.receive_datagram(fresh[-1], 0.0), 20_000)
    size = len(fresh[0])
    summary = {
        "bench": "pubkey",
        "records": args.records,
        "rounds": args.rounds,
        "datagram_size": CONFIG.max_datagram_size,
        "datagrams_per_round": len(encode(shared_ring, recs, SESSION)[0]),
        **{
            f"{mode}_{name}": round(min(vals) if name.endswith("us") else max(vals), 3)
            for mode, r in results.items()
            for name, vals in r.items()
        },
        "pubkey_over_shared_encode_cpu_median": round(statistics.median(ratios["enc"]), 4),
        "pubkey_over_shared_decode_cpu_median": round(statistics.median(ratios["dec"]), 4),
        "announce_make_us": round(make_us, 1),
        "announce_verify_us": round(verify_us, 1),
        "announce_repeat_us": round(repeat_us, 3),
        "announce_bytes": size,
        "announce_bytes_per_s_default": size / AnnounceConfig().announce_interval,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    for key, value in summary.items():
        print(f"{key:42s} {value}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
