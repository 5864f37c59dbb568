"""Codec benchmark: wire v1 encode and decode on one core, beside same-run baselines.

Records of 200-byte values and 50-byte keys, 1472-byte datagrams, no compression, gzip and zstd
(level 1 each). Baselines over the same data: AES-256-GCM alone (one call per datagram-sized
chunk) and fastavro alone writing and reading a plain array of records (the row layout) in
batches of the same size as ours.
Prints a table, then one JSON object as the last line. ``--profile`` adds a cProfile excerpt.

Every figure is the best of ``--repeat`` runs, both per wall-clock second (``*_records_per_s``)
and per CPU-second of this process (``*_cpu_records_per_s``): on a shared, loaded machine the CPU
figure is the one that estimates "one core". Decode is measured to the events (``RecordBatch``
with its columnar ``groups``, what the receiver reads) and, separately, with every ``Record``
object built (``decode_records_*``). ``--tree DIR`` imports ``common`` from another checkout
(for example a ``git worktree`` of an older commit) so before and after run the same bench.

    .venv/bin/python bench/codec.py [--records 50000] [--repeat 3] [--round-robin] [--profile]
        [--tree DIR] [--interleave DIR [--rounds 20]]

``--interleave DIR`` is the steadier before/after comparison on a machine whose single-core
speed drifts between runs: it copies ``DIR/common`` to a temporary package ``common_before``
(imports rewritten), then alternates rounds of before, after and the fastavro baseline in this
one process (gzip off, ``--records`` per round) and reports the best round of each and the
median of the per-round after/before and after/fastavro ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --tree=DIR must act before the imports below
sys.path.insert(
    0,
    next(
        (a.split("=", 1)[1] for a in sys.argv if a.startswith("--tree=")),
        str(Path(__file__).resolve().parents[1]),
    ),
)

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fastavro import parse_schema, schemaless_reader, schemaless_writer

import common.wire as wire_after
from common.wire import Decoder, Encoder, Key, KeyRing, RecordBatch, WireConfig
from common.wire.config import COMPRESSIONS, fragment_capacity

#: Envelope bytes of the fragment index (docs/protocol.md §3): 0 starts a message.
_FRAGMENT_INDEX = 36

ROW_SCHEMA = parse_schema(
    {
        "type": "array",
        "items": {
            "type": "record",
            "name": "Row",
            "fields": [
                {"name": "topic", "type": "string"},
                {"name": "partition", "type": "int"},
                {"name": "offset", "type": "long"},
                {"name": "timestamp", "type": "long"},
                {"name": "timestamp_type", "type": "int"},
                {"name": "key", "type": ["null", "bytes"]},
                {"name": "value", "type": ["null", "bytes"]},
                {
                    "name": "headers",
                    "type": {
                        "type": "array",
                        "items": {
                            "type": "record",
                            "name": "H",
                            "fields": [
                                {"name": "key", "type": "string"},
                                {"name": "value", "type": ["null", "bytes"]},
                            ],
                        },
                    },
                },
            ],
        },
    }
)


def make_records(
    n: int, *, round_robin: bool = False, vary: bool = False, value_bytes: int = 200
) -> list[tuple]:
    """``n`` records of ``value_bytes``; ``vary``: values of 150-250 bytes (200 on average) and
    three records per millisecond, so neither the equal-length column reads nor consecutive
    timestamps apply."""
    rnd = random.Random(42)
    words = [b"click", b"view", b"purchase", b"login", b"logout", b"search"]
    out = []
    for i in range(n):
        value = b'{"id":%d,"user":"u%05d","event":"%s","amount":%d,"note":"' % (
            i,
            rnd.randrange(100000),
            rnd.choice(words),
            rnd.randrange(10**6),
        )
        value += rnd.randbytes(40).hex().encode()
        size = rnd.randint(150, 250) if vary else value_bytes
        value = (value + b" " * size)[: size - 1] + b"}"
        key = (b"customer-%041d" % rnd.randrange(10**12))[:50]
        # a consumer hands out runs of one partition; --round-robin interleaves 4 partitions
        p = i % 4 if round_robin else (i // 1000) % 4
        ts = 1_700_000_000_000 + (i // 3 if vary else i)
        out.append(("events", p, i, ts, 1, key, value, ()))
    return out


def bench_encode(
    config: WireConfig, ring: KeyRing, records: list[tuple]
) -> tuple[float, float, list]:
    enc = Encoder(config, ring, session_id=os.urandom(16))
    add = enc.add
    out: list = []
    c0, t0 = time.process_time(), time.perf_counter()
    for topic, p, o, ts, tt, k, v, h in records:
        r = add(topic, p, o, ts, tt, k, v, h, 0.0)
        if r:
            out += r
    out += enc.flush()
    return time.perf_counter() - t0, time.process_time() - c0, out


def gro_reads(datagrams: list[bytes]) -> list[tuple[bytes, int]]:
    """The datagrams as the receiver reads them with ``udp_gro``: a fragmented message's
    datagrams joined into one read (its segment size: the first one's), others alone."""
    reads: list[tuple[bytes, int]] = []
    message: list[bytes] = []
    for d in datagrams:
        if not (d[_FRAGMENT_INDEX] | d[_FRAGMENT_INDEX + 1]) and message:
            reads.append((b"".join(message), len(message[0])))
            message = []
        message.append(d)
    if message:
        reads.append((b"".join(message), len(message[0])))
    return reads


def decode_reads(decoder: Any, reads: list[tuple[bytes, int]]) -> None:
    """Feed ``reads`` (``gro_reads``) to ``decoder`` as the receiver does: a read of several
    datagrams to ``receive_coalesced``, one by one where it takes nothing (a session's first
    message, before the session is known)."""
    receive, coalesced = decoder.receive_datagram, decoder.receive_coalesced
    for data, segment in reads:
        if len(data) == segment or not coalesced(data, 0, segment, 0.0):
            for at in range(0, len(data), segment):
                receive(data[at : at + segment], 0.0)


def bench_decode(
    config: WireConfig, ring: KeyRing, datagrams: list[bytes], *, records: bool = False
) -> tuple[float, float, int]:
    """Decode to events; with ``records`` also build every Record (what ``.records`` costs)."""
    dec = Decoder(config, ring)
    next_event = dec.next_event
    columnar = hasattr(RecordBatch, "groups") and not records
    reads = gro_reads(datagrams)
    n = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for read in reads:
        decode_reads(dec, [read])
        while (ev := next_event()) is not None:
            if type(ev) is RecordBatch:
                n += ev.count if columnar else len(ev.records)
    return time.perf_counter() - t0, time.process_time() - c0, n


def best(fn, repeat: int):
    """Best wall time and best CPU time over ``repeat`` runs, and the last run's result."""
    results = [fn() for _ in range(repeat)]
    return min(r[0] for r in results), min(r[1] for r in results), results[-1][2]


def import_before(tree: str):
    """``DIR/common`` imported as the package ``common_before`` (its imports rewritten)."""
    tmp = Path(tempfile.mkdtemp(prefix="codec_before_"))
    shutil.copytree(Path(tree) / "common", tmp / "common_before")
    for path in (tmp / "common_before").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\bcommon([.\s])", r"common_before\1", text), encoding="utf-8")
    sys.path.insert(0, str(tmp))
    import common_before.wire as wire_before  # noqa: PLC0415

    return wire_before


def interleave(tree: str, records: list[tuple], rounds: int) -> dict:
    """Alternate before/after/fastavro rounds in one process; gzip off."""
    wire_before = import_before(tree)
    material = os.urandom(32)
    impls = {}
    for name, w in (("before", wire_before), ("after", wire_after)):
        ring = w.KeyRing([w.Key.from_material(material)])
        impls[name] = (w, w.WireConfig(max_datagram_size=1472), ring)
    rows_in = [
        {"topic": t, "partition": p, "offset": o, "timestamp": ts, "timestamp_type": tt,
         "key": k, "value": v, "headers": []}
        for t, p, o, ts, tt, k, v, _ in records
    ]  # fmt: skip
    batches = [rows_in[i : i + 5] for i in range(0, len(rows_in), 5)]
    n = len(records)
    res: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, (w, config, ring) in impls.items():
            enc = w.Encoder(config, ring, session_id=os.urandom(16))
            add = enc.add
            out: list = []
            c0 = time.process_time()
            for topic, p, o, ts, tt, k, v, h in records:
                r = add(topic, p, o, ts, tt, k, v, h, 0.0)
                if r:
                    out += r
            out += enc.flush()
            res.setdefault(f"{name}_encode", []).append(n / (time.process_time() - c0))
            reads = gro_reads([d.data for d in out])
            dec = w.Decoder(config, ring)
            next_event, batch_type = dec.next_event, w.RecordBatch
            got = 0
            c0 = time.process_time()
            for read in reads:
                decode_reads(dec, [read])
                while (ev := next_event()) is not None:
                    if type(ev) is batch_type:
                        got += ev.count
            res.setdefault(f"{name}_decode", []).append(n / (time.process_time() - c0))
            assert got == n, (name, got, n)
        c0 = time.process_time()
        encoded = []
        for b in batches:
            buf = io.BytesIO()
            schemaless_writer(buf, ROW_SCHEMA, b)
            encoded.append(buf.getvalue())
        res.setdefault("fastavro_write", []).append(n / (time.process_time() - c0))
        c0 = time.process_time()
        for e in encoded:
            schemaless_reader(io.BytesIO(e), ROW_SCHEMA, None)
        res.setdefault("fastavro_read", []).append(n / (time.process_time() - c0))
    out_json: dict = {f"{k}_best_cpu_records_per_s": round(max(v)) for k, v in res.items()}
    for k, v in res.items():
        out_json[f"{k}_median_cpu_records_per_s"] = round(statistics.median(v))
    for what, base in (("encode", "fastavro_write"), ("decode", "fastavro_read")):
        after = res[f"after_{what}"]
        out_json[f"{what}_after_over_before_median"] = round(
            statistics.median(a / b for a, b in zip(after, res[f"before_{what}"], strict=True)), 2
        )
        out_json[f"{what}_after_over_fastavro_median"] = round(
            statistics.median(a / b for a, b in zip(after, res[base], strict=True)), 2
        )
    return out_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--round-robin", action="store_true", help="interleave 4 partitions record by record"
    )
    ap.add_argument(
        "--vary", action="store_true", help="values of 150-250 bytes, 3 records per millisecond"
    )
    ap.add_argument(
        "--value-bytes", type=int, default=200,
        help="value size; above a datagram, each message is decoded as one GRO read",
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--tree", help="import common from this checkout (--tree=DIR)")
    ap.add_argument("--interleave", metavar="DIR", help="alternate rounds against DIR/common")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    records = make_records(
        args.records, round_robin=args.round_robin, vary=args.vary, value_bytes=args.value_bytes
    )
    if args.interleave:
        load = os.getloadavg()[0]
        figures = interleave(args.interleave, records, args.rounds)
        summary = {
            "bench": "codec_interleave", "records_per_round": args.records,
            "rounds": args.rounds, "vary": args.vary, "value_bytes": args.value_bytes,
            "before": args.interleave,
            "load_avg_1m_start": round(load, 2), "load_avg_1m_end": round(os.getloadavg()[0], 2),
            **figures,
        }  # fmt: skip
        for k, v in summary.items():
            print(f"{k:<42}{v}")
        print(json.dumps(summary))
        return 0
    payload_mb = sum(len(r[5]) + len(r[6]) for r in records) / 1e6
    ring = KeyRing([Key.generate()])
    result: dict = {
        "bench": "codec",
        "records": args.records,
        "value_bytes": args.value_bytes,
        "key_bytes": 50,
        "datagram_bytes": 1472,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "round_robin": args.round_robin,
        "vary": args.vary,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "tree": args.tree or "this checkout",
    }
    rows = []
    # zstd only where the imported tree has it (--tree may point at an older checkout)
    for comp in [c for c in ("none", "gzip", "zstd") if c in COMPRESSIONS]:
        config = WireConfig(max_datagram_size=1472, compression=comp)
        secs, cpu, out = best(lambda c=config: bench_encode(c, ring, records), args.repeat)
        datagrams = [d.data for d in out]
        dsecs, dcpu, n = best(lambda c=config, d=datagrams: bench_decode(c, ring, d), args.repeat)
        assert n == args.records, (n, args.records)
        rsecs, rcpu, n = best(
            lambda c=config, d=datagrams: bench_decode(c, ring, d, records=True), args.repeat
        )
        assert n == args.records, (n, args.records)
        result[f"encode_{comp}_records_per_s"] = round(args.records / secs)
        result[f"encode_{comp}_cpu_records_per_s"] = round(args.records / cpu)
        result[f"encode_{comp}_mb_per_s"] = round(payload_mb / secs, 1)
        result[f"decode_{comp}_records_per_s"] = round(args.records / dsecs)
        result[f"decode_{comp}_cpu_records_per_s"] = round(args.records / dcpu)
        result[f"decode_{comp}_mb_per_s"] = round(payload_mb / dsecs, 1)
        result[f"decode_records_{comp}_records_per_s"] = round(args.records / rsecs)
        result[f"decode_records_{comp}_cpu_records_per_s"] = round(args.records / rcpu)
        result[f"{comp}_datagrams"] = len(datagrams)
        result[f"{comp}_records_per_datagram"] = round(args.records / len(datagrams), 2)
        result[f"{comp}_wire_mb"] = round(sum(map(len, datagrams)) / 1e6, 2)
        rows.append((comp, args.records / cpu, args.records / dcpu, args.records / rcpu))
        if comp == "none":
            per_datagram = args.records / len(datagrams)

    # baseline 1: AES-256-GCM alone over the same bytes, one call per datagram-sized chunk
    cap = fragment_capacity(1472)
    blob = b"".join(r[5] + r[6] for r in records)
    chunks = [blob[i : i + cap] for i in range(0, len(blob), cap)]
    aead = AESGCM(os.urandom(32))
    aad = b"\x00" * 44

    def aes() -> tuple[float, float, None]:
        c0, t0 = time.process_time(), time.perf_counter()
        for i, c in enumerate(chunks):
            aead.encrypt(i.to_bytes(12, "big"), c, aad)
        return time.perf_counter() - t0, time.process_time() - c0, None

    secs, cpu, _ = best(aes, args.repeat)
    result["baseline_aes_gcm_mb_per_s"] = round(len(blob) / 1e6 / secs, 1)
    result["baseline_aes_gcm_records_per_s"] = round(args.records / secs)
    result["baseline_aes_gcm_cpu_records_per_s"] = round(args.records / cpu)

    # baseline 2: fastavro alone, plain array of records, batches of our records per datagram
    size = max(1, round(per_datagram))
    rows_in = [
        {
            "topic": t,
            "partition": p,
            "offset": o,
            "timestamp": ts,
            "timestamp_type": tt,
            "key": k,
            "value": v,
            "headers": [],
        }
        for t, p, o, ts, tt, k, v, _ in records
    ]
    batches = [rows_in[i : i + size] for i in range(0, len(rows_in), size)]

    def avro_write() -> tuple[float, float, list[bytes]]:
        out = []
        c0, t0 = time.process_time(), time.perf_counter()
        for b in batches:
            buf = io.BytesIO()
            schemaless_writer(buf, ROW_SCHEMA, b)
            out.append(buf.getvalue())
        return time.perf_counter() - t0, time.process_time() - c0, out

    def avro_read(encoded: list[bytes]) -> tuple[float, float, None]:
        c0, t0 = time.process_time(), time.perf_counter()
        for e in encoded:
            schemaless_reader(io.BytesIO(e), ROW_SCHEMA, None)
        return time.perf_counter() - t0, time.process_time() - c0, None

    wsecs, wcpu, encoded = best(avro_write, args.repeat)
    rsecs, rcpu, _ = best(lambda: avro_read(encoded), args.repeat)
    result["baseline_fastavro_rows_batch_size"] = size
    result["baseline_fastavro_write_records_per_s"] = round(args.records / wsecs)
    result["baseline_fastavro_read_records_per_s"] = round(args.records / rsecs)
    result["baseline_fastavro_write_cpu_records_per_s"] = round(args.records / wcpu)
    result["baseline_fastavro_read_cpu_records_per_s"] = round(args.records / rcpu)

    print("records per CPU-second (best of --repeat); wall-clock figures are in the JSON")
    print(f"{'compression':<12}{'encode':>12}{'decode':>12}{'decode+Records':>16}")
    for comp, e, d, dr in rows:
        print(f"{comp:<12}{e:>12,.0f}{d:>12,.0f}{dr:>16,.0f}")
    print(f"baseline AES-GCM alone: {result['baseline_aes_gcm_mb_per_s']} MB/s")
    print(
        f"baseline fastavro rows ({size}/batch): write "
        f"{result['baseline_fastavro_write_cpu_records_per_s']:,} rec/CPU-s, read "
        f"{result['baseline_fastavro_read_cpu_records_per_s']:,} rec/CPU-s"
    )
    if args.profile:
        # CPU-time timer: with the default wall clock, time the process spends descheduled on a
        # loaded machine lands on whichever function happened to be running.
        config = WireConfig(max_datagram_size=1472)
        for what in ("encode", "decode"):
            prof = cProfile.Profile(time.process_time)
            if what == "encode":
                prof.enable()
                _, _, out = bench_encode(config, ring, records)
            else:
                datagrams = [d.data for d in out]
                prof.enable()
                bench_decode(config, ring, datagrams)
            prof.disable()
            print(f"--- profile: {what}, gzip off")
            pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
