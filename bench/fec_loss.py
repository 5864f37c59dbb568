"""FEC benchmark: records lost before any resend against link loss, and the cost of FEC.

Part 1, loss (pure, no sockets, no clock): the real wire ``Encoder`` and ``FecEncoder`` build the
datagrams of ``--records`` records (200-byte values, 1452-byte datagrams); the relay's own
impairment engine (``netem.impair.Impairer``, seeded) drops some; the receiver's glue (normal
``Decoder`` + ``FecDecoder``, as in ``receiver/app.py``) decodes the rest. Reported: the share of
records not delivered, i.e. what would become gaps and wait for a resend. Cases: copies 1,
copies 2 (each datagram twice, back to back, as ``--copies 2`` without spacing), and FEC at 5, 10,
20, 50 % overhead (default blocks: 32 sources, interleave 1), 20 % with 64-source blocks, and
20 % and 50 % with interleave 4. Loss
models: ``random`` (netem ``loss X%``) and ``bursty`` (Gilbert-Elliott, netem ``loss gemodel``,
bad state always loses, mean burst 5 datagrams: r = 20 %, p chosen for the mean loss X).

Part 2, cost (same run): CPU seconds per million records of the sender's wire path (encode +
FEC) and of the receiver's decode path (decode + FEC source buffer + repairs, no loss, and with
5 % random loss so blocks are rebuilt), FEC off / 10 % / 20 %, best of ``--repeat``. These are the
FEC parts only, without Kafka: the processes' full per-record cost (bench/sender.py,
bench/receiver.py) is larger, so the ratios here are upper bounds of the end-to-end ratios.

    .venv/bin/python bench/fec_loss.py [--records 30000] [--seed 7] [--png docs/img/fec-loss.png]

Prints tables, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.wire import Decoder, Encoder, Key, KeyRing, RecordBatch, WireConfig
from common.wire.fec import FecConfig, FecDecoder, FecEncoder, FecLimits, is_repair
from netem.impair import Impairer
from netem.profile import Profile

LOSSES = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)
SESSION = bytes(range(16))
VALUE = 200
DATAGRAM = 1452


@dataclass(frozen=True)
class Case:
    name: str
    copies: int = 1
    overhead: float = 0.0
    interleave: int = 1
    block_size: int = 32


CASES = (
    Case("copies 1"),
    Case("copies 2", copies=2),
    Case("fec 5 %", overhead=5),
    Case("fec 10 %", overhead=10),
    Case("fec 20 %", overhead=20),
    Case("fec 50 %", overhead=50),
    Case("fec 20 % block 64", overhead=20, block_size=64),
    Case("fec 20 % interleave 4", overhead=20, interleave=4),
    Case("fec 50 % interleave 4", overhead=50, interleave=4),
)


def profile(model: str, loss: float) -> Profile:
    if loss == 0:
        return Profile()
    if model == "random":
        return Profile(loss=loss)
    r = 20.0  # mean burst length 1 / 0.2 = 5 datagrams
    p = r * loss / (100.0 - loss)
    return Profile(ge_p=p, ge_r=r)


def build(case: Case, records: int, ring: KeyRing) -> tuple[list[bytes], int]:
    """Datagrams in send order (repairs after their block) and how many are sources."""
    fec_cfg = (
        FecConfig(overhead=case.overhead, interleave=case.interleave, block_size=case.block_size)
        if case.overhead
        else None
    )
    size = DATAGRAM - (fec_cfg.overhead_bytes if fec_cfg else 0)
    enc = Encoder(WireConfig(max_datagram_size=size), ring, session_id=SESSION)
    fec = FecEncoder(fec_cfg, ring, session_id=SESSION, max_source_size=size) if fec_cfg else None
    value = os.urandom(VALUE)
    out: list[bytes] = []
    sources = 0

    def put(datagrams: list[Any]) -> None:
        nonlocal sources
        for d in datagrams:
            sources += 1
            out.extend([d.data] * case.copies)
            if fec is not None:
                for r in fec.add(d.data, 0, 0.0):
                    out.extend([r] * case.copies)

    for i in range(records):
        put(enc.add("t", i % 6, i, 1_700_000_000_000, 1, b"%016d" % i, value, (), 0.0))
    put(enc.flush())
    if fec is not None:
        for _, r in fec.flush():
            out.extend([r] * case.copies)
    return out, sources


class Receiver:
    """The receiver's glue (receiver/app.py ``_on_datagram``) without Kafka."""

    def __init__(self, ring: KeyRing) -> None:
        self.decoder = Decoder(WireConfig(), ring)
        self.fec = FecDecoder(FecLimits(), ring)
        self.records = 0

    def receive(self, data: bytes) -> None:
        decoder = self.decoder
        if is_repair(data):
            for d in self.fec.receive_repair(data, 0.0):
                decoder.receive_datagram(d, 0.0)
        else:
            before = decoder.authenticated
            decoder.receive_datagram(data, 0.0)
            if decoder.authenticated != before:
                for d in self.fec.add_source(data, 0.0):
                    decoder.receive_datagram(d, 0.0)
        while (event := decoder.next_event()) is not None:
            if type(event) is RecordBatch:
                self.records += event.count


def lossy(datagrams: list[bytes], prof: Profile, seed: int) -> list[bytes]:
    impairer = Impairer(prof, seed)
    out: list[bytes] = []
    for d in datagrams:
        impairer.submit(d, 0.0)
        out += impairer.due(0.0)
    return out + impairer.flush()


def loss_table(records: int, seed: int, ring: KeyRing) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for case in CASES:
        wire, sources = build(case, records, ring)
        extra = len(wire) / sources - 1
        row: dict[str, Any] = {"datagrams_per_source": round(len(wire) / sources, 3)}
        for model in ("random", "bursty"):
            for loss in LOSSES:
                rx = Receiver(ring)
                for d in lossy(wire, profile(model, loss), seed):
                    rx.receive(d)
                row[f"{model}_{loss:g}"] = round(100.0 * (records - rx.records) / records, 4)
        row["extra_datagrams_pct"] = round(100 * extra, 1)
        table[case.name] = row
        print(f"{case.name:24} " + " ".join(f"{row[f'random_{x:g}']:8.3f}" for x in LOSSES)
              + " | " + " ".join(f"{row[f'bursty_{x:g}']:8.3f}" for x in LOSSES))  # fmt: skip
    return table


def cost(records: int, repeat: int, ring: KeyRing) -> dict[str, float]:
    """Best of ``repeat`` rounds; each round measures off, 10 % and 20 % back to back, so a
    noisy neighbour hurts every case alike."""
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    for _ in range(repeat):
        for overhead in (0.0, 10.0, 20.0):
            key = f"fec_{overhead:g}"
            case = Case(key, overhead=overhead)
            t0 = time.process_time()
            wire, _ = build(case, records, ring)
            keep(f"{key}_send", time.process_time() - t0)
            rx = Receiver(ring)
            t0 = time.process_time()
            for d in wire:
                rx.receive(d)
            keep(f"{key}_recv", time.process_time() - t0)
            assert rx.records == records
            dropped = lossy(wire, Profile(loss=5.0), 1)
            rx = Receiver(ring)
            t0 = time.process_time()
            for d in dropped:
                rx.receive(d)
            keep(f"{key}_recv_loss5", time.process_time() - t0)
    out = {f"{name}_cpu_s_per_1m": 1e6 * seconds / records for name, seconds in best.items()}
    for side in ("send", "recv", "recv_loss5"):
        base = out[f"fec_0_{side}_cpu_s_per_1m"]
        for overhead in ("10", "20"):
            out[f"fec_{overhead}_{side}_ratio"] = out[f"fec_{overhead}_{side}_cpu_s_per_1m"] / base
    for name, value in out.items():
        print(f"{name:40} {value:10.3f}")
    return out


def plot(table: dict[str, Any], png: Path) -> None:
    import matplotlib as mpl  # noqa: PLC0415  bench extra, only with --png

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, model in zip(axes, ("random", "bursty"), strict=True):
        for name, row in table.items():
            ys = [max(row[f"{model}_{x:g}"], 1e-3) for x in LOSSES]
            ax.plot(LOSSES, ys, marker="o", label=f"{name} (+{row['extra_datagrams_pct']:g} %)")
        ax.set_yscale("log")
        ax.set_title(
            f"{model} loss" + (" (Gilbert-Elliott, mean burst 5)" if model == "bursty" else "")
        )
        ax.set_xlabel("datagrams lost on the link (%)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("records lost before resend (%, 0 drawn at 0.001)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cost-records", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    ring = KeyRing([Key.generate()])
    print(f"{'records lost %':24} " + " ".join(f"{'r' + format(x, 'g'):>8}" for x in LOSSES)
          + " | " + " ".join(f"{'b' + format(x, 'g'):>8}" for x in LOSSES))  # fmt: skip
    table = loss_table(args.records, args.seed, ring)
    costs = cost(args.cost_records, args.repeat, ring)
    if args.png:
        plot(table, args.png)
    print(
        json.dumps(
            {
                "bench": "fec_loss",
                "records": args.records,
                "seed": args.seed,
                "machine": f"{platform.machine()} {os.cpu_count()} cpu, "
                f"Python {platform.python_version()}",
                "load_average": [round(x, 1) for x in os.getloadavg()],
                "loss": table,
                "cost": {k: round(v, 3) for k, v in costs.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
