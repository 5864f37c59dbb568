"""The heartbeat's content and schedule (sender/heartbeat.py), pure: a fake clock, no sockets."""

from sender.heartbeat import Beat, HeartbeatSchedule, assemble

SENT_HIGH = {("b", 1): 40, ("a", 0): 99, ("a", 2): 7}
LOW = {("a", 0): 10, ("a", 2): 0, ("b", 1): 30, ("c", 0): 5}


def _beat(*, assigned: set[tuple[str, int]], final: bool = False, sent_at_ms: int = 2) -> Beat:
    return assemble(
        sender_id="high-1",
        started_at_ms=1,
        sent_at_ms=sent_at_ms,
        sent_high=SENT_HIGH,
        low_offsets=LOW,
        assigned=assigned,
        final=final,
        counters={"records_sent": 3, "bytes_sent": 9},
    )


def test_a_beat_reports_the_assigned_partitions_sorted_with_their_low_offsets() -> None:
    beat = _beat(assigned={("a", 0), ("b", 1), ("z", 9)})
    assert beat == Beat(
        sender_id="high-1",
        started_at_ms=1,
        sent_at_ms=2,
        high_offsets=(("a", 0, 99), ("b", 1, 40)),
        low_offsets=(("a", 0, 10), ("b", 1, 30)),
        counters=(("bytes_sent", 9), ("records_sent", 3)),
    )


def test_the_final_beat_reports_every_partition_sent_from_even_when_revoked() -> None:
    beat = _beat(assigned=set(), final=True)
    assert beat.high_offsets == (("a", 0, 99), ("a", 2, 7), ("b", 1, 40))
    assert beat.low_offsets == (("a", 0, 10), ("a", 2, 0), ("b", 1, 30))
    # a partition read but never sent from ("c", 0) is not reported
    assert all(t != "c" for t, _, _ in beat.high_offsets)


def test_nothing_assigned_nothing_reported_but_the_counters() -> None:
    beat = _beat(assigned=set())
    assert (beat.high_offsets, beat.low_offsets) == ((), ())
    assert beat.counters == (("bytes_sent", 9), ("records_sent", 3))


def test_sent_at_is_the_wall_time_given() -> None:
    assert _beat(assigned=set(), sent_at_ms=1_700_000_000_123).sent_at_ms == 1_700_000_000_123


def test_ticks_come_every_interval_on_a_fake_clock() -> None:
    schedule = HeartbeatSchedule(2.0)
    assert schedule.delay(100.0) == 0.0  # the first tick is due at once
    assert schedule.tick(100.0, control_pending=0)
    assert schedule.delay(100.5) == 1.5
    assert not schedule.tick(101.9, control_pending=0)  # early: not due yet
    assert schedule.tick(102.0, control_pending=0)
    assert schedule.next_at == 104.0
    assert schedule.tick(107.5, control_pending=0)  # late (a busy loop): the next is 2 s on
    assert schedule.next_at == 109.5


def test_a_tick_sends_nothing_while_an_earlier_heartbeat_waits_for_the_pacer() -> None:
    schedule = HeartbeatSchedule(1.0)
    assert not schedule.tick(0.0, control_pending=2)  # skipped, not postponed:
    assert schedule.next_at == 1.0  # the next tick is still one interval on
    assert not schedule.tick(1.0, control_pending=1)
    assert schedule.tick(2.0, control_pending=0)
