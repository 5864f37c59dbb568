"""The receiver at its defaults inside the unit's ``MemoryMax=1G`` while downstream Kafka is away
(slow, ~2 minutes; needs a writable memory cgroup, i.e. root).

A backlog of 800 MB of 10 KB records arrives at 40 MB/s after the downstream broker stopped: the
producer queue fills (``buffer_max_bytes``, 512 MiB), then the backlog (``backlog_max_bytes``,
64 MiB), then records overflow with the loss report. The receiver must stay alive inside the
limit (measured: a peak of ~680 MiB). With the backlog bounded in records alone (100,000 records
of 10 KB, 1 GB), 1.2 GB of them took it past 1 GiB 30 s into the outage, the kernel killed it and
everything it held was lost; here that backlog would still hold all 800 MB and report no overflow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.pipeline import Pipeline, PipelineSpec
from tests.cgroup_helpers import MIB, enter_then_exec, limited_cgroup, needs_memory_cgroup
from tests.chaos.harness import scrape
from tests.kafka_helpers import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow, needs_memory_cgroup]

UNIT_MEMORY_MAX_MIB = 1024  # packaging/systemd/kafka-diode-receiver@.service


def _peak(procs: Path) -> int:
    """The cgroup's peak memory in bytes (v1's ``max_usage_in_bytes``, v2's ``peak``)."""
    group = procs.parent
    v1 = group / "memory.max_usage_in_bytes"
    return int((v1 if v1.exists() else group / "memory.peak").read_text())


def test_a_downstream_outage_overflows_inside_the_units_memory_limit(
    upstream_kafka: LocalBroker, tmp_path: Path
) -> None:
    down = LocalBroker(f"rxmem-{free_port()}", free_port(), data_dir=tmp_path / "down")
    down.start()
    spec = PipelineSpec(
        records=80_000, value_size=10_000, profile=None, rate_bytes=40_000_000, run_dedup=False
    )
    try:
        with (
            limited_cgroup(UNIT_MEMORY_MAX_MIB) as procs,
            Pipeline(
                spec, tmp_path / "run", upstream=upstream_kafka.bootstrap, downstream=down.bootstrap
            ) as p,
        ):
            p.setup()
            assert p.produce() == spec.records
            env = p.component_env()
            receiver = p.group.add("receiver", enter_then_exec(procs, p.receiver_argv()), env=env)
            wait_until(lambda: "receiving on" in receiver.log_path.read_text(), timeout=120)
            down.stop()
            p.group.add("sender", p.sender_argv(), env=env)

            port = p.ep.metrics["receiver"]

            def decoded_all() -> bool:
                assert receiver.proc is not None
                assert receiver.proc.poll() is None, (
                    f"the receiver died at {_peak(procs) // MIB} MiB"
                )
                return scrape(port).get("kafka_diode_receiver_records_total", 0) >= spec.records

            # every record arrived: held up to the bounds, the rest overflowed; the receiver lives
            wait_until(decoded_all, timeout=300, interval=1.0, message="every record decoded")
            assert "downstream buffers full" in receiver.log_path.read_text()
            peak = _peak(procs)
    finally:
        down.stop()
    assert peak < UNIT_MEMORY_MAX_MIB * MIB * 0.9, peak // MIB
