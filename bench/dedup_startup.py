"""Dedup start-up: from ``kafka-diode dedup`` starting to its first record in the clean topic,
with the driver JVM's class archive (``JVM_CLASS_ARCHIVE_DIR``, dedup/class_archive.py) and
without it (``off``), alternated.

Each round starts the real dedup (``local[2]``, direct layout, a new checkpoint and new output
topics) on the same 3-partition raw topic of 60 runs, with ``--until-settled``, and times the
first record a ``read_committed`` consumer sees in the clean topic, and the process's exit. The
first round with the archive writes it (a clean stop) and is not counted. Needs a broker:
``--bootstrap`` (default: start one). Last line: one JSON object.

    .venv/bin/python bench/dedup_startup.py --rounds 4
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from common.raw_run import RunBuilder  # noqa: E402
from kafka_diode.local_kafka.broker import LocalBroker, free_port  # noqa: E402

PARTITIONS = 3
SESSION = b"ab" * 16  # the session id in lower-case hex (common/raw_run.py)
SOURCE = "startup.src"


def fill_raw(bootstrap: str, raw: str) -> None:
    """20 runs of 50 records per partition, as the receiver writes them."""
    producer = Producer({"bootstrap.servers": bootstrap})
    now = int(time.time() * 1000)
    for partition in range(PARTITIONS):
        for n in range(20):
            run = RunBuilder(SOURCE, partition, 1, n * 50, now)
            for offset in range(n * 50, n * 50 + 50):
                run.append(offset, now, b"k%d" % offset, b"v" * 200, ())
            producer.produce(raw, run.encode(), run.key().encode(), partition,
                             headers=[("diode.session", SESSION)])  # fmt: skip
    producer.flush(30)


def one_round(bootstrap: str, raw: str, tmp: Path, mode: str, archive_dir: Path, n: int) -> dict:
    """One dedup run; seconds to its first clean record and to its exit."""
    tag = f"st{n}-{os.getpid()}"
    clean = f"{tag}.clean.{SOURCE}"
    env = {
        **os.environ,
        "RAW_TOPICS": raw,
        "BOOTSTRAP_SERVERS": bootstrap,
        "STATE_DIR_CONFIG": str(tmp / f"checkpoint-{n}"),
        "CLEAN_TOPIC": f"{tag}.clean.{{topic}}",
        "GAP_TOPIC": f"{tag}.gaps",
        "PROGRESS_TOPIC": f"{tag}.progress",
        "CONTROL_TOPIC": f"{tag}.control",
        "STATE_TOPIC": f"{tag}.state",
        "STATE_LAYOUT": "direct",
        "SPARK_MASTER": "local[2]",
        "NEW_TOPIC_PARTITIONS": "3",
        "GAP_EMIT_INTERVAL_SEC": "1",
        "JVM_CLASS_ARCHIVE_DIR": str(archive_dir) if mode == "archive" else "off",
    }
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": tag,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "topic.metadata.refresh.interval.ms": 500})  # fmt: skip
    consumer.subscribe([clean])
    log = (tmp / f"dedup-{n}.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kafka_diode", "dedup", "--until-settled"],
                            env=env, stdout=log, stderr=log)  # fmt: skip
    first = None
    try:
        while first is None and proc.poll() is None:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                first = time.monotonic() - started
        code = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
        consumer.close()
        log.close()
    if code != 0:
        raise SystemExit(f"dedup exited {code}: see {tmp / f'dedup-{n}.log'}")
    return {"mode": mode, "first_clean_s": first, "exit_s": time.monotonic() - started}


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds of each mode")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = LocalBroker("bench-startup", free_port(), data_dir=tmp / "kafka", partitions=3)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        raw = f"startup{os.getpid()}.raw"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(raw, PARTITIONS, 1)]).values():
            future.result(30)
        fill_raw(bootstrap, raw)
        archive_dir = tmp / "jvm-classes"
        writing = one_round(bootstrap, raw, tmp, "archive", archive_dir, 0)  # writes it
        rounds = []
        for _ in range(args.rounds):
            for mode in ("off", "archive"):
                rounds.append(one_round(bootstrap, raw, tmp, mode, archive_dir, len(rounds) + 1))
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp / "kafka", ignore_errors=True)
    result: dict = {
        "bench": "dedup_startup",
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "rounds": args.rounds,
        "writing_round_exit_s": round(writing["exit_s"], 2),
    }
    for mode in ("off", "archive"):
        mine = [r for r in rounds if r["mode"] == mode]
        for what in ("first_clean_s", "exit_s"):
            values = [r[what] for r in mine]
            result[f"{mode}_{what}"] = [round(v, 2) for v in values]
            result[f"{mode}_{what}_median"] = round(statistics.median(values), 2)
    result["first_clean_archive_over_off"] = round(
        result["archive_first_clean_s_median"] / result["off_first_clean_s_median"], 2
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
