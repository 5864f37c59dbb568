"""The ``kafka-diode`` dispatcher, tested in-process."""

import pytest

from kafka_diode import cli


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kafka-diode ")


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert f"  {name}" in out


def test_unknown_subcommand_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_missing_module_reports_not_available(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "ghost", ("kafka_diode.no_such_module", "x"))
    assert cli.main(["ghost"]) == 2
    assert "not available yet" in capsys.readouterr().err
