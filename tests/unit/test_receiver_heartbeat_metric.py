"""The receiver's last-heartbeat timestamp: the input of the "link silent" alert."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from receiver.metrics import Gauges, ReceiverCollector, ReceiverStats

NAME = "kafka_diode_receiver_last_heartbeat_timestamp_seconds"


def _value(registry: CollectorRegistry) -> float:
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(NAME + " "):
            return float(line.split()[1])
    raise AssertionError(f"{NAME} not exported")


def test_timestamp_moves_only_when_a_heartbeat_arrived_between_scrapes() -> None:
    now = [1000.0]
    stats = ReceiverStats()
    registry = CollectorRegistry()
    registry.register(ReceiverCollector(stats, Gauges(), clock=lambda: now[0]))
    assert _value(registry) == 1000.0  # none yet: the process start
    now[0] = 1005.0
    assert _value(registry) == 1000.0
    stats.heartbeats += 1
    now[0] = 1007.0
    assert _value(registry) == 1007.0
    now[0] = 1060.0
    assert _value(registry) == 1007.0  # silent since: the alert's time() - value grows
    stats.heartbeats += 3
    now[0] = 1061.0
    assert _value(registry) == 1061.0
