"""Transport benchmark: sender and receiver CPU-seconds per GB over real loopback UDP, no Kafka.

Two child processes per case, each timing only its own CPU (user + system, ``time.process_time``):

- **sender**: the real send path without Kafka: ``common.wire.Encoder`` (AES-256-GCM, no
  compression, default 1452-byte datagrams) -> ``SendPipeline`` (scheduler, pacer, backpressure)
  -> ``UdpSender`` on uvloop, fed in bursts of ``--batch`` records (as a consumer batch would be),
  values pre-generated random bytes (incompressible) and 16-byte keys; ``--headers N`` gives each
  record N headers, the first a sequence id that changes with every record, the others 16-byte
  constants (as tracing and content-type headers are);
- **receiver**: the real receive path without Kafka: ``open_udp_socket`` + ``SocketDrainer`` ->
  ``Decoder`` (and ``FecDecoder`` keeping the authentic sources) -> ``RunCoalescer`` (the
  raw layout v2 run values the raw producer would be given).

Per record size (``--sizes``, default 200 B, 1 KB, 10 KB, 100 KB) and per mode (``--modes``: ``off``
= one datagram per system call on both sides, ``on`` = UDP GSO on the sender and UDP GRO on the
receiver, each where the kernel has it, a GRO read's fragmented messages decoded whole as the
receiver does (``Decoder.receive_coalesced``), ``split`` = ``on`` with every datagram of a GRO read
decoded on its own), the cases run interleaved for ``--rounds`` rounds (the
order of the modes alternates every round), so that a noisy machine shifts both modes alike; the
ratio on/off per round and size is the robust figure. CPU per GB counts the record value bytes
(the sender's of every record, the receiver's of the records it decoded); ``--rate-bytes`` paces
the sender (0: unpaced; a receiver that cannot keep up then loses datagrams at its socket, which
the ``lost`` column shows and which does not change its CPU per decoded byte much).

``--profile sender|receiver`` runs cProfile in that child and prints its top functions.

    .venv/bin/python bench/transport.py [--sizes 200,1000,10000,100000] [--modes off,on]
        [--megabytes 40] [--rounds 3] [--rate-bytes 0] [--profile receiver] [--datagram-size 8952]
        [--headers 1]

Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop

from common.wire import (
    Decoder,
    Encoder,
    Key,
    KeyRing,
    RecordBatch,
    WireConfig,
    coalesced_segment,
    message_goes_on,
)
from common.wire.fec import FecDecoder, FecLimits
from receiver.runs import RunCoalescer
from receiver.singles import decode_singles
from receiver.transport import SocketDrainer, open_udp_socket
from sender.pacing import Pacer, PacingConfig
from sender.send_pipeline import SendPipeline
from sender.transport import UdpSender

KEY_BYTES = 16
#: Distinct values cycled through (random bytes: incompressible).
VALUES = 64
#: The receiver reports once nothing arrived for this long after the last datagram.
QUIET_S = 0.6


def _profiled(kind: str, wanted: str | None) -> cProfile.Profile | None:
    if wanted != kind:
        return None
    prof = cProfile.Profile()
    prof.enable()
    return prof


def _profile_text(prof: cProfile.Profile | None) -> str:
    if prof is None:
        return ""
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def _bench_error() -> None:
    raise RuntimeError("the receive path raised (a bug): the measurement is void")


def receiver_main(
    conn: Any,
    gro: bool,
    key: bytes,
    expected: int,
    profile: str | None,
    coalesced: bool,
    wire: WireConfig,
) -> None:
    """Child: receive and decode until ``expected`` records arrived or the link went quiet;
    ``coalesced``: a GRO read's fragmented messages decoded whole, as the receiver does
    (``Receiver._on_coalesced``)."""
    ring = KeyRing([Key.from_material(key)])
    decoder = Decoder(wire, ring)
    # every authentic source is kept for FEC, whether the sender sends repairs or not
    fec = FecDecoder(
        FecLimits(replay_window=wire.replay_window, max_sessions=wire.max_sessions), ring
    )
    runs = RunCoalescer(8 * 1024 * 1024, 0.05)
    finished: list[Any] = []
    state = {"records": 0, "value_bytes": 0, "datagrams": 0, "first": 0.0, "last": 0.0}
    cpu0 = [0.0]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sock, _ = open_udp_socket(
            "127.0.0.1", 0, reuse_port=False, rcvbuf=64 * 1024 * 1024, gro=gro
        )
        done = asyncio.Event()

        def on_datagram(data: bytes) -> None:
            if not state["datagrams"]:
                cpu0[0] = time.process_time()
                state["first"] = time.monotonic()
            state["datagrams"] += 1
            now = loop.time()
            authenticated = decoder.authenticated
            decoder.receive_datagram(data, now)
            if decoder.authenticated != authenticated:
                fec.add_source(data, now)
            events(now)

        def on_coalesced(data: bytes, segment: int) -> None:
            if not state["datagrams"]:
                cpu0[0] = time.process_time()
                state["first"] = time.monotonic()
            now = loop.time()
            start, stop = 0, len(data)
            while start < stop:
                used = decoder.receive_coalesced(data, start, segment, now)
                if not used:
                    break
                fec.add_sources(data, start, start + used, segment, now)
                state["datagrams"] += -(-used // segment)
                start += used
                events(now)
            # the rest as the receiver's _on_singles takes them (the bench sends no repairs)
            at = decode_singles(decoder, fec, data, start, segment, now, _bench_error)
            state["datagrams"] += -(-(at - start) // segment)
            events(now)
            for rest in range(at, stop, segment):  # from a repair on: one by one, as it does
                on_datagram(data[rest : rest + segment])

        def events(now: float) -> None:
            while (event := decoder.next_event()) is not None:
                if type(event) is RecordBatch:
                    state["records"] += event.count
                    for group in event.groups:
                        for value in group.values:
                            state["value_bytes"] += len(value) if value is not None else 0
                        runs.add_group(event.session_id, group, now, finished)
                    finished.clear()

        def after() -> None:
            state["last"] = time.monotonic()
            if state["records"] >= expected:
                done.set()

        drainer = SocketDrainer(
            sock,
            on_datagram,
            after,
            max_per_wakeup=512,
            on_error=lambda exc: None,
            on_coalesced=on_coalesced if coalesced else None,
            segment_of=coalesced_segment,
            goes_on=message_goes_on,
        )
        drainer.start(loop)
        conn.send(sock.getsockname()[1])
        prof = _profiled("receiver", profile)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUIET_S):
                    await done.wait()
            if state["datagrams"] and time.monotonic() - state["last"] >= QUIET_S:
                break
        runs.flush_all(finished)
        cpu = time.process_time() - cpu0[0]
        text = _profile_text(prof)
        drainer.refresh_kernel_drops()
        conn.send(
            {
                **state,
                "cpu_s": cpu,
                "kernel_drops": drainer.kernel_drops,
                "drops": {str(k): v for k, v in decoder.drops.items()},
                "profile": text,
            }
        )
        drainer.close()

    uvloop.run(main())


def sender_main(
    conn: Any, port: int, gso: bool, key: bytes, size: int, count: int, batch: int,
    rate: float, profile: str | None, wire: WireConfig, headers: int = 0,
) -> None:  # fmt: skip
    """Child: send ``count`` records of ``size`` bytes through the real send path."""
    ring = KeyRing([Key.from_material(key)])
    values = [os.urandom(size) for _ in range(VALUES)]
    keys = [b"%016d" % i for i in range(VALUES)]
    constant = tuple((f"h{n}", b"%016d" % n) for n in range(1, headers))

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        udp = UdpSender([("127.0.0.1", port)], send_buffer=4 * 1024 * 1024, gso=gso)
        released = asyncio.Event()
        released.set()

        def on_pressure(congested: bool) -> None:
            if congested:
                released.clear()
            else:
                released.set()

        encoder = Encoder(wire, ring, session_id=os.urandom(16))
        pipeline = SendPipeline(
            encoder=encoder,
            pacer=Pacer(PacingConfig(bytes_per_s=rate), time.monotonic()),
            udp=udp,
            loop=loop,
            max_backlog_bytes=max(8 * 1024 * 1024, 3 * int(rate)),
            on_pressure=on_pressure,
        )
        record = pipeline.record
        prof = _profiled("sender", profile)
        cpu0, t0 = time.process_time(), time.monotonic()
        ts = int(time.time() * 1000)
        for start in range(0, count, batch):
            pipeline.begin()
            for offset in range(start, min(count, start + batch)):
                i = offset % VALUES
                extra = (("seq", b"bench-%d" % offset), *constant) if headers else ()
                record("bench", 0, offset, ts, 0, keys[i], values[i], extra)
            pipeline.settle()
            if not released.is_set():
                await released.wait()
            else:
                await asyncio.sleep(0)
        await pipeline.drain(120.0)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        text = _profile_text(prof)
        result = {
            "cpu_s": cpu,
            "wall_s": wall,
            "datagrams": pipeline.datagrams_sent,
            "bytes": pipeline.bytes_sent,
            "errors": dict(udp.errors),
            "gso_calls": getattr(udp, "gso_calls", 0),
            "profile": text,
        }
        udp.close()
        return result

    conn.send(uvloop.run(main()))


def run_case(ctx: Any, size: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One sender/receiver pair; their figures."""
    on = mode in {"on", "split"}
    count = max(1000, int(args.megabytes * 1e6 / size))
    key = Key.generate().material
    rx_parent, rx_child = ctx.Pipe()
    tx_parent, tx_child = ctx.Pipe()
    wire = WireConfig(max_datagram_size=args.datagram_size)
    rx = ctx.Process(
        target=receiver_main, args=(rx_child, on, key, count, args.profile, mode == "on", wire)
    )
    rx.start()
    port = rx_parent.recv()
    tx = ctx.Process(
        target=sender_main,
        args=(
            tx_child,
            port,
            on,
            key,
            size,
            count,
            args.batch,
            args.rate_bytes,
            args.profile,
            wire,
            args.headers,
        ),
    )
    tx.start()
    sent = tx_parent.recv()
    got = rx_parent.recv()
    tx.join()
    rx.join()
    gb_sent = size * count / 1e9
    gb_got = got["value_bytes"] / 1e9
    case = {
        "size": size,
        "mode": mode,
        "records": count,
        "sender_cpu_s_per_gb": sent["cpu_s"] / gb_sent,
        "receiver_cpu_s_per_gb": got["cpu_s"] / gb_got if gb_got else float("nan"),
        "sender_mb_per_s": gb_sent * 1e3 / sent["wall_s"],
        "datagrams_sent": sent["datagrams"],
        "gso_calls": sent["gso_calls"],
        "datagrams_read": got["datagrams"],
        "records_received": got["records"],
        "lost_records": count - got["records"],
        "kernel_drops": got["kernel_drops"],
        "send_errors": sent["errors"],
        "decoder_drops": got["drops"],
    }
    if args.profile:
        print(f"--- {args.profile} profile, {size} B, {mode}")
        print(sent["profile"] or got["profile"])
    return case


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,1000,10000,100000")
    parser.add_argument("--modes", default="off,on", help="off, on, split (interleaved)")
    parser.add_argument("--megabytes", type=float, default=40.0, help="value MB per case")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500, help="records per burst (begin..settle)")
    parser.add_argument(
        "--rate-bytes", type=float, default=0.0, help="sender pacing, B/s (0: none)"
    )
    parser.add_argument("--profile", choices=["sender", "receiver"], default=None)
    parser.add_argument(
        "--datagram-size",
        type=int,
        default=WireConfig().max_datagram_size,
        help="max_datagram_size of both sides (8952: a jumbo-frame link)",
    )
    parser.add_argument(
        "--headers", type=int, default=0, help="headers per record (0: none; see above)"
    )
    args = parser.parse_args()
    if not 0 <= args.headers <= 16:
        parser.error("--headers must be 0..16")
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    ctx = multiprocessing.get_context("spawn")
    cases: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for size in sizes:
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                case = run_case(ctx, size, mode, args)
                case["round"] = r
                cases.append(case)
                print(json.dumps(case), file=sys.stderr)
    results: dict[str, Any] = {}
    print(
        f"{'size':>7} {'mode':>4} {'send CPU-s/GB':>14} {'recv CPU-s/GB':>14} "
        f"{'send MB/s':>10} {'lost rec':>9}"
    )
    for size in sizes:
        for mode in modes:
            mine = [c for c in cases if c["size"] == size and c["mode"] == mode]
            send = statistics.median(c["sender_cpu_s_per_gb"] for c in mine)
            recv = statistics.median(c["receiver_cpu_s_per_gb"] for c in mine)
            rate = statistics.median(c["sender_mb_per_s"] for c in mine)
            lost = sum(c["lost_records"] for c in mine)
            print(f"{size:>7} {mode:>4} {send:>14.2f} {recv:>14.2f} {rate:>10.1f} {lost:>9}")
            results[f"{size}_{mode}_sender_cpu_s_per_gb"] = round(send, 2)
            results[f"{size}_{mode}_receiver_cpu_s_per_gb"] = round(recv, 2)
            results[f"{size}_{mode}_lost_records"] = lost
        for other in (m for m in modes if m != "off" and "off" in modes):
            for side in ("sender", "receiver"):
                ratios = []
                for r in range(args.rounds):
                    pair = {
                        c["mode"]: c[f"{side}_cpu_s_per_gb"]
                        for c in cases
                        if c["size"] == size and c["round"] == r
                    }
                    ratios.append(pair[other] / pair["off"])
                ratio = statistics.median(ratios)
                results[f"{size}_{side}_{other}_over_off"] = round(ratio, 3)
                print(f"{size:>7} {side} {other}/off CPU per GB: {ratio:.2f} (rounds: "
                      f"{', '.join(f'{x:.2f}' for x in ratios)})")  # fmt: skip
    summary = {
        "bench": "transport",
        "sizes": sizes,
        "modes": modes,
        "megabytes": args.megabytes,
        "rounds": args.rounds,
        "datagram_size": args.datagram_size,
        "rate_bytes": args.rate_bytes,
        "headers": args.headers,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "load_average": [round(x, 1) for x in os.getloadavg()],
        **results,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
