"""FEC benchmark: failed blocks per million source datagrams, measured at volume beside the
arithmetic (common/wire/fec_odds.py), and the cost of FEC.

Part 1, blocks (sampled, pure): for each FEC setting (block size k, interleave D, overhead P) and
loss model, at least ``--datagrams`` source datagrams (1,000,000 by default, whole interleave
rounds) are laid out exactly as ``FecEncoder`` sends them (D blocks dealt round-robin, then their
m repairs interleaved), and the relay's own impairment engine (``netem.impair.Impairer``, seeded,
one decision per datagram in send order) decides which are lost. A block fails when it loses
more than m. This samples the loss process, not the codec: Reed-Solomon is MDS, so "more than m
lost" is exactly when the decoder fails (part 2 checks that with the real code). Reported: failed
blocks per million source datagrams, measured and analytic (binomial tail for random loss, the
exact Gilbert-Elliott model for bursts), and the 95 % upper bound when none failed (3 / blocks).

Part 2, codec (the real thing, fewer cases): the wire ``Encoder`` (AES-256-GCM, one 700-byte
record per datagram, so a source datagram is a record), ``FecEncoder``, the relay's ``Impairer``,
and the receiver's glue (``Decoder`` + ``FecDecoder``, as in receiver/app.py), at least
``--codec-datagrams`` source datagrams per case, streamed (nothing kept), one case per process on
both cores. Failed blocks are the blocks holding a record that was not delivered.

Loss models: ``random`` (netem ``loss X%``) and ``bursty`` (Gilbert-Elliott, netem ``loss gemodel``,
bad state always loses, mean burst 5 datagrams: r = 20 %, p = r X / (100 - X) for mean loss X).

Part 3, cost (same run): CPU seconds per million records of the sender's wire path (encode +
FEC) and of the receiver's decode path (no loss, and 5 % random loss so blocks are rebuilt), FEC
off / 20 % with the old default blocks (32, interleave 1) / 20 % and 10 % with the defaults,
cases interleaved in each of ``--repeat`` rounds, best kept. 200-byte values: the packing step
(sources shorter by the repair reserve) is part of the cost.

    .venv/bin/python bench/fec_loss.py [--datagrams 1000000] [--codec-datagrams 1000000]
        [--seed 7] [--repeat 3] [--jobs 2]

Prints tables, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.wire import Decoder, Encoder, Key, KeyRing, RecordBatch, WireConfig
from common.wire.fec import FecConfig, FecDecoder, FecEncoder, FecLimits, is_repair
from common.wire.fec_odds import (
    GilbertElliott,
    failed_per_million_burst,
    failed_per_million_random,
    repairs_for,
)
from netem.impair import Impairer
from netem.profile import Profile

SESSION = bytes(range(16))
DATAGRAM = 1452
MEAN_BURST = 5.0
DEFAULT_K = FecConfig(overhead=20).block_size
DEFAULT_D = FecConfig(overhead=20).interleave


@dataclass(frozen=True)
class Setting:
    """One FEC setting of the tables."""

    k: int
    interleave: int
    overhead: float

    @property
    def m(self) -> int:
        return repairs_for(self.k, self.overhead)

    @property
    def name(self) -> str:
        default = " (default)" if (self.k, self.interleave) == (DEFAULT_K, DEFAULT_D) else ""
        return f"{self.k}+{self.m}, D {self.interleave}, {self.overhead:g} %{default}"


SETTINGS = (
    Setting(32, 1, 20),  # the old default
    Setting(64, 1, 20),
    Setting(128, 1, 20),
    Setting(160, 1, 20),
    Setting(32, 4, 20),
    Setting(64, 4, 20),
    Setting(128, 4, 20),
    Setting(DEFAULT_K, DEFAULT_D, 20),
    Setting(DEFAULT_K, DEFAULT_D, 10),
    Setting(DEFAULT_K, DEFAULT_D, 50),
)
LOSSES = (("random", 1.0), ("random", 2.0), ("random", 5.0), ("random", 10.0))
LOSSES += (("bursty", 1.0), ("bursty", 2.0), ("bursty", 5.0))
CODEC_CASES = (
    (Setting(32, 1, 20), "random", 5.0),
    (Setting(DEFAULT_K, DEFAULT_D, 20), "random", 5.0),
    (Setting(32, 1, 20), "bursty", 2.0),
    (Setting(DEFAULT_K, DEFAULT_D, 20), "bursty", 2.0),
)


def profile(model: str, loss: float) -> Profile:
    if loss == 0:
        return Profile()
    if model == "random":
        return Profile(loss=loss)
    r = 100.0 / MEAN_BURST
    return Profile(ge_p=r * loss / (100.0 - loss), ge_r=r)


def analytic(setting: Setting, model: str, loss: float) -> float:
    """Failed blocks per million source datagrams, full blocks (common/wire/fec_odds.py)."""
    if model == "random":
        return failed_per_million_random(setting.k, setting.overhead, loss / 100)
    chain = GilbertElliott.from_loss(loss / 100, MEAN_BURST)
    return failed_per_million_burst(
        setting.k, setting.overhead, chain, interleave=setting.interleave
    )


# -- part 1: sampled blocks ------------------------------------------------------------------


def sample_blocks(setting: Setting, model: str, loss: float, datagrams: int, seed: int) -> dict:
    """Failed blocks of whole interleave rounds covering ``datagrams`` source datagrams."""
    k, d, m = setting.k, setting.interleave, setting.m
    impairer = Impairer(profile(model, loss), seed)
    stats = impairer.stats
    submit = impairer.submit
    rounds = -(-datagrams // (k * d))
    per_round = (k + m) * d
    failed = 0
    for _ in range(rounds):
        lost_per_block = [0] * d
        before = stats.dropped_loss
        for position in range(per_round):
            submit(b"", 0.0)
            if stats.dropped_loss != before:
                before = stats.dropped_loss
                # send order: sources dealt round-robin, then the repairs interleaved alike, so
                # position p belongs to block p mod D (k D sources, then m D repairs)
                lost_per_block[position % d] += 1
        impairer.due(0.0)  # empties the queue of what survived (its content is not needed)
        failed += sum(lost > m for lost in lost_per_block)
    sources = rounds * k * d
    return {
        "setting": setting.name,
        "model": model,
        "loss_pct": loss,
        "source_datagrams": sources,
        "blocks": rounds * d,
        "failed_blocks": failed,
        "failed_per_million": failed * 1e6 / sources,
        "upper95_per_million_if_none": 3.0 * 1e6 / sources,
        "analytic_per_million": analytic(setting, model, loss),
        "link_loss_pct": 100.0 * stats.dropped_loss / max(1, stats.received),
    }


# -- part 2: the real encoder and decoder ----------------------------------------------------


def codec_case(setting: Setting, model: str, loss: float, datagrams: int, seed: int) -> dict:
    """Stream ``datagrams`` one-record source datagrams through the real code (see docstring)."""
    ring = KeyRing([Key.generate()])
    cfg = FecConfig(overhead=setting.overhead, block_size=setting.k, interleave=setting.interleave)
    size = DATAGRAM - cfg.overhead_bytes
    enc = Encoder(WireConfig(max_datagram_size=size), ring, session_id=SESSION)
    fec = FecEncoder(cfg, ring, session_id=SESSION, max_source_size=size)
    impairer = Impairer(profile(model, loss), seed)
    decoder = Decoder(WireConfig(), ring)
    fdec = FecDecoder(FecLimits(), ring)
    value = os.urandom(700)  # two do not fit one source: one record, one datagram
    delivered = bytearray(datagrams + 1)
    sources = 0
    now = 0.0
    t0 = time.process_time()

    def receive(data: bytes) -> None:
        if is_repair(data):
            rebuilt = fdec.receive_repair(data, now)
        else:
            before = decoder.authenticated
            decoder.receive_datagram(data, now)
            rebuilt = fdec.add_source(data, now) if decoder.authenticated != before else []
        for d in rebuilt:
            decoder.receive_datagram(d, now)
        while (event := decoder.next_event()) is not None:
            if type(event) is RecordBatch:
                for record in event.records:
                    delivered[record.offset] = 1

    def send(data: bytes) -> None:
        impairer.submit(data, now)
        for d in impairer.due(now):
            receive(d)

    def put(out: list[Any]) -> None:
        nonlocal sources, now
        for datagram in out:
            sources += 1
            now += 1e-4  # 10,000 datagrams/s: blocks fill long before the latency bound
            send(datagram.data)
            for repair in fec.add(datagram.data, 0, now):
                send(repair)
            if sources % 4096 == 0:
                fdec.handle_timer(now)
                decoder.handle_timer(now)

    for offset in range(datagrams):
        put(enc.add("t", 0, offset, 1_700_000_000_000, 1, None, value, (), now))
    put(enc.flush())
    for _, repair in fec.flush():
        send(repair)
    for d in impairer.flush():
        receive(d)
    now += 10.0
    fdec.handle_timer(now)
    missing = [offset for offset in range(datagrams) if not delivered[offset]]
    # offset i is source i (one record per datagram, nothing else in the session), and a block
    # closes only when full here: source i is in round i // (k D), slot i mod D
    per_round = setting.k * setting.interleave
    failed = {(i // per_round, i % setting.interleave) for i in missing}
    return {
        "setting": setting.name,
        "model": model,
        "loss_pct": loss,
        "source_datagrams": sources,
        "records_lost": len(missing),
        "failed_blocks": len(failed),
        "failed_per_million": len(failed) * 1e6 / sources,
        "analytic_per_million": analytic(setting, model, loss),
        "decoder": {
            "blocks_complete": fdec.blocks_complete,
            "blocks_recovered": fdec.blocks_recovered,
            "blocks_unrecoverable": fdec.blocks_unrecoverable,
            "datagrams_reconstructed": fdec.datagrams_reconstructed,
            "margin_used": list(fdec.margin_used),
        },
        "link_loss_pct": round(100.0 * impairer.stats.dropped_loss / impairer.stats.received, 3),
        "cpu_s": round(time.process_time() - t0, 1),
    }


# -- part 3: cost ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CostCase:
    name: str
    overhead: float = 0.0
    k: int = DEFAULT_K
    interleave: int = DEFAULT_D


COST_CASES = (
    CostCase("off"),
    CostCase("20 % blocks 32, D 1 (old default)", 20, 32, 1),
    CostCase("20 % defaults", 20),
    CostCase("10 % defaults", 10),
)


def build(case: CostCase, records: int, ring: KeyRing) -> list[bytes]:
    """Datagrams in send order for ``records`` 200-byte records (repairs after their round)."""
    cfg = (
        FecConfig(overhead=case.overhead, block_size=case.k, interleave=case.interleave)
        if case.overhead
        else None
    )
    size = DATAGRAM - (cfg.overhead_bytes if cfg else 0)
    enc = Encoder(WireConfig(max_datagram_size=size), ring, session_id=SESSION)
    fec = FecEncoder(cfg, ring, session_id=SESSION, max_source_size=size) if cfg else None
    value = os.urandom(200)
    out: list[bytes] = []

    def put(datagrams: list[Any]) -> None:
        for d in datagrams:
            out.append(d.data)
            if fec is not None:
                out.extend(fec.add(d.data, 0, 0.0))

    for i in range(records):
        put(enc.add("t", i % 6, i, 1_700_000_000_000, 1, b"%016d" % i, value, (), 0.0))
    put(enc.flush())
    if fec is not None:
        out.extend(r for _, r in fec.flush())
    return out


def decode_all(wire: list[bytes], ring: KeyRing) -> int:
    decoder, fdec, records = Decoder(WireConfig(), ring), FecDecoder(FecLimits(), ring), 0
    for data in wire:
        if is_repair(data):
            rebuilt = fdec.receive_repair(data, 0.0)
        else:
            before = decoder.authenticated
            decoder.receive_datagram(data, 0.0)
            rebuilt = fdec.add_source(data, 0.0) if decoder.authenticated != before else []
        for d in rebuilt:
            decoder.receive_datagram(d, 0.0)
        while (event := decoder.next_event()) is not None:
            if type(event) is RecordBatch:
                records += event.count
    return records


def cost(records: int, repeat: int) -> dict[str, Any]:
    """Best of ``repeat`` rounds; each round runs every case back to back (a noisy neighbour
    hurts them alike)."""
    ring = KeyRing([Key.generate()])
    best: dict[str, float] = {}
    datagrams: dict[str, int] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    for _ in range(repeat):
        for case in COST_CASES:
            t0 = time.process_time()
            wire = build(case, records, ring)
            keep(f"{case.name}|send", time.process_time() - t0)
            datagrams[case.name] = len(wire)
            t0 = time.process_time()
            assert decode_all(wire, ring) == records
            keep(f"{case.name}|recv", time.process_time() - t0)
            impairer = Impairer(Profile(loss=5.0), 1)
            lossy: list[bytes] = []
            for d in wire:  # released at once: the queue never reaches the relay's limit
                impairer.submit(d, 0.0)
                lossy += impairer.due(0.0)
            t0 = time.process_time()
            decode_all(lossy, ring)
            keep(f"{case.name}|recv_loss5", time.process_time() - t0)
    out: dict[str, Any] = {}
    for case in COST_CASES:
        row: dict[str, float] = {"datagrams_per_1k_records": 1000 * datagrams[case.name] / records}
        for side in ("send", "recv", "recv_loss5"):
            us = 1e6 * best[f"{case.name}|{side}"] / records
            row[f"{side}_cpu_us_per_record"] = round(us, 3)
            base = 1e6 * best[f"off|{side}"] / records
            row[f"{side}_ratio"] = round(us / base, 3)
        out[case.name] = row
    return out


# -- main ------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--datagrams", type=int, default=1_000_000, help="per sampled case")
    parser.add_argument("--codec-datagrams", type=int, default=1_000_000, help="per codec case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cost-records", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="processes (cases run in parallel)")
    parser.add_argument("--skip", default="", help="parts to skip: blocks,codec,cost")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.monotonic()
    blocks: list[dict[str, Any]] = []
    codec: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        codec_futures = (
            []
            if "codec" in skip
            else [
                pool.submit(codec_case, s, model, loss, args.codec_datagrams, args.seed + i)
                for i, (s, model, loss) in enumerate(CODEC_CASES)
            ]
        )
        block_futures = (
            []
            if "blocks" in skip
            else [
                pool.submit(sample_blocks, s, model, loss, args.datagrams, args.seed + 100 * i + j)
                for i, s in enumerate(SETTINGS)
                for j, (model, loss) in enumerate(LOSSES)
            ]
        )
        blocks = [f.result() for f in block_futures]
        if blocks:
            print("failed blocks per million source datagrams, measured / analytic")
            print(f"{'setting':32} " + " ".join(f"{m[0]}{loss:g}".rjust(15) for m, loss in LOSSES))
            for i, s in enumerate(SETTINGS):
                row = blocks[i * len(LOSSES) : (i + 1) * len(LOSSES)]
                cells = [
                    f"{_fmt(r['failed_per_million'])}/{_fmt(r['analytic_per_million'])}"
                    for r in row
                ]
                print(f"{s.name:32} " + " ".join(c.rjust(15) for c in cells))
        codec = [f.result() for f in codec_futures]
        for r in codec:
            print(
                f"codec {r['setting']:32} {r['model']} {r['loss_pct']:g} %: "
                f"{r['source_datagrams']} sources, {r['failed_blocks']} failed blocks "
                f"({_fmt(r['failed_per_million'])}/M, analytic {_fmt(r['analytic_per_million'])}), "
                f"{r['records_lost']} records lost, {r['cpu_s']} CPU-s"
            )
    costs = {} if "cost" in skip else cost(args.cost_records, args.repeat)
    for name, row in costs.items():
        print(f"cost {name:36} {json.dumps(row)}")
    print(
        json.dumps(
            {
                "bench": "fec_loss",
                "datagrams": args.datagrams,
                "codec_datagrams": args.codec_datagrams,
                "seed": args.seed,
                "defaults": asdict(Setting(DEFAULT_K, DEFAULT_D, 20)),
                "machine": f"{platform.machine()} {os.cpu_count()} cpu, "
                f"Python {platform.python_version()}",
                "load_average": [round(x, 1) for x in os.getloadavg()],
                "wall_s": round(time.monotonic() - t0, 1),
                "blocks": blocks,
                "codec": codec,
                "cost": costs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
