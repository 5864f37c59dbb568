"""The receiver's FEC margin histogram: what the KafkaDiodeFecMarginLow rule reads."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.wire.fec import MARGIN_BUCKETS
from receiver.metrics import Gauges, ReceiverStats, make_registry

NAME = "kafka_diode_receiver_fec_margin_used"


def _samples(gauges: Gauges) -> dict[str, float]:
    text = generate_latest(make_registry(ReceiverStats(), gauges)).decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == NAME:
            for sample in family.samples:
                le = sample.labels.get("le")
                out[sample.name + (f"{{le={le}}}" if le else "")] = sample.value
    return out


def test_buckets_are_cumulative_with_sum_and_count() -> None:
    counts = [50, 30, 10, 5, 3, 2]  # per bucket; the last: failed blocks (share above 1)
    got = _samples(Gauges(fec_margin=lambda: (counts, 31.5)))
    assert got == {
        f"{NAME}_bucket{{le=0}}": 50,
        f"{NAME}_bucket{{le=0.25}}": 80,
        f"{NAME}_bucket{{le=0.5}}": 90,
        f"{NAME}_bucket{{le=0.75}}": 95,
        f"{NAME}_bucket{{le=1}}": 98,
        f"{NAME}_bucket{{le=+Inf}}": 100,
        f"{NAME}_count": 100,
        f"{NAME}_sum": 31.5,
    }


def test_exported_at_zero_without_fec() -> None:
    got = _samples(Gauges())
    assert len(got) == len(MARGIN_BUCKETS) + 3  # the buckets, +Inf, _count and _sum
    assert set(got.values()) == {0.0}
