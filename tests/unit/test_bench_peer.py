"""The pure helpers of bench/peer.py (the benchmark itself is not part of CI)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.peer import (
    WarmupCount,
    cpu_by_program,
    is_control,
    main,
    ratios,
    render_properties,
    source_offsets,
    summarize,
    value_seq,
)


def test_properties_render_one_line_each_with_lowercase_booleans() -> None:
    text = render_properties(
        {"encryption": True, "enableRxqOvfl": False, "batchSize": 512, "topic": "a.b"},
        comment="made by\nthe bench",
    )
    assert text == (
        "# made by\n# the bench\nencryption=true\nenableRxqOvfl=false\nbatchSize=512\ntopic=a.b\n"
    )


@pytest.mark.parametrize(
    ("key", "value"), [("a=b", "x"), ("a b", "x"), ("#a", "x"), ("", "x"), ("a", "x\ny")]
)
def test_properties_refuse_what_cannot_be_written(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=r"cannot be written|line break"):
        render_properties({key: value})


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (b"t.x:2:17", (2, range(17, 18))),  # ours, raw layout v1
        (b"t.x:1:10-14", (1, range(10, 15))),  # ours, a v2 run
        (b"t.x:0:10-14/2", (0, range(10, 15, 2))),  # ours, a run with a stride
        (b"t.x_2_17", (2, range(17, 18))),  # the peer's topic_partition_offset
        ("my_topic_0_5", None),  # another topic (the peer's key splits on the last two "_")
        (b"t.x:0:-1", None),  # a control record
        (b"other:0:1-2", None),
        (b"t.x_a_1", None),
        (None, None),
    ],
)
def test_source_offsets_of_every_key_form(
    key: bytes | str | None, expected: tuple[int, range] | None
) -> None:
    assert source_offsets(key, "t.x") == expected


def test_source_offsets_peer_topic_with_underscores() -> None:
    assert source_offsets("my_topic_0_5", "my_topic") == (0, range(5, 6))


def test_control_records_are_told_by_their_header() -> None:
    assert is_control([("diode.control", b"heartbeat")])
    assert not is_control([("diode.key", b"k1"), ("diode.timestamp", b"1")])
    assert not is_control(None)


def test_value_seq() -> None:
    assert value_seq(b"b000000042 GET /x") == ("b", 42)
    assert value_seq(b"w000000001 ") == ("w", 1)
    assert value_seq(b"x000000001 ") is None
    assert value_seq(b"b00000004") is None
    assert value_seq(None) is None


def test_ratios_are_ours_over_peer_and_none_without_a_figure() -> None:
    got = ratios(
        {"clean_records_per_s": 30.0, "low_side_cpu_s_per_m": 10.0},
        {"clean_records_per_s": 20.0, "low_side_cpu_s_per_m": 0.0},
    )
    assert got["clean_rate"] == 1.5
    assert got["low_side_cpu_per_record"] is None
    assert got["raw_rate"] is None


def test_summary_leaves_out_the_warm_rounds_and_failed_runs() -> None:
    runs = [
        {"system": "ours", "clean_records_per_s": 1.0, "warm": True},
        {"system": "ours", "clean_records_per_s": 10.0, "warm": False},
        {"system": "ours", "clean_records_per_s": 30.0, "warm": False},
        {"system": "ours", "error": "RuntimeError: stalled", "warm": False},
        {"system": "peer", "clean_records_per_s": 5.0, "warm": False},
    ]
    ours = summarize(runs, "ours")
    assert ours["runs"] == 2.0
    assert ours["clean_records_per_s"] == 20.0
    assert summarize(runs, "peer")["clean_records_per_s"] == 5.0


def test_warmup_counts_distinct_records_and_ends_on_all_or_half_then_quiet() -> None:
    warm = WarmupCount()
    for seq in (0, 1, 1, 2):  # a record the dedup delivers twice counts once
        warm.add(seq, now=100.0)
    assert warm.count == 3
    assert not warm.done(4, now=100.0)
    assert warm.done(3, now=100.0)  # all of them
    # 3 of 6: half, but still arriving; then quiet for longer than QUIET_S
    assert not warm.done(6, now=100.0 + WarmupCount.QUIET_S)
    assert warm.done(6, now=100.1 + WarmupCount.QUIET_S)
    # fewer than half never ends the wait, however quiet
    assert not warm.done(7, now=1e9)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_cpu_by_program_tells_the_leader_from_its_python_children() -> None:
    """The dedup's split: its own process (the group's leader) apart from the workers it starts."""
    child = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys, time\n"
         f"subprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)"],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        split = cpu_by_program(leader.pid)
        while split["workers"] < 0.25 and time.monotonic() < deadline:
            split = cpu_by_program(leader.pid)
        assert set(split) == {"jvm", "driver", "workers"}
        assert split["workers"] >= 0.25
        assert split["jvm"] == 0.0
        assert split["driver"] < split["workers"]
    finally:
        leader.kill()
        leader.wait()


@pytest.mark.parametrize("flags", [["--warm-rounds", "-1"], ["--rounds", "0"]])
def test_round_counts_are_checked_before_anything_starts(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["/nonexistent-peer-src", *flags])
    assert exc.value.code == 2
    assert "--warm-rounds 0 or more" in capsys.readouterr().err
