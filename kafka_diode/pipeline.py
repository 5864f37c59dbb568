"""The whole system on one host: brokers, topics, keys and every component as a real process.

Used by ``kafka-diode demo``, the chaos suite and the end-to-end benchmark, so all three run the
same commands a user would (``kafka-diode send``, ``netem relay``, ``receive``, ``dedup``,
``bundle create``, ``resend``), each a separate process with its own log under ``work_dir/logs``.

    producer -> upstream broker -> sender -> relay (netem profile) -> receiver -> downstream broker
             -> dedup (Spark) -> clean topics + gap topic -> bundle -> resend -> sender path again

Topic names carry a per-run prefix so several pipelines can share two brokers (the test suite's).
Whether the promise holds is decided by ``kafka_diode.verify`` from the topics alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import ConfigError, ServiceError
from common.topic_limits import created_topic_config
from common.wire.config import WireConfig
from kafka_diode.local_kafka.broker import LocalBroker, free_port
from kafka_diode.local_kafka.cluster import MAX_NODES, LocalCluster
from kafka_diode.local_kafka.security import SecurityFiles, ensure_security, validate_security
from kafka_diode.processes import ManagedProcess, ProcessGroup, diode_command, wait_until
from kafka_diode.verify import Verdict, verify
from kafka_diode.workload import Workload, produce
from runtime import kafka
from runtime.kafka import TopicSpec

log = logging.getLogger(__name__)
#: Every component's default max_record_size (the pipeline does not change it).
DEFAULT_MAX_RECORD_SIZE = WireConfig().max_record_size
#: Most receiver ports a pipeline spreads a link over.
MAX_RECEIVER_PORTS = 8


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """What to run; every field has a demo-friendly default."""

    records: int = 20_000
    """Records to produce upstream."""
    topics: tuple[str, ...] = ("orders", "telemetry.site-1", "audit_log")
    """Upstream topic names (prefixed per run)."""
    partitions: int = 3
    """Partitions of every topic."""
    raw_partitions: int = 0
    """Partitions of the raw topic (0: ``partitions``)."""
    value_size: int = 200
    """Mean value size in bytes."""
    value_size_max: int = 0
    """With a value above ``value_size``: sizes log-uniform between the two (Workload)."""
    huge_every: int = 0
    """Every n-th record gets a value of ``huge_size`` bytes; 0: none."""
    huge_size: int = 0
    """Size of those values; topics are created to admit them."""
    text_values: bool = False
    """Log-like text values (compressible) instead of random bytes."""
    produce_rate: float | None = None
    """Records/s offered by the producer; None: as fast as it can."""
    profile: str | None = "demo"
    """netem profile for the relay between sender and receiver; None: no relay."""
    seed: int = 1
    """Seed for the workload and the relay."""
    compression: str = "none"
    """Sender compression: none, gzip or zstd."""
    copies: int = 1
    """Sender redundancy: copies of each datagram."""
    fec_overhead: float = 0.0
    """Sender forward error correction: repair datagrams per 100 datagrams (0: off)."""
    rate_bytes: float = 0.0
    """Sender pacing in bytes/s (0: unpaced)."""
    max_datagram_size: int = 0
    """Sender datagram size limit (0: the default, which fits a 1500-byte MTU)."""
    heartbeat_interval: float = 1.0
    """Sender heartbeat period in seconds."""
    window_size: int = 1000
    """Dedup WINDOW_SIZE."""
    max_windows: int = 1000
    """Dedup MAX_WINDOWS."""
    gap_emit_interval: float = 2.0
    """Dedup GAP_EMIT_INTERVAL_SEC."""
    persist_interval_ms: int = 1000
    """Dedup PERSIST_INTERVAL_MS (trigger interval)."""
    spark_master: str = "local[2]"
    """Dedup SPARK_MASTER."""
    brokers: int = 1
    """Nodes of each side's own Kafka (1: a single broker; 3: a replicated cluster)."""
    security: str = "plaintext"
    """Each side's own Kafka: plaintext, or sasl_ssl (TLS + SCRAM; every component, the producer
    and the verdict connect as the components' user)."""
    receiver_ports: int = 1
    """UDP ports the receiver listens on and the sender spreads over (``listen_ports`` =
    ``target_ports``, docs/operations.md); more than one needs ``profile`` None (the relay
    forwards one port)."""
    worker_processes: bool = False
    """The receiver's ``worker_processes``: one process per port."""
    run_dedup: bool = True
    """Whether to start the Spark dedup (the receiver benchmark does not need it)."""
    dedup_creates_topics: bool = False
    """Leave the clean and gap topics to the dedup, which creates them with its
    ``NEW_TOPIC_PARTITIONS`` and ``NEW_TOPIC_REPLICATION`` (docs/deployment.md); by default they
    are created here first, as operations.md advises."""
    extra_env: tuple[tuple[str, str], ...] = ()
    """Extra environment for every component."""

    def __post_init__(self) -> None:
        validate_security(self.security)
        if not 1 <= self.receiver_ports <= MAX_RECEIVER_PORTS:
            raise ConfigError(
                "receiver_ports", f"{self.receiver_ports}", f"use 1..{MAX_RECEIVER_PORTS}"
            )
        if self.receiver_ports > 1 and self.profile is not None:
            raise ConfigError(
                "receiver_ports", "the relay forwards one port", "set profile None for several"
            )
        if not 1 <= self.brokers <= MAX_NODES:
            raise ConfigError(
                "--brokers",
                f"{self.brokers} is not a node count",
                f"use 1 or 3 (at most {MAX_NODES})",
            )


@dataclass
class Endpoints:
    """Addresses and names of one pipeline run."""

    upstream: str = ""
    downstream: str = ""
    prefix: str = ""
    source_topics: tuple[str, ...] = ()
    raw_topic: str = ""
    clean_template: str = ""
    gap_topic: str = ""
    key_file: Path = Path()
    """The low side's link key ring (receiver, bundle create)."""
    sender_key_file: Path = Path()
    """The high side's copy of the ring (sender, resend): a rotation installs a new ring on the
    receiver first, then on the sender (docs/security.md)."""
    receiver_port: int = 0
    receiver_ports: tuple[int, ...] = ()
    """The receiver's ports after ``receiver_port`` (``listen_ports``)."""
    relay_port: int = 0
    metrics: dict[str, int] = field(default_factory=dict)


class Pipeline:
    """One run of the whole system; ``with Pipeline(...) as p:`` stops everything on exit."""

    def __init__(
        self,
        spec: PipelineSpec,
        work_dir: Path,
        *,
        upstream: str | None = None,
        downstream: str | None = None,
        upstream_security: SecurityFiles | None = None,
        downstream_security: SecurityFiles | None = None,
    ) -> None:
        self.spec = spec
        #: each side's security (given with a bootstrap, or made with our own brokers)
        self.security: dict[str, SecurityFiles | None] = {
            "upstream": upstream_security,
            "downstream": downstream_security,
        }
        self.work_dir = work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.group = ProcessGroup(work_dir / "logs")
        self.brokers: list[LocalBroker | LocalCluster] = []
        self.ep = Endpoints(upstream=upstream or "", downstream=downstream or "")
        run = uuid.uuid4().hex[:8]
        self.ep.prefix = f"r{run}."
        self.ep.source_topics = tuple(self.ep.prefix + t for t in spec.topics)
        self.ep.raw_topic = f"{self.ep.prefix}diode.raw"
        self.ep.clean_template = f"{self.ep.prefix}clean.{{topic}}"
        self.ep.gap_topic = f"{self.ep.prefix}diode.gaps"
        self.ep.key_file = work_dir / "link.key"
        self.ep.sender_key_file = work_dir / "high-side" / "link.key"
        self.produced = 0

    # -- set-up ------------------------------------------------------------------------------

    def start_brokers(self) -> None:
        """Start our own upstream and downstream brokers (clusters of ``spec.brokers`` nodes)
        unless bootstraps were given."""
        for side in ("upstream", "downstream"):
            if getattr(self.ep, side):
                continue
            broker: LocalBroker | LocalCluster
            data_dir = self.work_dir / f"kafka-{side}"
            if self.spec.brokers > 1:
                broker = LocalCluster(
                    f"demo-{side}",
                    brokers=self.spec.brokers,
                    ports=tuple(free_port() for _ in range(self.spec.brokers)),
                    data_dir=data_dir,
                    partitions=self.spec.partitions,
                    security=self.spec.security,
                )
                self.security[side] = broker.security
            else:
                files = None
                if self.spec.security == "sasl_ssl":
                    files = ensure_security(data_dir.resolve() / "security")
                broker = LocalBroker(
                    f"demo-{side}",
                    free_port(),
                    data_dir=data_dir,
                    partitions=self.spec.partitions,
                    security=files,
                )
                self.security[side] = files
            self.brokers.append(broker)  # before start: an interrupted start is stopped too
            broker.start()
            setattr(self.ep, side, broker.bootstrap)

    def create_topics(self) -> None:
        """Upstream sources; downstream raw, clean (one per source) and compacted gap topics
        (the last two unless ``dedup_creates_topics``)."""
        n = self.spec.partitions
        largest = max(self.spec.value_size_max, self.spec.huge_size * 5 // 4)
        big = {"max.message.bytes": str(largest + 1024 * 1024)} if largest > 900_000 else {}
        _create(
            self.ep.upstream,
            [TopicSpec(name=t, partitions=n, config=big) for t in self.ep.source_topics],
            self.conf("upstream"),
        )
        # as docs/operations.md tells operators: raw and clean topics admit the largest record,
        # clean topics any source timestamp (common/topic_limits.py)
        raw_config = created_topic_config(DEFAULT_MAX_RECORD_SIZE, any_timestamp=False)
        clean_config = created_topic_config(DEFAULT_MAX_RECORD_SIZE, any_timestamp=True)
        raw = self.spec.raw_partitions or n
        downstream = [TopicSpec(name=self.ep.raw_topic, partitions=raw, config=raw_config)]
        if not self.spec.dedup_creates_topics:
            downstream += [
                TopicSpec(
                    name=self.ep.clean_template.replace("{topic}", t),
                    partitions=n,
                    config=clean_config,
                )
                for t in self.ep.source_topics
            ]
            downstream.append(
                TopicSpec(
                    name=self.ep.gap_topic, partitions=1, config={"cleanup.policy": "compact"}
                )
            )
        _create(self.ep.downstream, downstream, self.conf("downstream"))

    def make_key(self) -> None:
        """One shared link key, as an operator would make it with ``kafka-diode keygen``, and
        the high side's copy of it."""
        if not self.ep.key_file.exists():
            proc = ManagedProcess(
                "keygen",
                diode_command("keygen", "--out", str(self.ep.key_file)),
                log_dir=self.group.log_dir,
            )
            proc.start()
            assert proc.proc is not None
            if proc.proc.wait(60) != 0:
                raise RuntimeError(f"keygen failed:\n{proc.tail()}")
        if not self.ep.sender_key_file.exists():
            self.ep.sender_key_file.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.ep.key_file, self.ep.sender_key_file)

    def setup(self) -> None:
        """Brokers, topics and key."""
        self.start_brokers()
        self.create_topics()
        self.make_key()

    # -- components ---------------------------------------------------------------------------

    def conf(self, side: str) -> dict[str, str]:
        """librdkafka properties (besides bootstrap) for ``side``: its security, if any."""
        files = self.security[side]
        return files.librdkafka() if files is not None else {}

    def component_env(self) -> dict[str, str]:
        """The environment every component of this run starts with."""
        return self._env()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.security_env())
        env.update(self.spec.extra_env)
        env["PYSPARK_PYTHON"] = sys.executable
        return env

    def security_env(self) -> dict[str, str]:
        """Each component's security settings in its own environment names, as an operator's
        env files would hold them (docs/security.md): the sender and resend read
        ``DIODE_SENDER_KAFKA__*`` (upstream), the receiver ``DIODE_RECEIVER_KAFKA__*``, the
        dedup, bundle and gaps ``KAFKA_CONF_*`` (librdkafka) and the dedup's Spark source
        ``KAFKA_SOURCE_KAFKA_*`` (Java), all downstream."""
        env: dict[str, str] = {}

        def name(prop: str) -> str:
            return prop.upper().replace(".", "_")

        for prop, value in self.conf("upstream").items():
            env[f"DIODE_SENDER_KAFKA__{name(prop)}"] = value
        down = self.security["downstream"]
        if down is not None:
            for prop, value in down.librdkafka().items():
                env[f"DIODE_RECEIVER_KAFKA__{name(prop)}"] = value
                env[f"KAFKA_CONF_{name(prop)}"] = value
            for prop, value in down.java().items():
                env[f"KAFKA_SOURCE_KAFKA_{name(prop)}"] = value
        return env

    def _metrics_port(self, name: str) -> str:
        port = free_port()
        self.ep.metrics[name] = port
        return str(port)

    def receiver_argv(self) -> list[str]:
        """``kafka-diode receive`` for this run."""
        if not self.ep.receiver_port:
            self.ep.receiver_port = free_port()
        return diode_command(
            "receive",
            "--bootstrap-servers", self.ep.downstream,
            "--raw-topic", self.ep.raw_topic,
            "--listen-host", "127.0.0.1",
            "--listen-port", str(self.ep.receiver_port),
            "--key-file", str(self.ep.key_file),
            "--metrics-port", self._metrics_port("receiver"),
            *self._receiver_port_args(),
        )  # fmt: skip

    def _receiver_port_args(self) -> list[str]:
        if self.spec.receiver_ports == 1:
            return []
        if not self.ep.receiver_ports:
            self.ep.receiver_ports = tuple(free_port() for _ in range(self.spec.receiver_ports - 1))
        args = ["--listen-ports", ",".join(map(str, self.ep.receiver_ports))]
        if self.spec.worker_processes:
            args += ["--worker-processes", "true"]
        return args

    def relay_argv(self) -> list[str]:
        """``kafka-diode netem relay`` between sender and receiver."""
        assert self.spec.profile is not None
        if not self.ep.relay_port:
            self.ep.relay_port = free_port()
        return diode_command(
            "netem", "relay",
            "--listen", f"127.0.0.1:{self.ep.relay_port}",
            "--forward", f"127.0.0.1:{self.ep.receiver_port}",
            "--profile", self.spec.profile,
            "--seed", str(self.spec.seed),
            "--metrics-port", self._metrics_port("relay"),
        )  # fmt: skip

    def _target(self) -> str:
        port = self.ep.relay_port if self.spec.profile is not None else self.ep.receiver_port
        return f"127.0.0.1:{port}"

    def _sender_wire_args(self, copies: int | None = None) -> list[str]:
        args = ["--key-file", str(self.ep.sender_key_file)]
        args += ["--compression", self.spec.compression]
        args += ["--copies", str(copies or self.spec.copies)]
        args += ["--rate-bytes", str(self.spec.rate_bytes)]
        if self.spec.fec_overhead:
            args += ["--fec-overhead", str(self.spec.fec_overhead)]
        if self.spec.max_datagram_size:
            args += ["--max-datagram-size", str(self.spec.max_datagram_size)]
        return args

    def sender_argv(self) -> list[str]:
        """``kafka-diode send`` for this run."""
        return diode_command(
            "send",
            "--bootstrap-servers", self.ep.upstream,
            "--target", self._target(),
            "--topics", ",".join(self.ep.source_topics),
            "--group-id", f"{self.ep.prefix}sender",
            "--start-position", "committed",
            "--heartbeat-interval", str(self.spec.heartbeat_interval),
            "--metrics-port", self._metrics_port("sender"),
            *self._sender_wire_args(),
            *(["--target-ports", ",".join(map(str, self.ep.receiver_ports))]
              if self.ep.receiver_ports else []),
        )  # fmt: skip

    def dedup_env(self) -> dict[str, str]:
        """The environment ``kafka-diode dedup`` reads, as an operator would set it."""
        env = self._env()
        env.update(
            {
                "RAW_TOPICS": self.ep.raw_topic,
                "BOOTSTRAP_SERVERS": self.ep.downstream,
                "CLEAN_TOPIC": self.ep.clean_template,
                "GAP_TOPIC": self.ep.gap_topic,
                # Per run, so pipelines sharing brokers never share the dedup's fence or commands.
                "PROGRESS_TOPIC": f"{self.ep.prefix}dedup.progress",
                "CONTROL_TOPIC": f"{self.ep.prefix}dedup.control",
                "STATE_DIR_CONFIG": str(self.work_dir / "dedup-checkpoint"),
                "WINDOW_SIZE": str(self.spec.window_size),
                "MAX_WINDOWS": str(self.spec.max_windows),
                "GAP_EMIT_INTERVAL_SEC": str(self.spec.gap_emit_interval),
                "PERSIST_INTERVAL_MS": str(self.spec.persist_interval_ms),
                "SPARK_MASTER": self.spec.spark_master,
            }
        )
        return env

    def dedup_argv(self) -> list[str]:
        """``kafka-diode dedup`` for this run."""
        return diode_command("dedup", "--metrics-port", self._metrics_port("dedup"))

    def start_components(self, *, receiver_first: bool = False) -> None:
        """Receiver, relay, sender and dedup, each its own process.

        With ``receiver_first``, the sender starts only once the receiver and relay serve their
        metrics (as in production, where the low side runs before the high side starts);
        without it the sender's first datagrams may find nobody listening, which the chaos
        suite wants to exercise.
        """
        env = self._env()
        receiver = self.group.add("receiver", self.receiver_argv(), env=env)
        ready = [("receiver", receiver)]
        if self.spec.profile is not None:
            ready.append(("relay", self.group.add("relay", self.relay_argv(), env=env)))
        if receiver_first:
            # a worker process per port serves its metrics on the next port (docs/receiver.md)
            workers = self.spec.receiver_ports if self.spec.worker_processes else 1
            waits = [(name, proc, 0) for name, proc in ready]
            waits += [("receiver", receiver, i) for i in range(1, workers)]
            for name, proc, worker in waits:
                port = self.ep.metrics[name] + worker
                wait_until(
                    lambda port=port: _serves(port),  # type: ignore[misc]
                    timeout=120,
                    what=f"{name} to listen",
                    alive=[proc],
                )
        self.group.add("sender", self.sender_argv(), env=env)
        if self.spec.run_dedup:
            self.group.add("dedup", self.dedup_argv(), env=self.dedup_env(), stop_timeout=60)

    def start_with_backlog(self) -> None:
        """Set up, produce the whole workload upstream, then start every component, the
        receiver first: the sender meets a backlog, as after an outage of the link."""
        self.setup()
        produced = self.produce()
        if produced != self.spec.records:
            raise ServiceError(f"produced {produced} of {self.spec.records} records upstream")
        self.start_components(receiver_first=True)

    def restart(self, name: str, *, crash: bool) -> None:
        """Kill (SIGKILL) or stop (SIGTERM) one component and start it again."""
        proc = self.group[name]
        if crash:
            proc.kill()
        else:
            proc.stop()
        proc.start()

    # -- data and verdicts ---------------------------------------------------------------------

    def workload(self) -> Workload:
        """The workload this run produces."""
        return Workload(
            topics=self.ep.source_topics,
            records=self.spec.records,
            value_size=self.spec.value_size,
            value_size_max=self.spec.value_size_max,
            huge_every=self.spec.huge_every,
            huge_size=self.spec.huge_size,
            seed=self.spec.seed,
            text_values=self.spec.text_values,
        )

    def produce(
        self,
        progress: Callable[[int], None] | None = None,
        gate: Callable[[int], None] | None = None,
    ) -> int:
        """Produce the workload upstream; returns records acknowledged. ``gate``: see
        ``kafka_diode.workload.produce``."""
        self.produced += produce(
            self.ep.upstream,
            self.workload(),
            partitions=self.spec.partitions,
            progress=progress,
            rate=self.spec.produce_rate,
            clock=time.monotonic,
            sleep=time.sleep,
            conf=self.conf("upstream"),
            gate=gate,
        )
        return self.produced

    def verdict(self) -> Verdict:
        """Read upstream, clean and gap topics and judge (kafka_diode.verify)."""
        return verify(
            upstream=self.ep.upstream,
            downstream=self.ep.downstream,
            source_topics=self.ep.source_topics,
            clean_template=self.ep.clean_template,
            gap_topic=self.ep.gap_topic,
            upstream_conf=self.conf("upstream"),
            downstream_conf=self.conf("downstream"),
        )

    def wait_settled(
        self, *, timeout: float, want_ok: bool = False, stable_for: float | None = None
    ) -> Verdict:
        """Wait until every produced record is accounted for: delivered or inside an open gap.

        With ``want_ok``, wait for every record delivered and no gap open, or, with
        ``stable_for``, until the accounted-for verdict has not changed for that many seconds (a
        resend that itself crossed a lossy link leaves gaps that only another pass fills). Returns
        the last verdict either way (the caller asserts on it); fails early if a component died.
        """
        last: list[Verdict] = []
        alive = [p for p in self.group.processes.values() if p.name in _LONG_RUNNING]
        since = time.monotonic()
        figures: dict[str, object] = {}

        def settled() -> bool:
            nonlocal since, figures
            v = self.verdict()
            last[:] = [v]
            accounted = v.promise_kept and v.exactly_once + v.missing_reported >= v.produced > 0
            if not want_ok:
                return accounted
            if v.ok:
                return True
            if v.as_dict() != figures:
                since, figures = time.monotonic(), v.as_dict()
            quiet = time.monotonic() - since
            return stable_for is not None and accounted and quiet >= stable_for

        try:
            wait_until(
                settled, timeout=timeout, interval=1.0, what="pipeline to settle", alive=alive
            )
        except TimeoutError:
            log.warning("pipeline did not settle: %s", last[0].line() if last else "no verdict")
        return last[0] if last else self.verdict()

    def resend_pass(self, *, copies: int | None = None, max_records: int = 0) -> Path:
        """Low side writes a bundle from the gap topic; high side resends it (real commands);
        returns the bundle.

        ``copies`` overrides the spec's redundancy for the resend (over a very lossy link an
        operator resends with copies, so that the resend itself is not lost again);
        ``max_records`` caps the bundle (``--max-records``, lowest offsets first).
        """
        bundle = self.work_dir / f"bundle-{uuid.uuid4().hex[:6]}.json"
        create_argv = diode_command(
            "bundle", "create",
            "--bootstrap-servers", self.ep.downstream,
            "--gap-topic", self.ep.gap_topic,
            "--key-file", str(self.ep.key_file),
            "--out", str(bundle),
            *(["--max-records", str(max_records)] if max_records else []),
        )  # fmt: skip
        create = ManagedProcess("bundle", create_argv, log_dir=self.group.log_dir, env=self._env())
        _run_to_end(create, timeout=120)
        resend_argv = diode_command(
            "resend",
            "--bundle", str(bundle),
            "--bootstrap-servers", self.ep.upstream,
            "--target", self._target(),
            "--no-progress",
            *self._sender_wire_args(copies),
        )  # fmt: skip
        resend = ManagedProcess("resend", resend_argv, log_dir=self.group.log_dir, env=self._env())
        _run_to_end(resend, timeout=600)
        return bundle

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> dict[str, int | None]:
        """Stop every component (newest first) and the brokers we started."""
        codes = self.group.stop_all()
        for broker in reversed(self.brokers):
            broker.stop()
        return codes

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


_LONG_RUNNING = ("receiver", "relay", "sender", "dedup")


def _serves(port: int) -> bool:
    """Whether a metrics endpoint answers on ``port`` (the process is up and serving)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _run_to_end(proc: ManagedProcess, *, timeout: float) -> None:
    proc.start()
    assert proc.proc is not None
    code = proc.proc.wait(timeout)
    if code != 0:
        raise RuntimeError(f"{proc.name} exited with {code}:\n{proc.tail()}")


def _create(bootstrap: str, topics: list[TopicSpec], security: Mapping[str, str]) -> None:
    """Create ``topics`` (the broker's replication factor) and wait for their leaders."""
    conf: dict[str, Any] = {
        **security,
        "bootstrap.servers": bootstrap,
        "log_level": 4,
        "logger": log,
    }
    kafka.create_missing_topics(conf, topics, timeout=60)
