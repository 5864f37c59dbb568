"""Public-key mode metrics: the sender's session keys and announcements, the receiver's held
datagrams and learned keys."""

from __future__ import annotations

from receiver.metrics import Gauges, ReceiverStats, make_registry
from sender.metrics import SenderMetrics


def test_sender_exports_session_keys_and_announcements() -> None:
    metrics = SenderMetrics()
    metrics.sync({"announcements_sent": 12, "session_keys": 3}, {})
    metrics.sync({"announcements_sent": 15, "session_keys": 3}, {})
    get = metrics.registry.get_sample_value
    assert get("kafka_diode_sender_announcements_sent_total") == 15
    assert get("kafka_diode_sender_session_keys_total") == 3


def test_receiver_exports_held_datagrams_and_learned_keys() -> None:
    stats = ReceiverStats()
    stats.session_keys_learned = 6
    registry = make_registry(stats, Gauges(held_datagrams=lambda: 7))
    assert registry.get_sample_value("kafka_diode_receiver_held_datagrams") == 7
    assert registry.get_sample_value("kafka_diode_receiver_session_keys_learned_total") == 6
