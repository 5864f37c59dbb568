"""``kafka-diode bench``: finds the script, passes options through, reports what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import e2e
from kafka_diode import bench_cli


def test_every_listed_bench_that_exists_is_a_script() -> None:
    for script, _ in bench_cli.BENCHES.values():
        path = bench_cli.bench_dir() / script
        assert not path.exists() or path.read_text().startswith('"""')


def test_options_reach_the_script_and_its_exit_code_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "argv.txt"
    (tmp_path / "e2e.py").write_text(
        f"import sys\nopen({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\nsys.exit(3)\n"
    )
    monkeypatch.setattr(bench_cli, "bench_dir", lambda: tmp_path)
    assert bench_cli.main(["e2e", "--case", "200:10", "--help"]) == 3
    assert out.read_text() == "--case 200:10 --help"


def test_a_missing_script_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_cli, "bench_dir", lambda: tmp_path)
    assert bench_cli.main(["dedup"]) == bench_cli.NOT_AVAILABLE
    assert "not available yet" in capsys.readouterr().err
    monkeypatch.setattr(bench_cli, "bench_dir", lambda: tmp_path / "absent")
    assert bench_cli.main(["dedup"]) == bench_cli.NOT_AVAILABLE
    assert "source checkout" in capsys.readouterr().err


def test_unknown_bench_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        bench_cli.main(["nope"])
    assert exc.value.code == 2


def test_the_e2e_bench_refuses_a_work_dir_an_earlier_run_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reused work dir would start the brokers on the last run's data and the dedup on its
    checkpoint: the runs would not be comparable."""
    (tmp_path / "kafka-downstream").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        e2e.main(["--case", "200:10", "--work-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "is not empty" in capsys.readouterr().err
