"""An unpaced sender is told so: --check-config (stderr) for send and resend; paced ones are not."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from kafka_diode import cli


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "link.key"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["keygen", "--out", str(path)]) == 0
    return path


def _check(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*argv, "--check-config"])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", ["send", "resend"])
@pytest.mark.parametrize(
    ("pacing", "warned"),
    [([], True), (["--rate-bytes", "50000000"], False), (["--rate-datagrams", "20000"], False)],
)
def test_check_config_says_when_pacing_is_unset(
    command: str, pacing: list[str], warned: bool, key_file: Path
) -> None:
    argv = [command, "--bootstrap-servers", "127.0.0.1:1", "--target", "127.0.0.1:9470"]
    argv += ["--key-file", str(key_file), *pacing]
    # a range, not a bundle: --check-config reads and verifies a bundle it is given
    argv += (
        ["--topics", "orders"]
        if command == "send"
        else ["--topic", "orders", "--partition", "0", "--from-offset", "0", "--to-offset", "9"]
    )
    code, out, err = _check(argv)
    assert code == 0, err
    shown = json.loads(out)  # stdout stays pure JSON either way
    assert ("pacing is off" in err) is warned, err
    if warned:
        assert shown["rate_bytes"] == 0
        assert len(err.strip().splitlines()) == 1
        assert "--rate-bytes" in err
