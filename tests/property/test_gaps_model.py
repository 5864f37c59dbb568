"""Model-based tests: PartitionDetector against a plain reference (a set of seen offsets + rules).

The reference implements docs/gaps.md "Semantics", the documented below-window policy and heartbeat
low offsets (docs/gaps.md) with Python sets and lists, one offset at a time, and no bitmaps. The
promise it checks: every offset from the lowest heartbeat ``low_offset`` (or the first offset seen)
up to the highest heartbeat offset is delivered exactly once, open, or reported EXPIRED.
"""

from __future__ import annotations

import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.gap_record import GapState
from dedup.detector import DetectorConfig, PartitionDetector


def runs(offsets: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for x in sorted(offsets):
        if out and out[-1][1] == x - 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return [(a, b) for a, b in out]


class Model:
    def __init__(self, ws: int, mw: int, mxe: int) -> None:
        self.ws, self.mw, self.mxe = ws, mw, mxe
        self.seen: set[int] = set()
        self.first: int | None = None
        self.next: int | None = None
        self.high: int | None = None
        self.lo = self.hi = 0
        self.evicted = False
        self.expired: list[list[int]] = []  # [first, last], sorted
        self.forgotten_max = -1
        self.below_window = 0

    def tail(self) -> int:
        assert self.next is not None
        return max(self.next - 1, -1 if self.high is None else self.high)

    def observe(self, o: int) -> bool:
        if self.first is None:
            self.first, self.next = o, o + 1
            self.lo = self.hi = o // self.ws
            self.seen.add(o)
            return True
        w = o // self.ws
        if w > self.hi:
            new_lo = max(self.lo, w - self.mw + 1)
            if new_lo > self.lo:
                top = max(self.tail(), o - 1)
                start = max(self.first, self.lo * self.ws)
                end = min(new_lo * self.ws - 1, top)
                missing = [x for x in range(start, end + 1) if x not in self.seen]
                self.expired += [[a, b] for a, b in runs(missing)]
                while len(self.expired) > self.mxe:
                    self.forgotten_max = max(self.forgotten_max, self.expired.pop(0)[1])
                self.lo, self.evicted = new_lo, True
            self.hi = w
        if o >= self.lo * self.ws or (
            not self.evicted and o < self.first and self.hi - w < self.mw
        ):
            self.lo = min(self.lo, w)
            if o in self.seen:
                return False
            self.seen.add(o)
            self.next = max(self.next, o + 1)
            return True
        for i, (a, b) in enumerate(self.expired):
            if a <= o <= b:
                pieces = [[x, y] for x, y in ((a, o - 1), (o + 1, b)) if x <= y]
                self.expired[i : i + 1] = pieces
                self.seen.add(o)
                return True
        if o < self.first or o <= self.forgotten_max:
            self.below_window += 1
        return False

    def heartbeat(self, high: int, low: int | None = None) -> None:
        self.high = high if self.high is None else max(self.high, high)
        if low is None:
            return
        if self.first is None:
            self.first = self.next = low
            self.lo = self.hi = low // self.ws
        elif low >= self.first:
            pass
        elif self.evicted:
            self.first = min(self.first, max(low, self.lo * self.ws))
        elif self.hi - low // self.ws < self.mw:
            self.lo, self.first = min(self.lo, low // self.ws), low
        else:
            new_lo = self.hi - self.mw + 1
            assert self.expired == []
            self.expired = [[low, new_lo * self.ws - 1]]
            while len(self.expired) > self.mxe:
                self.forgotten_max = max(self.forgotten_max, self.expired.pop(0)[1])
            self.lo, self.first, self.evicted = new_lo, low, True

    def gaps(self) -> list[tuple[int, int]]:
        if self.first is None:
            return []
        start = max(self.first, self.lo * self.ws)
        missing = [x for x in range(start, self.tail() + 1) if x not in self.seen]
        return [(a, b) for a, b in self.expired] + runs(missing)


def compacted_open(reports, topic="t", partition=0) -> list[tuple[int, int]]:
    latest = {}
    for r in reports:
        assert (r.topic, r.partition) == (topic, partition)
        assert r.first <= r.last
        latest[r.first] = r
    return sorted((r.first, r.last) for r in latest.values() if r.state is GapState.OPEN)


def same_state(x: PartitionDetector, y: PartitionDetector) -> bool:
    """Logical equality (Roaring's container choice may differ between bulk and single adds)."""

    def view(d: PartitionDetector):
        return (
            d.open_gaps(),
            d.reported_open(),
            d.next_expected,
            d.low_watermark,
            d.heartbeat_high,
            (d.delivered, d.duplicates, d.below_window),
            PartitionDetector.from_bytes(d.to_bytes(), d.config)._seen,
        )

    return view(x) == view(y)


@st.composite
def scenarios(draw):
    ws = draw(st.integers(1, 64))
    mw = draw(st.integers(1, 6))
    mxe = draw(st.integers(0, 8))
    start = draw(st.integers(0, 300))
    length = draw(st.integers(1, 300))
    sent = list(range(start, start + length))
    loss = draw(st.floats(0.0, 0.5))
    rnd = draw(st.randoms(use_true_random=False))
    arrived = [o for o in sent if rnd.random() >= loss]
    arrived += [rnd.choice(arrived) for _ in range(len(arrived) // 5)] if arrived else []
    # local reordering plus a few far-late records
    arrived.sort(key=lambda o: o + rnd.uniform(0, draw(st.sampled_from([0, 3, 30, 400]))))
    # Heartbeat low offsets (None: an older receiver): the session's start, or a later session
    # resuming from its commit (a higher low).
    with_lows = draw(st.booleans())

    def low() -> int | None:
        if not with_lows:
            return None
        return start if rnd.random() < 0.7 else rnd.randint(start, start + length - 1)

    ops: list[tuple[str, tuple[int, int | None] | int | None]] = []
    if with_lows and draw(st.booleans()):  # a heartbeat before any record
        ops.append(("hb", (start + rnd.randint(0, length - 1), start)))
    for o in arrived:
        ops.append(("obs", o))
        r = rnd.random()
        if r < 0.05:
            ops.append(("scan", None))
        elif r < 0.08:
            high = rnd.randint(start, start + length - 1)
            lo = low()
            ops.append(("hb", (high, None if lo is None else min(lo, high))))
        elif r < 0.09:
            ops.append(("roundtrip", None))
    return ws, mw, mxe, start + length - 1, ops, (start if with_lows else None)


def run_both(ws, mw, mxe, last_sent, ops, session_low, *, batched: bool):
    config = DetectorConfig(window_size=ws, max_windows=mw, max_expired_gaps=mxe)
    det = PartitionDetector("t", 0, config)
    model = Model(ws, mw, mxe)
    reports = []
    now = 0
    batch: list[int] = []
    low_in_time = False  # the session's low reached the detector before any eviction

    def flush():
        nonlocal det
        if batch:
            expected = [model.observe(o) for o in batch]
            got = det.observe_many(array.array("Q", batch), now)
            assert got == expected, (batch, got, expected)
            batch.clear()

    for op, arg in ops:
        now += 1
        if op == "obs":
            if batched:
                batch.append(arg)
            else:
                assert det.observe(arg, now) == model.observe(arg), arg
            continue
        flush()
        if op == "scan":
            reports += det.scan(now)
        elif op == "hb":
            high, low = arg
            if low is not None and low == session_low and not model.evicted:
                low_in_time = True
            det.heartbeat(high, now, low)
            model.heartbeat(high, low)
        else:
            reports += det.drain_reports()
            det = PartitionDetector.from_bytes(det.to_bytes(), config)
    flush()
    if session_low is not None and not model.evicted:
        low_in_time = True
    det.heartbeat(last_sent, now + 1, session_low)
    model.heartbeat(last_sent, session_low)
    reports += det.scan(now + 2)
    reports += det.scan(now + 3)
    assert sorted(det.open_gaps()) == model.gaps()
    assert compacted_open(reports) == model.gaps()
    assert det.reported_open() == model.gaps()
    assert det.delivered == len(model.seen)
    assert det.below_window == model.below_window
    assert det.next_expected == model.next
    # The promise: every sent offset is delivered exactly once, or open, or reported EXPIRED,
    # or older than the first offset seen.
    delivered = model.seen
    open_offsets = {x for a, b in model.gaps() for x in range(a, b + 1)}
    expired = {
        x for r in reports if r.state is GapState.EXPIRED for x in range(r.first, r.last + 1)
    }
    assert not delivered & open_offsets
    if model.first is not None:
        for o in range(model.first, last_sent + 1):
            assert o in delivered or o in open_offsets or o in expired, o
    if low_in_time:
        # Heartbeat lows (docs/gaps.md): the lost head of the session is accounted for as well.
        assert model.first is not None
        assert model.first <= session_low
    return reports


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_observe_matches_the_reference_model(scenario) -> None:
    run_both(*scenario, batched=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_observe_many_matches_the_reference_model(scenario) -> None:
    run_both(*scenario, batched=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_observe_many_equals_sequence_of_observe(scenario, data) -> None:
    ws, mw, mxe, _last, ops, _low = scenario
    offsets = [arg for op, arg in ops if op == "obs"]
    config = DetectorConfig(window_size=ws, max_windows=mw, max_expired_gaps=mxe)
    one = PartitionDetector("t", 0, config)
    many = PartitionDetector("t", 0, config)
    expected = [one.observe(o, 1) for o in offsets]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(offsets)), max_size=4)))
    got: list[bool] = []
    for a, b in zip([0, *cuts], [*cuts, len(offsets)], strict=True):
        got += many.observe_many(offsets[a:b], 1)
    assert got == expected
    assert same_state(many, one)
    assert many.drain_reports() == one.drain_reports()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 10_000))
def test_round_trip_mid_stream_gives_identical_behaviour(scenario, cut_seed) -> None:
    ws, mw, mxe, last_sent, ops, _low = scenario
    config = DetectorConfig(window_size=ws, max_windows=mw, max_expired_gaps=mxe)
    cut = cut_seed % (len(ops) + 1)

    def play(det, part, t0):
        out = []
        for i, (op, arg) in enumerate(part):
            now = t0 + i
            if op == "obs":
                out.append(det.observe(arg, now))
            elif op == "scan":
                out.append(det.scan(now))
            elif op == "hb":
                det.heartbeat(arg[0], now, arg[1])
        det.heartbeat(last_sent, 10**6)
        out += [det.scan(10**6 + 1), det.scan(10**6 + 2)]
        return out

    a = PartitionDetector("t", 0, config)
    b = PartitionDetector("t", 0, config)
    play_prefix = ops[:cut]
    for i, (op, arg) in enumerate(play_prefix):
        for det in (a, b):
            if op == "obs":
                det.observe(arg, i)
            elif op == "scan":
                det.scan(i)
            elif op == "hb":
                det.heartbeat(arg[0], i, arg[1])
    assert a.drain_reports() == b.drain_reports()
    restored = PartitionDetector.from_bytes(b.to_bytes(), config)
    assert same_state(restored, a)
    assert play(a, ops[cut:], cut) == play(restored, ops[cut:], cut)
