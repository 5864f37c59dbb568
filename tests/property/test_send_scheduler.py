"""The send ordering's invariant, over the settings that could break it (sender/scheduler.py).

**No datagram the sender emits can be refused by its own receiver** as replayed, out of window or
stale (reassembly timeout) on a link that loses and reorders nothing. The simulation runs the real
wire ``Encoder`` and ``Decoder`` and the real ``Pacer`` with a fake clock, a source that always has
records (a deep backlog: fed whenever the scheduler is not congested), heartbeats, linger, copies,
copy spacing, several targets (one shared replay window, or one per target as with a worker per
port) and a socket that sometimes would block. Every record must come out exactly once. A GSO run
is accounted once (``transmitted_run``), and every time that must leave the scheduler as one
``transmitted`` per datagram would.
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire import Decoder, DropReason, Encoder, RecordBatch, WireConfig
from common.wire.fec import FecConfig, FecEncoder, is_repair
from sender.pacing import Pacer, PacingConfig
from sender.scheduler import SendScheduler, Transmit
from sender.transport import GSO_MAX_BYTES, GSO_MAX_SEGMENTS

DATAGRAM = 600


@dataclass(frozen=True)
class Setting:
    rate_bytes: float
    rate_datagrams: float
    copies: int
    spacing: float
    targets: int
    window_per_target: bool
    heartbeat: float
    linger: float
    window: int
    backlog_datagrams: int
    large_every: int
    blocking: float
    seed: int
    fec_overhead: float = 0.0
    gso_segments: int = 0  # 0: next_transmit; else next_run (UDP GSO) with this many at most


settings_strategy = st.builds(
    Setting,
    rate_bytes=st.sampled_from([0.0, 50_000.0, 300_000.0, 3_000_000.0]),
    rate_datagrams=st.sampled_from([0.0, 200.0, 2_000.0]),
    copies=st.integers(1, 3),
    spacing=st.sampled_from([0.0, 0.001, 0.05, 0.5, 5.0]),
    targets=st.integers(1, 3),
    window_per_target=st.booleans(),
    heartbeat=st.sampled_from([0.001, 0.01, 0.2, 2.0]),
    linger=st.sampled_from([0.0, 0.002, 0.05]),
    window=st.sampled_from([64, 128, 512]),
    backlog_datagrams=st.integers(12, 600),
    large_every=st.sampled_from([0, 25]),
    blocking=st.sampled_from([0.0, 0.05]),
    seed=st.integers(0, 2**32 - 1),
    fec_overhead=st.sampled_from([0.0, 0.0, 20.0]),
    gso_segments=st.sampled_from([0, 0, 2, 8, GSO_MAX_SEGMENTS]),
)


def simulate(s: Setting, records: int = 300, *, margin: int | None = None) -> dict[str, object]:
    """Run the sender's ordering into real decoders; returns what the receiver saw."""
    rng = random.Random(s.seed)
    wire = WireConfig(
        max_datagram_size=DATAGRAM,
        linger=s.linger,
        allow_cleartext=True,
        replay_window=s.window,
        max_record_size=8192,
        max_message_size=12288,
        max_decompressed_size=12288,
    )
    now = 0.0
    session = os.urandom(16)
    encoder = Encoder(wire, None, session_id=session)
    scheduler = SendScheduler(
        pacer=Pacer(
            PacingConfig(
                bytes_per_s=s.rate_bytes,
                datagrams_per_s=s.rate_datagrams,
                max_datagram_size=DATAGRAM,
            ),
            now,
        ),
        copies=s.copies,
        copy_spacing=s.spacing,
        targets=s.targets,
        max_backlog_bytes=max(s.backlog_datagrams, 4 * s.copies) * DATAGRAM,
        replay_window=s.window,
        fec=FecEncoder(
            FecConfig(overhead=s.fec_overhead, block_size=8, streams=s.targets),
            None,
            session_id=session,
            max_source_size=DATAGRAM,
        )
        if s.fec_overhead
        else None,
    )
    if margin is not None:
        scheduler.margin = margin
    decoders = [Decoder(wire, None) for _ in range(s.targets if s.window_per_target else 1)]
    delivered: list[tuple[int, int]] = []
    low: dict[tuple[str, int], int] = {}
    sealed = 0
    fed = 0
    next_heartbeat = 0.0
    worst_distance = 0
    repairs = 0
    flushed = False
    sent_bytes = 0
    multi_runs = 0
    burst_bytes = max(DATAGRAM, s.rate_bytes * 0.02)
    burst_datagrams = max(1.0, s.rate_datagrams * 0.02)

    def push(out: list, now: float = 0.0) -> None:  # type: ignore[type-arg]
        nonlocal sealed
        if out:
            scheduler.push(out, encoder.records_sealed - sealed, now)
            sealed = encoder.records_sealed

    def drain_events(decoder: Decoder) -> None:
        while (event := decoder.next_event()) is not None:
            if isinstance(event, RecordBatch):
                delivered.extend((r.partition, r.offset) for r in event.records)

    def heartbeat(now: float) -> None:
        high = tuple(("t", p, o) for (_, p), o in sorted(scheduler.sent_high.items()))
        push(
            encoder.heartbeat(
                sender_id="s",
                started_at_ms=0,
                sent_at_ms=int(now * 1000),
                high_offsets=high,
                low_offsets=tuple(("t", p, low["t", p]) for _, p, _ in high),
                counters=(),
            )
        )

    def deliver(item: Transmit) -> None:
        nonlocal repairs, sent_bytes
        decoder = decoders[item.target if s.window_per_target else 0]
        if is_repair(item.data):
            repairs += 1  # the receiver's FEC layer takes these; the ordering is checked
        else:
            decoder.receive_datagram(item.data, now)
        drain_events(decoder)
        sent_bytes += len(item.data)

    steps = 0
    while True:
        steps += 1
        assert steps < 300_000, "simulation does not terminate"
        while fed < records and not scheduler.congested:
            partition = fed % 3
            size = 4000 if s.large_every and fed % s.large_every == 0 else rng.randint(0, 300)
            low.setdefault(("t", partition), fed)
            push(encoder.add("t", partition, fed, 1, 0, None, b"v" * size, (), now), now)
            fed += 1
        deadline = encoder.next_deadline()
        if deadline is not None and deadline <= now:
            push(encoder.poll(now), now)
        fec_deadline = scheduler.fec_deadline()
        if fec_deadline is not None and fec_deadline <= now:
            scheduler.poll_fec(now)
        finishing = fed == records and encoder.next_deadline() is None
        if finishing and not flushed:
            flushed = True
            scheduler.flush_fec()
        if now >= next_heartbeat and not finishing:
            if not scheduler.control_pending:  # the sender skips a tick while one still waits
                heartbeat(now)
            next_heartbeat = now + s.heartbeat
        blocked = False
        while True:
            run: list[Transmit] | None
            if s.gso_segments:
                run = scheduler.next_run(now, s.gso_segments, GSO_MAX_BYTES)
                if run is not None:
                    check_run(run, s, burst_bytes, burst_datagrams, scheduler, now)
                    multi_runs += len(run) > 1
            else:
                item = scheduler.next_transmit(now)
                run = None if item is None else [item]
            if run is None:
                break
            if s.blocking and rng.random() < s.blocking:
                blocked = True  # a GSO run is blocked (and offered again) as a whole
                break
            if s.gso_segments:  # one account per run, as the pipeline does (transmitted_run)
                highest = scheduler.highest_sent
                for item in run:
                    worst_distance = max(worst_distance, highest - item.sequence)
                    highest = max(highest, item.sequence)
                    deliver(item)
                check_run_accounting(scheduler, run, now)
            else:
                for item in run:
                    worst_distance = max(worst_distance, scheduler.highest_sent - item.sequence)
                    deliver(item)
                    scheduler.transmitted(item, now)
            if s.rate_bytes:  # pacing holds per datagram, GSO or not (sender/pacing.py)
                catch_up = s.rate_bytes * 0.25  # PacingConfig.catch_up_seconds
                assert sent_bytes <= s.rate_bytes * now + burst_bytes + catch_up + 2 * DATAGRAM
        for decoder in decoders:
            decoder.handle_timer(now)
            drain_events(decoder)
        if finishing and scheduler.idle:
            break
        if fed < records and not scheduler.congested:
            continue  # the source feeds again at once
        wakes = [None if finishing else next_heartbeat, now + 0.005 if blocked else None]
        wakes += [scheduler.next_timer(), encoder.next_deadline(), decoders[0].next_deadline()]
        wakes.append(scheduler.fec_deadline())
        now = max(now + 1e-9, min(w for w in wakes if w is not None))
    for decoder in decoders:
        decoder.handle_timer(now + 3600.0)
        drain_events(decoder)
    drops: dict[DropReason, int] = {}
    for decoder in decoders:
        for reason, count in decoder.drops.items():
            drops[reason] = drops.get(reason, 0) + count
    if s.fec_overhead:
        assert repairs > 0
    return {
        "delivered": delivered,
        "drops": drops,
        "worst": worst_distance,
        "multi_runs": multi_runs,
    }


def _state(scheduler: SendScheduler) -> dict[str, object]:
    """Everything ``transmitted`` changes that anyone can observe, and the queues' order."""
    pacer = scheduler._pacer
    return {
        "sent_high": dict(scheduler.sent_high),
        "counters": (
            scheduler.records_sent,
            scheduler.datagrams_sent,
            scheduler.bytes_sent,
            scheduler.copies_sent,
            scheduler.datagrams_dropped,
            scheduler.highest_sent,
            scheduler.backlog_bytes,
        ),
        "flags": (scheduler.congested, scheduler.idle, scheduler._held, scheduler._control_turn),
        "pending": (scheduler.pending, scheduler.control_pending),
        "lanes": [[(t.sequence, t.copies_left) for t in lane] for lane in scheduler._fresh],
        "rounds": [[[t.sequence for t in r] for r in lane] for lane in scheduler._rounds],
        "tokens": (round(pacer._bytes._tokens, 6), round(pacer._datagrams._tokens, 6)),
    }


def check_run_accounting(scheduler: SendScheduler, run: list[Transmit], now: float) -> None:
    """Account ``run`` with ``transmitted_run``, and check that it leaves the scheduler as
    ``transmitted`` for each datagram in turn would, sent or refused by the kernel."""
    memo = {id(scheduler.fec): None}  # repairs are queued already; accounting never reads it
    for sent in (False, True):
        one_by_one, items = copy.deepcopy((scheduler, run), dict(memo))
        for item in items:
            one_by_one.transmitted(item, now, sent=sent)
        if sent:
            scheduler.transmitted_run(run, now)
            assert _state(scheduler) == _state(one_by_one)
        else:
            at_once, items = copy.deepcopy((scheduler, run), dict(memo))
            at_once.transmitted_run(items, now, sent=False)
            assert _state(at_once) == _state(one_by_one)


def check_run(
    run: list[Transmit],
    s: Setting,
    burst_bytes: float,
    burst_datagrams: float,
    scheduler: SendScheduler,
    now: float,
) -> None:
    """What one UDP GSO call may carry: one target, one size (the last may be shorter), within
    the kernel's limits and never more than the pacer's burst; and every datagram in it would
    have left at ``now`` on its own, asking a copy of the pacer in turn (pacing per datagram)."""
    assert 1 <= len(run) <= s.gso_segments
    pacer = copy.deepcopy(scheduler._pacer)
    for item in run:
        assert pacer.delay(len(item.data), now) == 0.0
        pacer.take(len(item.data), now)
    twin = copy.deepcopy(scheduler, {id(scheduler.fec): None})
    for item in run:  # exactly the datagrams next_transmit hands out one after another
        alone = twin.next_transmit(now)
        assert alone is not None
        assert (alone.sequence, alone.target, alone.data) == (item.sequence, item.target, item.data)
        twin.transmitted(alone, now)
    if len(run) == 1:
        return
    size = len(run[0].data)
    assert all(len(item.data) == size for item in run[:-1])
    assert len(run[-1].data) <= size
    assert len({item.target for item in run}) == 1
    total = sum(len(item.data) for item in run)
    assert total <= GSO_MAX_BYTES
    if s.rate_bytes:
        assert total <= burst_bytes
    if s.rate_datagrams:
        assert len(run) <= burst_datagrams
    assert s.copies == 1


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(settings_strategy)
def test_no_datagram_the_sender_emits_is_refused_by_its_receiver(s: Setting) -> None:
    seen = simulate(s)
    drops = seen["drops"]
    assert isinstance(drops, dict)
    assert set(drops) <= {DropReason.DUPLICATE}, drops  # never replayed, never timed out
    if s.copies == 1 and (s.targets == 1 or s.window_per_target):
        assert not drops, drops
    delivered = seen["delivered"]
    assert isinstance(delivered, list)
    assert sorted(o for _, o in delivered) == list(range(300))  # each record exactly once
    assert isinstance(seen["worst"], int)
    assert seen["worst"] < s.window // 2


def test_the_simulation_catches_an_unbounded_reordering() -> None:
    """The property has teeth: without the margin (heartbeats jump any backlog, spaced copies
    wait their full spacing) the same simulation sees the receiver refuse datagrams."""
    backlog = Setting(
        rate_bytes=300_000.0,
        rate_datagrams=0.0,
        copies=1,
        spacing=0.0,
        targets=1,
        window_per_target=False,
        heartbeat=0.01,
        linger=0.002,
        window=64,
        backlog_datagrams=400,
        large_every=0,
        blocking=0.0,
        seed=1,
    )
    assert simulate(backlog)["drops"] == {}
    refused = simulate(backlog, margin=1 << 30)["drops"]
    assert isinstance(refused, dict)
    assert refused.get(DropReason.REPLAYED, 0) > 0
    spaced = Setting(**{**backlog.__dict__, "copies": 2, "spacing": 5.0, "heartbeat": 2.0})
    assert set(simulate(spaced)["drops"]) <= {DropReason.DUPLICATE}  # type: ignore[arg-type]
    late = simulate(spaced, margin=1 << 30)["drops"]
    assert isinstance(late, dict)
    assert late.get(DropReason.REPLAYED, 0) > 0


@pytest.mark.parametrize("rate_bytes", [0.0, 300_000.0])
def test_gso_runs_are_made_and_deliver_every_record_once(rate_bytes: float) -> None:
    """The GSO path is exercised (fragments of large records leave in runs), paced or not."""
    s = Setting(
        rate_bytes=rate_bytes,
        rate_datagrams=0.0,
        copies=1,
        spacing=0.0,
        targets=2,
        window_per_target=True,
        heartbeat=0.01,
        linger=0.002,
        window=128,
        backlog_datagrams=400,
        large_every=5,
        blocking=0.05,
        seed=7,
        gso_segments=8,
    )
    seen = simulate(s)
    assert seen["drops"] == {}
    delivered = seen["delivered"]
    assert isinstance(delivered, list)
    assert sorted(o for _, o in delivered) == list(range(300))
    assert isinstance(seen["multi_runs"], int)
    assert seen["multi_runs"] > 10


def test_data_passing_a_waiting_heartbeat_leaves_in_runs() -> None:
    """On a paced link a heartbeat waits most of the time for the backlog ahead of it to come
    within the margin (a second of backlog is more than it); the data that passes it meanwhile
    leaves in GSO runs, not one datagram per system call, and the heartbeat leaves where
    ``next_transmit`` would send it."""
    now = 0.0
    encoder = Encoder(WireConfig(allow_cleartext=True), None, session_id=os.urandom(16))
    pacer = Pacer(PacingConfig(bytes_per_s=15e6, max_datagram_size=1472), now)
    scheduler = SendScheduler(pacer=pacer, max_backlog_bytes=64 << 20, replay_window=1024)
    for offset in range(400):  # 10 KB records: eight datagrams each, 3,200 in all
        scheduler.push(encoder.add("t", 0, offset, 1, 0, None, bytes(10_000), (), now), 1, now)
    beat = encoder.heartbeat(sender_id="s", started_at_ms=0, sent_at_ms=0,
                             high_offsets=(("t", 0, 399),), low_offsets=(("t", 0, 0),),
                             counters=())  # fmt: skip
    scheduler.push(beat, 0, now)
    heartbeat = beat[-1].sequence
    setting = Setting(
        15e6, 0.0, 1, 0.0, 1, True, 1.0, 0.0, 1024, 0, 0, 0.0, 0, gso_segments=GSO_MAX_SEGMENTS
    )
    calls = data = 0
    while scheduler.control_pending:
        run = scheduler.next_run(now, setting.gso_segments, GSO_MAX_BYTES)
        if run is None:
            now = scheduler.next_timer() or now
            continue
        check_run(run, setting, 15e6 * 0.02, 1.0, scheduler, now)
        if run[0].lane == 0:
            calls += 1
            data += len(run)
        scheduler.transmitted_run(run, now)
    assert data == heartbeat - scheduler.margin + 1  # the data up to the margin went first
    assert calls <= data / 6  # in runs: eight datagrams a record, some split by the pacer
