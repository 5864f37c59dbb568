"""The chaos suite: the whole system under a bad link and process faults, judged record by record.

Each scenario runs real ``kafka-diode`` processes (sender, netem relay, receiver, Spark dedup,
bundle, resend) against the session's two real brokers and checks the promise (docs/design.md, "The
promise") from the topics alone: every produced record is in its clean topic exactly once with
identical key, value, headers and timestamp, or inside a reported gap; every reported gap is really
missing; no clean record is anything but an upstream record; and after at most three resend passes
nothing is missing at all.
Scenarios are named and seeded; the figures go to the results file (tests/chaos/conftest.py).

``make test`` runs the scenarios not marked ``slow`` (CI); ``make chaos`` runs all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker
from tests.chaos.harness import Run, Scenario, append_result, check

# Fault scenarios spread production over a while so the fault lands mid-stream; the dedup one
# longest, because its first output only appears once Spark is up (~15-20 s).
SCENARIOS: list[tuple[Scenario, bool]] = [
    # The CI subset first (not slow), then the rest of the matrix.
    (Scenario(name="hostile", profile="hostile", seed=170, resend_copies=2), False),
    # slow since the CI failover case came (CI time): a dedup SIGKILL + restart stays in CI in
    # tests/integration/test_dedup.py (real Kafka) and test_dedup_cluster.py (standalone cluster)
    (Scenario(name="dedup-sigkill", fault="dedup-sigkill", seed=190, produce_seconds=30), True),
    (Scenario(name="loss-1", profile="lossy-1", seed=101), True),
    (Scenario(name="loss-5", profile="lossy-5", seed=105), True),
    # A fifth of the datagrams is lost: the resend crosses the same link, so it sends 3 copies.
    (Scenario(name="loss-20", profile="lossy-20", seed=120, resend_copies=3), True),
    (Scenario(name="bursty-loss", profile="bursty", seed=130), True),
    (Scenario(name="duplicate-10", profile="duplicate-10", seed=140), True),
    (Scenario(name="reorder-heavy", profile="reorder-heavy", seed=150), True),
    (Scenario(name="corrupt-1", profile="corrupt-1", seed=160, check_integrity_drops=True), True),
    (
        Scenario(name="receiver-sigkill", fault="receiver-sigkill", seed=180, produce_seconds=10),
        True,
    ),
    (
        Scenario(
            name="downstream-broker-restart",
            fault="downstream-broker-restart",
            seed=200,
            produce_seconds=10,
        ),
        True,
    ),
    (Scenario(name="sender-sigkill", fault="sender-sigkill", seed=210, produce_seconds=10), True),
]


def _param(scenario: Scenario, slow: bool) -> object:
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(scenario, id=scenario.name, marks=marks)


@pytest.mark.chaos
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("scenario", [_param(s, slow) for s, slow in SCENARIOS])
def test_scenario(
    scenario: Scenario,
    upstream_kafka: LocalBroker,
    downstream_kafka: LocalBroker,
    chaos_results: Path,
    tmp_path: Path,
) -> None:
    run = Run(scenario, tmp_path, upstream=upstream_kafka, downstream=downstream_kafka)
    outcome = run.execute()
    append_result(chaos_results, outcome)
    check(run, outcome, fail=pytest.fail)
