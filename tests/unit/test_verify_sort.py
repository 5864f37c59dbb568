"""How ``kafka_diode.verify`` sorts upstream records against the clean topic (pure: no Kafka)."""

from __future__ import annotations

from kafka_diode.verify import Message, Verdict, sort_records


def msg(topic: str, partition: int, offset: int, seq: int) -> Message:
    return Message(
        topic, partition, offset, b"k", b"v%d" % seq, (("seq", b"%d" % seq),), 1000 + seq
    )


def sort(upstream: list[Message], clean: list[Message], gaps=None) -> Verdict:
    verdict = Verdict()
    sort_records(verdict, upstream, clean, 3, gaps or {})
    return verdict


def test_each_record_delivered_once_is_exactly_once() -> None:
    upstream = [msg("t", 1, o, o) for o in range(5)]
    clean = [msg("clean", 1, o, o) for o in range(5)]
    verdict = sort(upstream, clean)
    assert (verdict.produced, verdict.exactly_once, verdict.duplicated) == (5, 5, 0)
    assert verdict.promise_kept


def test_a_record_written_twice_upstream_and_carried_twice_is_not_a_duplicate() -> None:
    """A producer's retry across a leader change wrote seq 7 at offsets 7 and 8 (seen in a
    rolling restart of the upstream cluster): the link carries each offset once."""
    upstream = [msg("t", 0, 7, 7), msg("t", 0, 8, 7)]
    clean = [msg("clean", 0, 0, 7), msg("clean", 0, 1, 7)]
    verdict = sort(upstream, clean)
    assert (verdict.exactly_once, verdict.duplicated, verdict.missing_silent) == (2, 0, 0)
    assert verdict.ok


def test_more_copies_in_clean_than_upstream_holds_are_duplicates() -> None:
    upstream = [msg("t", 0, 7, 7), msg("t", 0, 8, 7), msg("t", 0, 9, 9)]
    clean = [msg("clean", 0, o, 7) for o in range(3)] + [msg("clean", 0, 3, 9)]
    verdict = sort(upstream, clean)
    assert (verdict.duplicated, verdict.exactly_once) == (2, 1)
    assert not verdict.promise_kept


def test_fewer_copies_in_clean_leave_the_later_offsets_missing() -> None:
    upstream = [msg("t", 0, 7, 7), msg("t", 0, 8, 7)]
    clean = [msg("clean", 0, 0, 7)]
    silent = sort(upstream, clean)
    assert (silent.exactly_once, silent.missing_silent) == (1, 1)
    assert silent.examples == ["t:0:8 missing, no gap"]
    reported = sort(upstream, clean, {("t", 0): [(8, 8)]})
    assert (reported.exactly_once, reported.missing_reported, reported.missing_silent) == (1, 1, 0)


def test_a_record_in_another_clean_partition_is_misplaced() -> None:
    verdict = sort([msg("t", 1, 0, 0)], [msg("clean", 2, 0, 0)])
    assert (verdict.wrong_partition, verdict.exactly_once) == (1, 0)
    assert not verdict.promise_kept


def test_the_delivered_offsets_are_returned_for_false_gap_checks() -> None:
    verdict = Verdict()
    upstream = [msg("t", 0, 0, 0), msg("t", 0, 1, 1)]
    delivered = sort_records(verdict, upstream, [msg("clean", 0, 0, 1)], 3, {})
    assert delivered == {("t", 0, 1)}
