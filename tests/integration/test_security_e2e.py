"""Every component against SASL_SSL brokers (issue 25 item 3): a secured broker on each side
(TLS listener with certificates made by ``cryptography``, SCRAM-SHA-512 users); sender, netem relay,
receiver, dedup (Spark's Java Kafka source and librdkafka in the same job), bundle, resend and
``kafka-diode gaps`` connect with the properties docs/security.md gives, and the promise holds over
a lossy link. The components' password appears in no log, no ``--check-config`` output and no
metrics endpoint."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from kafka_diode.pipeline import Pipeline, PipelineSpec

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def _diode(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_diode", *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_whole_system_on_sasl_ssl_brokers_keeps_the_promise_and_its_secrets(
    tmp_path: Path,
) -> None:
    spec = PipelineSpec(
        records=4000, profile="demo", seed=7, security="sasl_ssl", gap_emit_interval=1.0,
        persist_interval_ms=500, heartbeat_interval=0.5,
    )  # fmt: skip
    with Pipeline(spec, tmp_path / "run") as p:
        p.setup()
        down = p.security["downstream"]
        assert down is not None
        secrets = {down.client.password, down.admin.password}
        up = p.security["upstream"]
        assert up is not None
        secrets |= {up.client.password, up.admin.password}

        # the brokers refuse a client without TLS + SCRAM
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": p.ep.downstream, "log_level": 0}).list_topics(
                timeout=5
            )

        p.start_components(receiver_first=True)
        p.produce()
        verdict = p.wait_settled(timeout=300)
        passes = 0
        while not verdict.ok and verdict.promise_kept and passes < 3:
            passes += 1
            p.resend_pass()  # bundle create (downstream) + resend (upstream), both secured
            verdict = p.wait_settled(timeout=300, want_ok=True, stable_for=20)
        assert verdict.ok, verdict.line()
        assert verdict.produced == verdict.exactly_once == 4000

        env = p._env()  # the components' environment, secrets included
        gaps = _diode(env, "gaps", "--bootstrap-servers", p.ep.downstream,
                      "--gap-topic", p.ep.gap_topic)  # fmt: skip
        assert gaps.returncode == 0, gaps.stderr

        # --check-config of every long-running component shows the settings, never the password
        checks = [
            _diode(env, "send", "--bootstrap-servers", p.ep.upstream, "--target", "127.0.0.1:9",
                   "--topics", "t", "--key-file", str(p.ep.key_file), "--check-config"),
            _diode(env, "receive", "--bootstrap-servers", p.ep.downstream,
                   "--key-file", str(p.ep.key_file), "--check-config"),
            _diode({**p.dedup_env(), **env}, "dedup", "--check-config"),
        ]  # fmt: skip
        for check in checks:
            assert check.returncode == 0, check.stderr
            assert "sasl" in (check.stdout + check.stderr).lower()
        metrics = []
        for port in p.ep.metrics.values():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                metrics.append(resp.read().decode())
        logs = {
            path.name: path.read_text(errors="replace") for path in p.group.log_dir.glob("*.log")
        }
        assert {"sender.log", "receiver.log", "dedup.log", "bundle.log", "resend.log"} <= set(logs)
        texts = {
            **logs,
            **{f"check-{i}": c.stdout + c.stderr for i, c in enumerate(checks)},
            "gaps": gaps.stdout + gaps.stderr,
            **{f"metrics-{i}": m for i, m in enumerate(metrics)},
        }
        for name, text in texts.items():
            for secret in secrets:
                assert secret not in text, f"a password appears in {name}"
