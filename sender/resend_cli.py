"""``kafka-diode resend``: re-read listed offsets upstream and send them again (high side).

Input: a bundle carried over from the low side (``--bundle FILE``, verified with the link key
before anything is read), or, when no bundle can be carried, ``--topic T [--partition P]`` with
``--from-offset A --to-offset B`` or ``--from-time X [--to-time Y]``.

Guarantees (docs/resend.md):

- **The live sender is untouched.** Upstream is read by ``assign`` + seek with a throwaway group id
  and ``enable.auto.commit=false``; nothing is ever committed, so no consumer group moves.
- **Same wire path and pacing** as ``kafka-diode send``: the same ``SenderConfig`` keys
  (``--config`` TOML, ``DIODE_SENDER_*``, flags), the same ``Encoder`` -> ``SendPipeline`` ->
  ``Pacer`` -> ``UdpSender``, in a new sender session. A resend marker (phase ``start``) precedes
  the records and one (phase ``end``) follows them.
- **Every requested offset is accounted for**: sent, or reported unrecoverable (below the log start
  offset, beyond the log end, absent from the log, or larger than ``max_record_size``), separately.
  Reading is bounded: at most one consumer batch is added after the pipeline reports pressure.

Exit codes: 0 everything recoverable was sent (and nothing was unrecoverable); 1 failure
(upstream unreachable, interrupted, sending incomplete); 2 configuration or usage error;
3 everything recoverable was sent but some offsets were unrecoverable; 4 bundle refused
(unreadable, tampered, truncated, wrong key, wrong version).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import bundle as bundle_format
from common import logging as diode_logging
from common import settings
from common.errors import (
    BundleError,
    ConfigError,
    DiodeError,
    LocalProtocolError,
    RecordTooLarge,
    ServiceError,
)
from sender.config import ENV_PREFIX, SenderConfig, load_keyring
from sender.pacing_advice import pacing_warning
from sender.pubkey import announce_loop, load_announcer, load_bundle_trust, wall_ms
from sender.resend import (
    DEFAULT_MAX_SKIP,
    PartitionOutcome,
    PartitionPlan,
    check_offset_range,
    format_ranges,
    marker_ranges,
    plan_partition,
    time_range_offsets,
)
from sender.transport import resolve

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

    from common.wire import KeyRing
    from common.wire.pubkey import TrustedKeys
    from sender.pipeline import SendPipeline

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_UNRECOVERABLE = 3
EXIT_BAD_BUNDLE = 4

#: Live-sender settings a resend does not use (it reads what the bundle or the range names, never
#: commits, sends no heartbeats and serves no metrics, so it can run beside the live sender).
_LIVE_ONLY = (
    "topics",
    "exclude_topics",
    "group_id",
    "start_position",
    "start_timestamp",
    "heartbeat_interval",
    "commit_interval",
    "metrics_port",
    "metrics_addr",
)
_PLACEHOLDER_TOPIC = "kafka-diode-resend"
_PROGRESS_LOG_INTERVAL = 10.0


@dataclass(frozen=True, kw_only=True)
class ResendRequest:
    """What to resend, from the command line."""

    bundle: Path | None = None
    """Bundle file to resend."""
    topic: str = ""
    """Topic for a range resend."""
    partitions: tuple[int, ...] = ()
    """Partitions for a range resend (time ranges: empty means all partitions)."""
    from_offset: int | None = None
    """First offset (inclusive)."""
    to_offset: int | None = None
    """Last offset (inclusive)."""
    from_time_ms: int | None = None
    """Start of a time range (inclusive), ms since the epoch."""
    to_time_ms: int | None = None
    """End of a time range (inclusive), ms since the epoch; None: up to the end of the log."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The argument parser; sender settings are documented from ``SenderConfig``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Re-read the offsets listed in a bundle (or a range) from upstream Kafka and send them "
            "again through the diode, with the live sender's wire settings and pacing. Never "
            "commits offsets. Sender settings come from --config (TOML, the live sender's file), "
            f"then {ENV_PREFIX}* environment variables, then these flags."
        ),
        epilog=(
            "Exit codes: 0 all sent; 1 failure; 2 configuration error; 3 all recoverable offsets "
            "sent, some unrecoverable (listed); 4 bundle refused. See docs/resend.md."
        ),
    )
    what = parser.add_argument_group("what to resend (a bundle, or a topic with a range)")
    what.add_argument("--bundle", type=Path, help="bundle file made by 'kafka-diode bundle create'")
    what.add_argument("--topic", help="topic to resend from (without a bundle)")
    what.add_argument(
        "--partition",
        type=int,
        action="append",
        dest="partitions",
        help="partition (repeatable); required with --from-offset, default all with --from-time",
    )
    what.add_argument("--from-offset", type=int, help="first offset to resend (inclusive)")
    what.add_argument("--to-offset", type=int, help="last offset to resend (inclusive)")
    what.add_argument(
        "--from-time", help="resend records with timestamp >= this (ISO 8601 with zone, or ms)"
    )
    what.add_argument(
        "--to-time", help="... and <= this (ISO 8601 with zone, or ms); default: up to the end"
    )
    run = parser.add_argument_group("run")
    run.add_argument("--config", type=Path, help="TOML file with sender settings (the live one)")
    run.add_argument(
        "--no-progress", action="store_true", help="no progress bar (log a line every 10 s)"
    )
    run.add_argument(
        "--max-skip",
        type=int,
        default=DEFAULT_MAX_SKIP,
        help=f"read ranges closer than this many offsets as one span [default: {DEFAULT_MAX_SKIP}]",
    )
    run.add_argument(
        "--read-timeout",
        type=float,
        default=60.0,
        help="give up when upstream Kafka returns nothing for this many seconds [default: 60]",
    )
    run.add_argument(
        "--check-config",
        action="store_true",
        help="validate, print the effective sender configuration (secrets masked) and exit",
    )
    sender = parser.add_argument_group("sender settings (same keys as 'kafka-diode send')")
    settings.add_flags(sender, SenderConfig, skip=_LIVE_ONLY)  # type: ignore[arg-type]
    return parser


def parse_time(flag: str, text: str) -> int:
    """ISO 8601 with a zone, or milliseconds since the epoch.

    Raises:
        ConfigError: naming ``flag``.
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            flag, f"{text!r} is not a time", "use ISO 8601 (2024-05-01T12:00:00Z) or ms"
        ) from None
    if moment.tzinfo is None:
        raise ConfigError(flag, "has no time zone", "add Z or +00:00")
    return int(moment.timestamp() * 1000)


def request_from_args(args: argparse.Namespace) -> ResendRequest:
    """Check that exactly one kind of request was given.

    Raises:
        ConfigError: naming the flag and the fix.
    """
    ranged = args.topic is not None
    if args.bundle is not None and ranged:
        raise ConfigError("--bundle", "and --topic are both given", "resend a bundle or a range")
    if args.bundle is not None:
        for flag in ("from_offset", "to_offset", "from_time", "to_time", "partitions"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')}", "only applies with --topic")
        return ResendRequest(bundle=args.bundle)
    if not ranged:
        raise ConfigError(
            "--bundle", "nothing to resend", "give --bundle FILE, or --topic with a range"
        )
    partitions = tuple(args.partitions or ())
    if any(p < 0 for p in partitions):
        raise ConfigError("--partition", "is negative")
    by_offset = args.from_offset is not None or args.to_offset is not None
    by_time = args.from_time is not None or args.to_time is not None
    if by_offset == by_time:
        raise ConfigError(
            "--from-offset", "give either --from-offset/--to-offset or --from-time [--to-time]"
        )
    if by_offset:
        if args.from_offset is None or args.to_offset is None:
            raise ConfigError("--to-offset", "needs both --from-offset and --to-offset")
        if not partitions:
            raise ConfigError("--partition", "is required with --from-offset")
        first, last = check_offset_range(args.from_offset, args.to_offset)
        return ResendRequest(
            topic=args.topic, partitions=partitions, from_offset=first, to_offset=last
        )
    if args.from_time is None:
        raise ConfigError("--from-time", "is required with --to-time")
    start = parse_time("--from-time", args.from_time)
    end = parse_time("--to-time", args.to_time) if args.to_time is not None else None
    if end is not None and end < start:
        raise ConfigError("--to-time", "is before --from-time")
    return ResendRequest(
        topic=args.topic, partitions=partitions, from_time_ms=start, to_time_ms=end
    )


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> SenderConfig:
    """Merge the live sender's file, ``DIODE_SENDER_*`` and flags into a ``SenderConfig``.

    ``topics`` is the live sender's subscription; a resend reads exactly what it is asked for, so
    the key is satisfied with a placeholder that is never used.

    Raises:
        ConfigError: naming the offending key.
    """
    file_values = settings.read_toml_section(args.config, "sender")
    names = {k for k in vars(args) if k not in _LIVE_ONLY}
    flags = {k: v for k, v in vars(args).items() if k in names}
    flags["topics"] = _PLACEHOLDER_TOPIC
    return settings.build(
        SenderConfig, file_values=file_values, env=env, env_prefix=ENV_PREFIX, flags=flags
    )


def read_bundle(
    path: Path, keyring: KeyRing | None, trusted: TrustedKeys | None = None
) -> bundle_format.Bundle:
    """Read and verify a bundle with the link keys of ``keyring`` or, in the public-key mode,
    the low side's signing keys ``trusted``.

    Raises:
        BundleError: unreadable, or refused by ``common.bundle.verify`` (the message says why).
    """
    if keyring is None and trusted is None:
        raise BundleError(
            "a bundle can only be verified with the link key (key_file or password) or, in the "
            "public-key mode, the low side's bundle key (bundle_trusted_keys_file)"
        )
    try:
        with path.open("rb") as fh:
            data = fh.read(bundle_format.MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror}") from exc
    keys = {key.key_id: key.material for key in keyring} if keyring is not None else {}
    return bundle_format.verify(data, keys, trusted=trusted)


def main(argv: Sequence[str], prog: str = "kafka-diode resend") -> int:
    """Run one resend; returns the exit code (module docstring)."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        request = request_from_args(args)
        config = load_config(args, os.environ)
        keyring = load_keyring(config)
        trusted = load_bundle_trust(config)
        for host, port in config.targets():
            resolve("target", host, port)
        if args.max_skip < 0:
            raise ConfigError("--max-skip", "is negative", "use 0 or more")
        if not 0 < args.read_timeout <= 3600:
            raise ConfigError("--read-timeout", f"is {args.read_timeout}", "use 0 < s <= 3600")
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    advice = pacing_warning(config)
    if args.check_config:
        print(json.dumps(settings.describe(config), indent=2, sort_keys=True))
        if advice:
            print(f"{prog}: warning: {advice}", file=sys.stderr)
        return EXIT_OK
    diode_logging.configure(config.log_level, json_format=config.log_json)
    if advice:
        log.warning("%s", advice)
    bundle: bundle_format.Bundle | None = None
    if request.bundle is not None:
        try:
            bundle = read_bundle(request.bundle, keyring, trusted)
        except BundleError as exc:
            print(f"{prog}: bundle refused: {exc}", file=sys.stderr)
            return EXIT_BAD_BUNDLE
    job = ResendJob(
        config,
        keyring,
        request=request,
        bundle=bundle,
        max_skip=args.max_skip,
        read_timeout=args.read_timeout,
        progress=not args.no_progress,
    )
    try:
        return job.run()
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DiodeError as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _headers(raw: Any) -> list[tuple[str, bytes | None]] | None:
    """confluent-kafka gives a list of ``(name, value)``; values may be str for str input."""
    if not raw:
        return None
    items = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), v.encode() if isinstance(v, str) else v) for k, v in items]


class _Reader:
    """The upstream consumer: every call runs on one executor thread (librdkafka blocks)."""

    def __init__(self, config: SenderConfig) -> None:

        from runtime import kafka  # noqa: PLC0415  as above

        props: dict[str, Any] = dict(config.consumer_properties())
        props.update(
            {
                # Throwaway group, never committed to: the live sender's offsets cannot move.
                "group.id": f"kafka-diode-resend-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A seek below the log start (retention racing us) lands on the log start; the
                # skipped offsets are then reported absent.
                "auto.offset.reset": "earliest",
                "client.id": f"kafka-diode-resend-{config.sender_id}",
            }
        )
        try:
            self.consumer: Consumer = kafka.consumer(props)
        except Exception as exc:  # KafkaException / ValueError from librdkafka's checks
            raise ConfigError(
                "kafka", f"the Kafka client refused the configuration: {exc}"
            ) from exc

    def partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic``; ServiceError when the broker does not answer."""
        from confluent_kafka import KafkaException  # noqa: PLC0415

        try:
            meta = self.consumer.list_topics(topic, timeout=15.0).topics.get(topic)
        except KafkaException as exc:
            raise ServiceError(f"upstream Kafka did not answer: {exc}") from exc
        if meta is None or meta.error is not None:
            raise ServiceError(f"topic {topic!r} does not exist upstream")
        return sorted(meta.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)``."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=15.0, cached=False
            )
        except KafkaException as exc:
            raise ServiceError(f"cannot read the watermarks of {topic}:{partition}: {exc}") from exc
        return int(low), int(high)

    def offsets_for_time(self, topic: str, partition: int, ts_ms: int) -> int | None:
        """The first offset with timestamp >= ``ts_ms``, or None."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        try:
            (tp,) = self.consumer.offsets_for_times([TopicPartition(topic, partition, ts_ms)], 15.0)
        except KafkaException as exc:
            raise ServiceError(f"offsets_for_times on {topic}:{partition} failed: {exc}") from exc
        return int(tp.offset) if tp.offset >= 0 else None

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic:partition`` from ``offset`` on (the only partition assigned)."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        self.consumer.assign([TopicPartition(topic, partition, offset)])

    def consume(self, n: int, timeout: float) -> list[Message]:
        """One batch."""
        return list(self.consumer.consume(n, timeout))

    def close(self) -> None:
        """Close without committing (nothing was ever stored)."""
        self.consumer.close()


class ResendJob:
    """One resend run: plan, read, send, report."""

    def __init__(
        self,
        config: SenderConfig,
        keyring: KeyRing | None,
        *,
        request: ResendRequest,
        bundle: bundle_format.Bundle | None,
        max_skip: int = DEFAULT_MAX_SKIP,
        read_timeout: float = 60.0,
        progress: bool = True,
        out: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.request = request
        self.bundle = bundle
        self.max_skip = max_skip
        self.read_timeout = read_timeout
        self.progress = progress
        self.out = out
        self.plans: list[PartitionPlan] = []
        self.outcomes: list[PartitionOutcome] = []
        self.session_id = os.urandom(16)
        self.bundle_id = (
            bundle.bundle_id if bundle is not None else f"range-{uuid.uuid4().hex[:16]}"
        )
        self.interrupted = False
        self.complete = False
        self.pipeline: SendPipeline | None = None

    # -- planning -----------------------------------------------------------------------------

    def wanted_ranges(self, reader: _Reader) -> list[tuple[str, int, list[tuple[int, int]]]]:
        """``(topic, partition, ranges)`` requested, before clipping to the log."""
        req = self.request
        if self.bundle is not None:
            return [(p.topic, p.partition, list(p.ranges)) for p in self.bundle.partitions]
        existing = reader.partitions(req.topic)
        partitions = list(req.partitions) or existing
        missing = [p for p in partitions if p not in existing]
        if missing:
            raise ConfigError("--partition", f"{req.topic} has no partition {missing[0]}")
        if req.from_offset is not None and req.to_offset is not None:
            return [(req.topic, p, [(req.from_offset, req.to_offset)]) for p in partitions]
        assert req.from_time_ms is not None
        out = []
        for p in partitions:
            low, high = reader.watermarks(req.topic, p)
            start = reader.offsets_for_time(req.topic, p, req.from_time_ms)
            end = (
                reader.offsets_for_time(req.topic, p, req.to_time_ms + 1)
                if req.to_time_ms is not None
                else None
            )
            rng = time_range_offsets(start, end, low=low, high=high)
            out.append((req.topic, p, [rng] if rng else []))
        return out

    def plan(self, reader: _Reader) -> None:
        """Clip every requested range to the log as it is now."""
        for topic, partition, ranges in self.wanted_ranges(reader):
            if not ranges:
                continue
            low, high = reader.watermarks(topic, partition)
            plan = plan_partition(
                topic, partition, ranges, low=low, high=high, max_skip=self.max_skip
            )
            self.plans.append(plan)
            self.outcomes.append(PartitionOutcome(plan))
            if plan.expired or plan.beyond_end:
                log.warning(
                    "%s:%d: %d offsets unrecoverable (log is %d..%d): below the log start %s;"
                    " beyond the end %s",
                    topic, partition, plan.unrecoverable_planned, low, high - 1,
                    format_ranges(plan.expired), format_ranges(plan.beyond_end),
                )  # fmt: skip

    @property
    def total_to_read(self) -> int:
        """Offsets inside the log that were asked for."""
        return sum(p.records_to_read for p in self.plans)

    # -- running ------------------------------------------------------------------------------

    def run(self) -> int:
        """Plan, send and report; returns the exit code."""
        factory: Callable[[], asyncio.AbstractEventLoop] | None = None
        if self.config.loop == "uvloop":
            import uvloop  # noqa: PLC0415  optional at import time

            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._run())
        self.report()
        if self.interrupted or not self.complete:
            return EXIT_FAILED
        if any(o.unrecoverable for o in self.outcomes):
            return EXIT_UNRECOVERABLE
        return EXIT_OK

    async def _run(self) -> None:
        from common.wire import Encoder  # noqa: PLC0415  loaded when running only
        from sender.pacing import Pacer  # noqa: PLC0415
        from sender.pipeline import SendPipeline  # noqa: PLC0415
        from sender.transport import UdpSender  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        cfg = self.config
        executor = ThreadPoolExecutor(1, thread_name_prefix="resend-reader")
        reader = await loop.run_in_executor(executor, _Reader, cfg)
        udp: UdpSender | None = None
        released = asyncio.Event()
        released.set()

        def on_pressure(congested: bool) -> None:
            if congested:
                released.clear()
            else:
                released.set()

        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stop.set)
        try:
            await loop.run_in_executor(executor, self.plan, reader)
            if self.total_to_read == 0:
                self.complete = True
                return
            udp = UdpSender(cfg.targets(), bind=cfg.bind_address(), send_buffer=cfg.send_buffer)
            announcer = load_announcer(cfg, self.session_id)  # public-key mode
            first = announcer.start(time.monotonic(), wall_ms()) if announcer else []
            keyring = announcer.keyring if announcer is not None else self.keyring
            encoder = Encoder(cfg.wire_config(), keyring, session_id=self.session_id)
            pipeline = SendPipeline(
                encoder=encoder,
                pacer=Pacer(cfg.pacing_config(), time.monotonic()),
                udp=udp,
                loop=loop,
                copies=cfg.copies,
                copy_spacing=cfg.copy_spacing,
                replay_window=cfg.replay_window,
                max_backlog_bytes=cfg.max_backlog_bytes,
                on_pressure=on_pressure,
                fec=cfg.fec_encoder(self.keyring, self.session_id),
            )
            self.pipeline = pipeline
            log.info(
                "resend %s session %s: %d records from %d partitions -> %s",
                self.bundle_id, self.session_id.hex(), self.total_to_read, len(self.plans),
                ", ".join(f"{h}:{p}" for h, p in cfg.targets()),
            )  # fmt: skip
            pipeline.enqueue(first)
            pipeline.enqueue(self._marker(encoder, "start", 0))
            announcing = (
                asyncio.ensure_future(announce_loop(announcer, pipeline, time.monotonic))
                if announcer is not None
                else None
            )
            with self._progress_display() as tick:
                ticker = asyncio.ensure_future(self._tick(tick))
                try:
                    reading = asyncio.ensure_future(
                        self._read_all(reader, executor, pipeline, released)
                    )
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({reading, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set() and not reading.done():
                        self.interrupted = True
                        log.warning("interrupted: sending what was read, then stopping")
                        reading.cancel()
                    stopper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading  # re-raises a reading failure
                    timeout = cfg.shutdown_timeout if self.interrupted else 7 * 24 * 3600.0
                    drained = await pipeline.drain(timeout)
                    pipeline.enqueue(self._marker(encoder, "end", pipeline.records_sent))
                    drained = await pipeline.drain(cfg.shutdown_timeout) and drained
                    self.complete = drained and not self.interrupted
                    if not drained:
                        log.error("datagrams still unsent after the timeout")
                finally:
                    ticker.cancel()
                    if announcing is not None:
                        announcing.cancel()
                    tick()
        finally:
            if self.pipeline is not None:
                self.pipeline.close()
            if udp is not None:
                udp.close()
            await loop.run_in_executor(executor, reader.close)
            executor.shutdown(wait=False)

    def _marker(self, encoder: Any, phase: str, records_sent: int) -> list[Any]:
        return list(
            encoder.resend_marker(
                bundle_id=self.bundle_id,
                phase=phase,
                ranges=marker_ranges(self.plans),
                records_sent=records_sent,
                sent_at_ms=int(time.time() * 1000),
            )
        )

    async def _read_all(
        self,
        reader: _Reader,
        executor: ThreadPoolExecutor,
        pipeline: SendPipeline,
        released: asyncio.Event,
    ) -> None:
        loop = asyncio.get_running_loop()
        batch_size = self.config.batch_size
        for outcome in self.outcomes:
            plan = outcome.plan
            for first, last in plan.spans:
                await loop.run_in_executor(executor, reader.seek, plan.topic, plan.partition, first)
                position = first
                idle_since = time.monotonic()
                while position <= last:
                    await released.wait()  # backpressure: the pipeline's backlog is bounded
                    batch = await loop.run_in_executor(executor, reader.consume, batch_size, 0.5)
                    if not batch:
                        if time.monotonic() - idle_since > self.read_timeout:
                            raise ServiceError(
                                f"upstream Kafka returned nothing for {self.read_timeout:.0f} s"
                                f" while reading {plan.topic}:{plan.partition} at {position}"
                            )
                        continue
                    idle_since = time.monotonic()
                    position = self._add_batch(batch, outcome, last, position, pipeline)
                    await asyncio.sleep(0)  # let the pump's timers run

    def _add_batch(
        self,
        batch: list[Message],
        outcome: PartitionOutcome,
        last: int,
        position: int,
        pipeline: SendPipeline,
    ) -> int:
        """Add the wanted records of ``batch``; returns the next position to read."""
        from confluent_kafka import KafkaError  # noqa: PLC0415

        plan = outcome.plan
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if msg.partition() != plan.partition or msg.topic() != plan.topic:
                        continue
                    return last + 1  # the end of the log: nothing more in this span
                raise ServiceError(f"reading {plan.topic}:{plan.partition}: {err.str()}")
            if msg.topic() != plan.topic or msg.partition() != plan.partition:
                continue  # left over from an earlier assignment
            offset = msg.offset()
            if offset is None or offset < position:
                continue  # stale message from before the seek
            position = offset + 1
            if offset > last:
                return position
            if not plan.wanted(offset):
                continue
            ts_type, ts = msg.timestamp()
            try:
                pipeline.add(
                    plan.topic, plan.partition, offset, ts, ts_type,
                    msg.key(), msg.value(), _headers(msg.headers()),
                )  # fmt: skip
            except (RecordTooLarge, LocalProtocolError) as exc:
                outcome.record_too_large(offset)
                log.error(  # noqa: TRY400  the reason is the message; no traceback wanted
                    "%s:%d@%d not resent: %s", plan.topic, plan.partition, offset, exc
                )
                continue
            outcome.record_sent(offset)
        return position

    # -- progress and report -------------------------------------------------------------------

    @contextlib.contextmanager
    def _progress_display(self) -> Any:
        total = self.total_to_read
        if not self.progress:
            state = {"last": 0.0}

            def log_tick() -> None:
                now = time.monotonic()
                if now - state["last"] >= _PROGRESS_LOG_INTERVAL:
                    state["last"] = now
                    done = self.pipeline.records_sent if self.pipeline else 0
                    log.info("resend progress: %d/%d records sent", done, total)

            yield log_tick
            return
        from rich.console import Console  # noqa: PLC0415  only for the interactive bar
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        started = time.monotonic()
        with Progress(
            TextColumn("resend"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rec/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            task = bar.add_task("resend", total=total, rate="-")

            def bar_tick() -> None:
                done = self.pipeline.records_sent if self.pipeline else 0
                elapsed = max(time.monotonic() - started, 1e-6)
                bar.update(task, completed=min(done, total), rate=f"{done / elapsed:,.0f}")

            yield bar_tick

    async def _tick(self, tick: Callable[[], None]) -> None:
        while True:
            tick()
            await asyncio.sleep(0.2)

    def report(self) -> None:
        """The final summary: what was sent, then every unrecoverable offset, separately."""
        sent = sum(o.records_sent for o in self.outcomes)
        out = self.out
        out(f"resend {self.bundle_id}: {sent} records sent from {len(self.outcomes)} partitions")
        if self.pipeline is not None:
            p = self.pipeline
            out(
                f"  {p.datagrams_sent} datagrams, {p.bytes_sent} bytes"
                f" (copies={self.config.copies}), {p.datagrams_dropped} refused by the kernel"
            )
        rows = []
        for o in self.outcomes:
            plan = o.plan
            absent = o.absent()
            requested = sum(b - a + 1 for a, b in plan.requested)
            rows.append(
                f"  {plan.topic}:{plan.partition}  requested {requested}"
                f"  sent {o.records_sent}  unrecoverable {o.unrecoverable}"
            )
            if o.unrecoverable:
                if plan.expired:
                    rows.append(
                        f"    deleted upstream (below log start {plan.low}):"
                        f" {format_ranges(plan.expired)}"
                    )
                if plan.beyond_end:
                    rows.append(
                        f"    beyond the log end ({plan.high}): {format_ranges(plan.beyond_end)}"
                    )
                if absent:
                    rows.append(
                        "    not in the log (compacted, transaction markers or deleted meanwhile):"
                        f" {format_ranges(absent)}"
                    )
                if o.too_large:
                    rows.append(f"    over max_record_size: {format_ranges(o.too_large)}")
        for row in rows:
            out(row)
        lost = sum(o.unrecoverable for o in self.outcomes)
        if self.interrupted:
            out("INTERRUPTED: not everything was sent; run the same resend again")
        elif not self.complete:
            out("INCOMPLETE: some datagrams were not handed to the socket; run it again")
        if lost:
            out(
                f"UNRECOVERABLE: {lost} offsets cannot be resent (listed above); they stay open"
                " gaps downstream until an operator closes them (docs/resend.md)"
            )
        elif self.complete and not self.interrupted:
            out("all requested records were sent")
