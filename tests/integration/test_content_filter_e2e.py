"""The content filter end to end: real brokers, a real sender and receiver process, the real
dedup on Spark (``kafka-diode dedup`` as a subprocess).

The sender withholds by value, key, header name and an inline rule; a rule that times out keeps
its records back too (fail closed); the rules file is then changed while the sender runs and the
new rule applies without a restart. Downstream: the clean topic holds exactly the allowed
records, once; every withheld offset is on the raw topic as a withheld range and never becomes a
gap, so it would never be put in a resend bundle; the records the failing rule kept back are
exactly the gaps (an error is not a policy decision: a resend with a fixed rule brings them).
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from common.raw_topic import CONTROL_HEADER, WITHHELD, parse_raw_key
from common.wire import KeyRing, RecordBatch, Withheld
from sender import resend_cli
from tests.integration.receiver_process import ReceiverProcess, start_sender, write_key_file
from tests.integration.test_bundle_resend import _drain, _resend, _signed, ring, udp_sink
from tests.integration.test_dedup import finish, job_env, run_dedup
from tests.kafka_helpers import Record, consume_all, create_topic, produce_records, wait_until

pytestmark = [pytest.mark.kafka]
__all__ = ["ring", "udp_sink"]  # fixtures shared with test_bundle_resend

RULES = """# the site's export policy
deny value secret
deny key ^internal-
deny header ^x-classified$
allow value (x+x+)+y
"""


def _record(i: int) -> tuple[Record, bool | None]:
    """Record ``i`` of the first batch and whether the filter lets it through (None: the rule
    fails on it)."""
    key, value, headers = f"k{i}".encode(), f"public {i}".encode(), ()
    allowed = True
    if i % 5 == 0:
        value, allowed = f"a secret {i}".encode(), False
    elif i % 7 == 0:
        key, allowed = f"internal-{i}".encode(), False
    elif i % 11 == 0:
        headers, allowed = (("x-classified", b"1"),), False
    elif i % 13 == 0:
        value, allowed = b"drop-inline %d" % i, False
    elif i % 17 == 0:
        value, allowed = b"x" * 6000, None  # the allow rule runs over its time: fail closed
    return Record(key=key, value=value, headers=headers, partition=i % 2), allowed


def _raw_view(broker: Any, raw: str) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(data offsets, withheld offsets) per source partition as the raw topic holds them."""
    data, held = set(), set()
    for r in consume_all(broker, raw, timeout=30, expand_runs=True):
        parsed = parse_raw_key(r.key)
        assert parsed is not None
        _, partition, offset = parsed
        if r.headers and r.headers[-1] == (CONTROL_HEADER, WITHHELD):
            last = json.loads(r.value)["last"]
            held |= {(partition, o) for o in range(offset, last + 1)}
        elif not r.headers or r.headers[-1][0] != CONTROL_HEADER:
            data.add((partition, offset))
    return data, held


@pytest.mark.spark
def test_filtered_records_never_cross_never_become_gaps_and_rules_reload_live(
    upstream_kafka: Any,
    downstream_kafka: Any,
    kafka_topic: Any,
    group_id: str,
    tmp_path: Path,
) -> None:
    source = kafka_topic(upstream_kafka, partitions=2)
    raw = kafka_topic(downstream_kafka, partitions=2)
    first = [_record(i) for i in range(400)]
    positions = produce_records(upstream_kafka, source, [r for r, _ in first])
    allowed = {pos for pos, (_, ok) in zip(positions, first, strict=True) if ok}
    failed = {pos for pos, (_, ok) in zip(positions, first, strict=True) if ok is None}
    withheld = set(positions) - allowed - failed
    assert 100 < len(withheld) < 300
    assert len(failed) >= 5
    rules = tmp_path / "filter.rules"
    rules.write_text(RULES)
    key_file = tmp_path / "keys.json"
    write_key_file(key_file)
    log = tmp_path / "sender.log"
    with ReceiverProcess(downstream_kafka.bootstrap, raw, tmp_path, key_file=key_file) as rx:
        sender = start_sender(
            upstream_kafka.bootstrap, rx.port, source, group_id, key_file, log,
            "--filter-file", str(rules), "--filter-rules", "deny value ^drop-inline",
            "--filter-timeout-ms", "5", "--filter-check-interval", "0.2",
            "--heartbeat-interval", "0.5", "--rate-bytes", "20000000",
        )  # fmt: skip
        try:
            wait_until(
                lambda: _raw_view(downstream_kafka, raw) == (allowed, withheld),
                120,
                interval=1.0,
                message="the first batch on the raw topic: records and withheld ranges",
            )
            # A new rule, picked up without a restart: records of the second batch that
            # match it are withheld from then on.
            rules.write_text(RULES + "deny value ^late-secret\n")
            wait_until(
                lambda: "filter file changed: content filter reloaded" in log.read_text(),
                30,
                message="the sender reloaded its rules",
            )
            second = [
                Record(key=b"late%d" % i, value=b"late-%s %d" % (b"secret" if i % 2 else b"ok", i))
                for i in range(40)
            ]
            late = produce_records(upstream_kafka, source, second)
            for pos, rec in zip(late, second, strict=True):
                (withheld if b"secret" in (rec.value or b"") else allowed).add(pos)
            wait_until(
                lambda: _raw_view(downstream_kafka, raw) == (allowed, withheld),
                120,
                interval=1.0,
                message="the second batch filtered by the reloaded rules",
            )
            wait_until(lambda: rx.metric("heartbeats_total") >= 2, 60, message="heartbeats")
        finally:
            sender.send_signal(signal.SIGTERM)
            assert sender.wait(60) == 0, log.read_text()[-3000:]
        assert rx.metric("withheld_ranges_total") > 0
        assert rx.drops() == {}
        assert rx.terminate() == 0
    text = log.read_text()
    assert "content filter: a rule failed or ran over 5 ms" in text  # fail closed, logged

    env = job_env(downstream_kafka.bootstrap, raw, tmp_path, raw)
    finish(run_dedup(env, "--until-settled"))
    clean = consume_all(downstream_kafka, f"clean.{raw}.{source}", expected_count=len(allowed))
    assert len(clean) == len(allowed)
    assert all(b"secret" not in (r.value or b"") for r in clean)
    assert all(not (r.key or b"").startswith(b"internal-") for r in clean)
    assert all(not any(n == "x-classified" for n, _ in r.headers) for r in clean)
    gaps = consume_all(downstream_kafka, f"gaps.{raw}", timeout=10)
    reported = {
        (g["partition"], o)
        for g in (json.loads(r.value) for r in gaps if r.value is not None)
        if g["state"] == "open"
        for o in range(g["first"], g["last"] + 1)
    }
    assert reported == failed


def test_resend_withholds_what_the_live_sender_would_and_reports_it(
    upstream_kafka: Any,
    ring: tuple[Path, KeyRing],
    tmp_path: Path,
    udp_sink: socket.socket,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key_file, keyring = ring
    source = create_topic(upstream_kafka, partitions=1)
    produce_records(
        upstream_kafka,
        source,
        [Record(key=b"k", value=b"secret" if i % 3 == 0 else b"v%d" % i) for i in range(30)],
    )
    bundle = _signed(tmp_path, keyring, [(source, 0, 0, 11)])
    code = _resend(
        upstream_kafka.bootstrap, udp_sink, key_file,
        "--bundle", str(bundle), "--filter-rules", "deny value ^secret$",
    )  # fmt: skip
    assert code == resend_cli.EXIT_OK
    events = _drain(udp_sink, keyring)
    sent = sorted(r.offset for e in events if isinstance(e, RecordBatch) for r in e.records)
    held = sorted(
        o
        for e in events
        if isinstance(e, Withheld)
        for _, _, first, last in e.ranges
        for o in range(first, last + 1)
    )
    assert sent == [1, 2, 4, 5, 7, 8, 10, 11]
    assert held == [0, 3, 6, 9]
    report = capsys.readouterr().out
    assert "sent 8  withheld 4  unrecoverable 0" in report
