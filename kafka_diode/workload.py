"""A realistic, checkable upstream stream for the demo, the chaos suite and the benchmarks.

Records spread over several topics and partitions, with keys (some null), headers (some with null
values), some tombstones and empty values. Every record carries a unique ``diode-demo.seq`` header,
so the verifier can match a clean-topic record to the upstream record it must equal, byte for
byte, without trusting any counter of ours.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runtime import kafka

SEQ_HEADER = "diode-demo.seq"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What to produce."""

    topics: tuple[str, ...] = ("orders", "telemetry.site-1", "audit_log")
    """Upstream topics to spread records over."""
    records: int = 10_000
    """Total records."""
    value_size: int = 200
    """Mean value size in bytes (values vary +-50 %)."""
    value_size_max: int = 0
    """When above ``value_size``: sizes are log-uniform between the two instead (a mix of small
    and large records, as a real topic has)."""
    huge_every: int = 0
    """Every n-th record gets a value of ``huge_size`` bytes (+-25 %); 0 disables."""
    huge_size: int = 0
    """Size of the huge values (bytes); producers and topics must admit it."""
    tombstone_every: int = 97
    """Every n-th record is a tombstone (null value); 0 disables."""
    seed: int = 1
    """Seed for sizes and contents, so a run repeats."""
    text_values: bool = False
    """Values of log-like JSON lines (compressible, each different) instead of random bytes."""


_LEVELS = ("INFO", "INFO", "INFO", "WARN", "DEBUG", "ERROR")


def _text_value(rng: random.Random, size: int) -> bytes:
    """``size`` bytes of log lines: what a site's syslog or event topic carries."""
    lines: list[str] = []
    length = 0
    while length < size:
        line = (
            f'{{"ts": {rng.randrange(1_700_000_000_000, 1_800_000_000_000)}, '
            f'"level": "{rng.choice(_LEVELS)}", "host": "plant-{rng.randrange(40)}", '
            f'"msg": "request {rng.randrange(10**7)} served in {rng.randrange(2000)} ms", '
            f'"path": "/api/v1/items/{rng.randrange(10**5)}"}}\n'
        )
        lines.append(line)
        length += len(line)
    return "".join(lines).encode()[:size]


def produce(
    bootstrap: str,
    workload: Workload,
    *,
    partitions: int,
    progress: Callable[[int], None] | None = None,
    rate: float | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
    conf: Mapping[str, str] | None = None,
    gate: Callable[[int], None] | None = None,
) -> int:
    """Produce ``workload`` to ``bootstrap`` and flush; returns how many records were acknowledged.

    ``rate`` (records/s) paces production for demos; ``None`` produces as fast as possible.
    ``gate(seq)`` runs before record ``seq`` is produced and may block: a chaos harness holds the
    rest of the workload back until its fault has happened, so that records flow after the fault
    by construction. Pacing resumes from the moment the gate returns.
    """
    rng = random.Random(workload.seed)
    largest = max(workload.value_size, workload.value_size_max, workload.huge_size * 5 // 4)
    producer = kafka.producer(
        {
            **(conf or {}),  # client properties such as security
            "message.max.bytes": max(1_000_000, largest + 64 * 1024),
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            # librdkafka's own warnings (e.g. "coordinator load in progress" while a fresh
            # broker settles) go to our logger instead of raw onto the terminal
            "logger": logging.getLogger(__name__),
        }
    )
    acked = 0
    failed: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        else:
            failed.append(str(err))

    start = clock() if clock else 0.0
    for seq in range(workload.records):
        if gate is not None:
            held = clock() if clock else 0.0
            gate(seq)
            if clock:
                start += clock() - held  # time spent held is not a backlog to catch up
        topic = workload.topics[seq % len(workload.topics)]
        partition = rng.randrange(partitions)
        if workload.huge_every and seq % workload.huge_every == workload.huge_every // 2:
            size = int(workload.huge_size * rng.uniform(0.75, 1.25))
        elif workload.value_size_max > workload.value_size > 0:
            size = int(
                math.exp(
                    rng.uniform(math.log(workload.value_size), math.log(workload.value_size_max))
                )
            )
        else:
            size = max(0, int(workload.value_size * rng.uniform(0.5, 1.5)))
        value: bytes | None = (
            _text_value(rng, size) if workload.text_values else rng.randbytes(size)
        )
        if (
            workload.tombstone_every
            and seq % workload.tombstone_every == workload.tombstone_every - 1
        ):
            value = None
        elif seq % 101 == 50:
            value = b""
        key: bytes | None = None if seq % 13 == 0 else f"k-{seq % 500}".encode()
        headers: list[tuple[str, str | bytes | None]] = [(SEQ_HEADER, str(seq).encode())]
        if seq % 7 == 0:
            headers.append(("trace", None))
        if seq % 5 == 0:
            headers.append(("source", b"plant-3"))
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    headers=headers,
                    partition=partition,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if progress and seq % 1000 == 0:
            progress(seq)
        if rate and clock and sleep:
            ahead = (seq + 1) / rate - (clock() - start)
            if ahead > 0:
                sleep(ahead)
    remaining = producer.flush(60)
    if remaining or failed:
        raise RuntimeError(f"{remaining} records unflushed, {len(failed)} failed: {failed[:3]}")
    return acked
