"""A real Prometheus (Debian's package) scraping a running pipeline with the shipped alert rules.

Every component (sender, relay, receiver, dedup) runs as its own process with ``--metrics-port``;
Prometheus scrapes them every second and evaluates packaging/prometheus/kafka-diode.rules.yml
every second. While the pipeline runs, every query of the Grafana dashboard must return data;
then the sender is stopped and KafkaDiodeLinkSilent must fire, read from the alerts API.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_diode.local_kafka.broker import free_port
from kafka_diode.processes import ManagedProcess, wait_until
from tests.prometheus_support import RULES, dashboard_queries, prometheus_binary

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


class Prometheus:
    """One Prometheus server in a temporary directory, on a free loopback port."""

    def __init__(self, work: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "kafka-diode",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": {"component": name}}
                        for name, port in sorted(targets.items())
                    ],
                }
            ],
        }
        work.mkdir(parents=True, exist_ok=True)
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = ManagedProcess(
            "prometheus",
            [
                prometheus_binary(),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            log_dir=work,
        )

    def __enter__(self) -> Prometheus:
        self.proc.start()
        wait_until(self._ready, timeout=60, what="prometheus ready", alive=[self.proc])
        return self

    def __exit__(self, *_exc: object) -> None:
        self.proc.stop()

    def _get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar as a one-element list) ``expr`` evaluates to now."""
        answer = self._get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        data = answer["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts."""
        return list(self._get("/api/v1/alerts")["data"]["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules")["data"]["groups"])

    def firing(self, name: str, **labels: str) -> bool:
        return any(
            a["labels"].get("alertname") == name
            and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())
            for a in self.alerts()
        )


def test_dashboard_queries_have_data_and_link_silent_fires_when_the_sender_stops(
    upstream_kafka: Any, downstream_kafka: Any, tmp_path: Path
) -> None:
    from kafka_diode.pipeline import Pipeline, PipelineSpec  # noqa: PLC0415  heavy imports

    # "demo" loses and reorders a little: drops, gaps and relay events all have series
    spec = PipelineSpec(
        records=3000,
        topics=("orders", "audit_log"),
        partitions=2,
        profile="demo",
        produce_rate=500.0,
        heartbeat_interval=0.5,
        gap_emit_interval=1.0,
    )
    queries = dashboard_queries()
    assert len(queries) > 20, "the dashboard lost its queries"
    with Pipeline(
        spec,
        tmp_path / "pipe",
        upstream=upstream_kafka.bootstrap,
        downstream=downstream_kafka.bootstrap,
    ) as pipe:
        pipe.setup()
        pipe.start_components(receiver_first=True)
        components = ("sender", "relay", "receiver", "dedup")
        assert set(pipe.ep.metrics) == set(components)
        alive = list(pipe.group.processes.values())
        with Prometheus(tmp_path / "prometheus", pipe.ep.metrics) as prom:
            loaded = {r["name"] for g in prom.rule_groups() for r in g["rules"]}
            assert {"KafkaDiodeLinkSilent", "KafkaDiodeComponentDown"} <= loaded
            assert pipe.produce() == spec.records

            def all_up() -> bool:
                up = prom.query('up{job="kafka-diode"} == 1')
                return {s["metric"]["component"] for s in up} == set(components)

            wait_until(all_up, timeout=240, what="every component scraped", alive=alive)

            empty: list[str] = []

            def dashboard_has_data() -> bool:
                empty[:] = [q for q in queries if not prom.query(q)]
                return not empty

            try:
                wait_until(
                    dashboard_has_data,
                    timeout=240,
                    interval=2.0,
                    what="dashboard data",
                    alive=alive,
                )
            except TimeoutError:
                pytest.fail(f"dashboard queries without data: {empty}")

            # the dedup's raw-position series, with the log start asked from the real broker
            raw = f'{{topic="{pipe.ep.raw_topic}"}}'
            wait_until(
                lambda: all(
                    prom.query(f"kafka_diode_dedup_raw_{name}{raw}")
                    for name in ("next_offset", "latest_offset", "log_start_offset")
                ),
                # the first progress comes with the dedup's first batch: Spark's start-up on a
                # loaded 2-core host takes longer than the other components' first scrape
                timeout=240,
                what="raw position series",
                alive=alive,
            )

            # a healthy link: heartbeats cross, nothing about silence is pending or firing
            assert prom.query("kafka_diode_receiver_last_heartbeat_timestamp_seconds")
            assert not [
                a for a in prom.alerts() if a["labels"]["alertname"] == "KafkaDiodeLinkSilent"
            ]

            pipe.group["sender"].stop()
            wait_until(
                lambda: prom.firing("KafkaDiodeLinkSilent", component="receiver"),
                timeout=120,
                interval=1.0,
                what="KafkaDiodeLinkSilent to fire",
            )
            # the stopped sender is also seen as down (pending until its 1 min has passed)
            assert any(
                a["labels"]["alertname"] == "KafkaDiodeComponentDown"
                and a["labels"].get("component") == "sender"
                for a in prom.alerts()
            )
