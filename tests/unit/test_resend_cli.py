"""``kafka-diode bundle show|create`` and ``kafka-diode resend`` without Kafka: refusals and config.

Every refusal here happens before any broker is contacted (the bootstrap address is unreachable
on purpose), so a bad bundle can never cause a partial resend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import bundle as b
from common import bundle_qr
from common.errors import BundleError
from common.gap_record import GapReport, GapState, gap_key, gap_value, latest_gaps
from common.wire import Key, KeyRing
from dedup import bundle_cli
from dedup.bundle_create import BundleConfig
from kafka_diode import cli as dispatcher
from runtime import bundle_files, key_files
from sender import resend_cli

NOWHERE = "127.0.0.1:1"


@pytest.fixture
def ring(tmp_path: Path) -> tuple[Path, KeyRing]:
    keyring = KeyRing([Key.generate()])
    path = tmp_path / "link.key"
    key_files.write_keyring(keyring, path)
    return path, keyring


def _bundle_file(tmp_path: Path, keyring: KeyRing, name: str = "gaps.bundle") -> Path:
    bundle = b.build(
        [("orders", 0, 10, 19), ("orders", 1, 5, 5)],
        bundle_id="abcd",
        created_at_ms=1_700_000_000_000,
    )
    key = keyring.active
    path = tmp_path / name
    path.write_bytes(b.sign(bundle, key_id=key.key_id, link_key=key.material))
    return path


def _show(path: Path, key_file: Path) -> int:
    return bundle_cli.main(
        ["show", str(path), "--key-file", str(key_file)], prog="kafka-diode bundle"
    )


def test_show_prints_per_partition_table(
    tmp_path: Path, ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    key_file, keyring = ring
    assert _show(_bundle_file(tmp_path, keyring), key_file) == 0
    out = capsys.readouterr().out
    assert "11 records in 2 partitions" in out
    assert "10-19" in out
    assert "authentication: OK" in out


def _tampered(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["partitions"][0]["ranges"][0][1] = 18
    doc["partitions"][0]["records"] = 9
    doc["record_count"] = 10
    path.write_text(json.dumps(doc, indent=2))


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def _wrong_version(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["version"] = 2
    path.write_text(json.dumps(doc))


def _not_a_bundle(path: Path) -> None:
    path.write_text('{"hello": "world"}')


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_tampered, "authentication failed"),
        (_truncated, "not valid JSON"),
        (_wrong_version, "version 2 is not supported"),
        (_not_a_bundle, "not a kafka-diode bundle"),
    ],
)
def test_bad_bundles_are_refused_by_show_and_resend(
    tmp_path: Path,
    ring: tuple[Path, KeyRing],
    capsys: pytest.CaptureFixture[str],
    damage: object,
    message: str,
) -> None:
    key_file, keyring = ring
    path = _bundle_file(tmp_path, keyring)
    damage(path)  # type: ignore[operator]
    assert _show(path, key_file) == bundle_cli.EXIT_BAD_BUNDLE
    assert message in capsys.readouterr().err
    code = resend_cli.main(
        ["--bundle", str(path), "--bootstrap-servers", NOWHERE, "--target", "127.0.0.1:9",
         "--key-file", str(key_file), "--no-progress"],
    )  # fmt: skip
    assert code == resend_cli.EXIT_BAD_BUNDLE
    err = capsys.readouterr().err
    assert "bundle refused" in err
    assert message in err


def test_wrong_key_is_refused(
    tmp_path: Path, ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    _, keyring = ring
    path = _bundle_file(tmp_path, keyring)
    other = tmp_path / "other.key"
    key_files.write_keyring(KeyRing([Key.generate()]), other)
    assert _show(path, other) == bundle_cli.EXIT_BAD_BUNDLE
    assert "not in this key ring" in capsys.readouterr().err


def test_same_key_id_other_material_cannot_forge(
    tmp_path: Path, ring: tuple[Path, KeyRing]
) -> None:
    """A MAC made with another key under the right key id is refused."""
    key_file, keyring = ring
    bundle = b.build([("t", 0, 1, 1)], bundle_id="x", created_at_ms=1)
    path = tmp_path / "forged.bundle"
    path.write_bytes(b.sign(bundle, key_id=keyring.active.key_id, link_key=bytes(32)))
    assert _show(path, key_file) == bundle_cli.EXIT_BAD_BUNDLE


def test_missing_bundle_file_is_refused(
    tmp_path: Path, ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    key_file, _ = ring
    assert _show(tmp_path / "nope", key_file) == bundle_cli.EXIT_BAD_BUNDLE
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],  # nothing to resend
        ["--bundle", "x", "--topic", "t"],
        ["--topic", "t", "--from-offset", "1", "--to-offset", "5"],  # no partition
        ["--topic", "t", "--partition", "0", "--from-offset", "5", "--to-offset", "1"],
        ["--topic", "t", "--partition", "0", "--from-offset", "5"],
        ["--topic", "t", "--from-time", "2024-01-01T00:00:00"],  # no zone
        [
            "--topic",
            "t",
            "--from-time",
            "2024-01-02T00:00:00Z",
            "--to-time",
            "2024-01-01T00:00:00Z",
        ],
        ["--bundle", "x", "--partition", "1"],
    ],
)
def test_resend_usage_errors(
    argv: list[str], ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    key_file, _ = ring
    common = [
        "--bootstrap-servers",
        NOWHERE,
        "--target",
        "127.0.0.1:9",
        "--key-file",
        str(key_file),
    ]
    assert resend_cli.main([*argv, *common]) == resend_cli.EXIT_CONFIG
    assert "configuration error" in capsys.readouterr().err


def test_resend_reads_the_live_sender_file_and_env(
    tmp_path: Path,
    ring: tuple[Path, KeyRing],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key_file, _ = ring
    toml = tmp_path / "sender.toml"
    toml.write_text(
        f'bootstrap_servers = "{NOWHERE}"\ntopics = ["orders", "^x"]\ntarget = "127.0.0.1:9"\n'
        f'key_file = "{key_file}"\nmetrics_port = 9461\ngroup_id = "live"\n'
    )
    monkeypatch.setenv("DIODE_SENDER_COPIES", "3")
    code = resend_cli.main(
        [
            "--config",
            str(toml),
            *["--topic", "orders", "--partition", "0", "--from-offset", "0", "--to-offset", "9"],
            "--check-config",
        ]
    )
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["copies"] == 3
    assert shown["group_id"] == "live"  # read, and never used: the resend commits nothing


def test_bundle_create_needs_out_or_dry_run(
    ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    key_file, _ = ring
    argv = [
        "create",
        "--bootstrap-servers",
        NOWHERE,
        "--gap-topic",
        "g",
        "--key-file",
        str(key_file),
    ]
    assert bundle_cli.main(argv) == bundle_cli.EXIT_CONFIG
    assert "--out" in capsys.readouterr().err


def test_bundle_env_takes_the_dedup_names_then_its_own() -> None:
    env = {
        "BOOTSTRAP_SERVERS": "down:9092",
        "GAP_TOPIC": "gaps",
        "KAFKA_CONF_SECURITY_PROTOCOL": "SASL_SSL",
        "DIODE_BUNDLE_GAP_TOPIC": "other.gaps",
        "DIODE_BUNDLE_KEY_FILE": "/k",
        "RAW_TOPICS": "ignored",
    }
    mapped = bundle_cli.bundle_env(env)
    from common import settings  # noqa: PLC0415

    cfg = settings.build(BundleConfig, env=mapped, env_prefix=bundle_files.ENV_PREFIX)
    assert cfg.bootstrap_servers == "down:9092"
    assert cfg.gap_topic == "other.gaps"
    assert cfg.kafka == {"security.protocol": "SASL_SSL"}
    assert cfg.key_file == Path("/k")


def _gap(topic: str, partition: int, first: int, last: int, state: GapState) -> GapReport:
    return GapReport(
        topic=topic, partition=partition, first=first, last=last, state=state,
        detected_at=1, reported_at=2,
    )  # fmt: skip


def test_latest_state_per_gap_key_keeps_open_gaps_only() -> None:
    reports = [
        _gap("a", 0, 10, 19, GapState.OPEN),
        _gap("a", 0, 30, 30, GapState.OPEN),
        _gap("a", 0, 10, 14, GapState.FILLED),  # closed later: same key
        _gap("a", 0, 15, 19, GapState.OPEN),  # the rest of the split gap
        _gap("b", 1, 5, 6, GapState.OPEN),
        _gap("b", 1, 100, 200, GapState.EXPIRED),
        _gap("c", 0, 1, 1, GapState.OPEN),
    ]
    records: list[tuple[bytes | None, bytes | None]] = [(gap_key(r), gap_value(r)) for r in reports]
    records.append((gap_key(reports[-1]), None))  # tombstone removes c:0:1
    records.append((b"a:0:99", b"{not json"))
    records.append((None, b"x"))
    scan = latest_gaps(records)
    assert sorted(scan.open_gaps) == [("a", 0, 15, 19), ("a", 0, 30, 30), ("b", 1, 5, 6)]
    assert scan.malformed == 2
    assert scan.states == {"open": 3, "filled": 1, "expired": 1}
    only_b = latest_gaps(records, topics=["b"])
    assert only_b.open_gaps == [("b", 1, 5, 6)]


def test_write_atomically_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "latest.bundle"
    target.write_bytes(b"old")
    bundle_files.write_atomically(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["latest.bundle"]


def test_summary_of_empty_bundle_says_nothing_to_resend() -> None:
    empty = b.build([], bundle_id="e", created_at_ms=0)
    assert "nothing to resend" in bundle_files.summary_table(empty)


def test_qr_codes_round_trip_through_join(
    tmp_path: Path, ring: tuple[Path, KeyRing], capsys: pytest.CaptureFixture[str]
) -> None:
    key_file, keyring = ring
    gaps = [("orders", p, o * 10, o * 10 + 3) for p in range(4) for o in range(300)]
    bundle = b.build(gaps, bundle_id="qrqr", created_at_ms=1)
    path = tmp_path / "big.bundle"
    key = keyring.active
    path.write_bytes(b.sign(bundle, key_id=key.key_id, link_key=key.material))
    parts = bundle_qr.qr_parts(path.read_bytes())
    assert len(parts) > 1
    texts = []
    for i, part in enumerate(reversed(parts)):  # scanned in any order
        text = tmp_path / f"scan{i}.txt"
        text.write_text(part)
        texts.append(str(text))
    out = tmp_path / "joined.bundle"
    argv = ["bundle", "join", *texts, texts[0], "--out", str(out), "--key-file", str(key_file)]
    assert dispatcher.main(argv) == 0  # the high side's command, routed out of the low side's
    assert b.verify(out.read_bytes(), {key.key_id: key.material}) == bundle
    # a missing code, or codes of two bundles, are refused
    with pytest.raises(BundleError, match="missing"):
        bundle_qr.join_parts(parts[1:])
    other = bundle_qr.qr_parts(_bundle_file(tmp_path, keyring, "small.bundle").read_bytes())
    with pytest.raises(BundleError, match="mixed"):
        bundle_qr.join_parts([*parts, *other])
    # images: one per code
    images = tmp_path / "qr"
    argv = [
        "qr",
        str(path),
        "--out-dir",
        str(images),
        "--key-file",
        str(key_file),
        "--format",
        "svg",
    ]
    assert bundle_cli.main(argv) == 0
    assert len(list(images.glob("qrqr-*-of-*.svg"))) == len(parts)
    capsys.readouterr()


def test_qr_refuses_a_tampered_bundle(tmp_path: Path, ring: tuple[Path, KeyRing]) -> None:
    key_file, keyring = ring
    path = _bundle_file(tmp_path, keyring)
    _tampered(path)
    argv = ["qr", str(path), "--out-dir", str(tmp_path / "qr"), "--key-file", str(key_file)]
    assert bundle_cli.main(argv) == bundle_cli.EXIT_BAD_BUNDLE
    assert not (tmp_path / "qr").exists()
