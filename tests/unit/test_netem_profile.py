"""Profile vocabulary: parsing, validation, TOML, tc rendering (netem/profile.py)."""

from pathlib import Path

import pytest

from common.errors import ConfigError
from netem import cli
from netem.profile import (
    NAMED_PROFILES,
    Profile,
    load_toml,
    parse_netem,
    parse_rate,
    parse_time_ms,
    resolve,
)


def test_one_liner_from_the_docs() -> None:
    p = parse_netem("loss 5% duplicate 1% delay 10ms 2ms reorder 25% gap 5 corrupt 0.1%")
    assert p == Profile(loss=5, duplicate=1, delay=10, jitter=2, reorder=25, gap=5, corrupt=0.1)


def test_one_liner_correlations_gemodel_rate_limit_seed() -> None:
    p = parse_netem("loss 5% 25% delay 1s 500us 10% rate 10mbit limit 50 seed 7")
    assert (p.loss, p.loss_correlation) == (5.0, 25.0)
    assert (p.delay, p.jitter, p.delay_correlation) == (1000.0, 0.5, 10.0)
    assert (p.rate, p.limit, p.seed) == (10_000_000, 50, 7)
    ge = parse_netem("loss gemodel 1% 10% 70% 0.1%")
    assert (ge.ge_p, ge.ge_r, ge.ge_1_h, ge.ge_1_k) == (1.0, 10.0, 70.0, 0.1)
    assert parse_netem("loss gemodel 2%").ge_r_effective == 98.0  # netem's default r = 1 - p


@pytest.mark.parametrize("name", sorted(NAMED_PROFILES))
def test_every_named_profile_round_trips_through_netem_words(name: str) -> None:
    profile = NAMED_PROFILES[name].with_seed(3)
    parsed = parse_netem(profile.to_netem_words())
    # ge_r is rendered with its default applied; compare what the models do.
    assert parsed.to_tc_args(include_seed=True) == profile.to_tc_args(include_seed=True)
    assert parsed.mean_loss == pytest.approx(profile.mean_loss)


def test_to_tc_args() -> None:
    p = Profile(loss=5, loss_correlation=25, delay=10, jitter=2, reorder=25, gap=5, rate=1_000_000)
    assert p.to_tc_args() == [
        "limit", "1000", "delay", "10ms", "2ms", "loss", "random", "5%", "25%",
        "reorder", "25%", "gap", "5", "rate", "1000000bit",
    ]  # fmt: skip
    assert Profile().to_tc_args() == ["limit", "1000"]
    assert Profile(seed=4).to_tc_args() == ["limit", "1000"]
    assert Profile(seed=4).to_tc_args(include_seed=True)[-2:] == ["seed", "4"]


@pytest.mark.parametrize(
    ("text", "bits"),
    [("10mbit", 10_000_000), ("1kibit", 1024), ("125kbps", 1_000_000), ("1.5gbit", 1_500_000_000),
     ("300", 300), (8000, 8000)],
)  # fmt: skip
def test_rates_like_tc(text: str | int, bits: int) -> None:
    assert parse_rate("rate", text) == bits


def test_times_like_tc() -> None:
    assert parse_time_ms("delay", "10ms") == 10.0
    assert parse_time_ms("delay", "2s") == 2000.0
    assert parse_time_ms("delay", "250us") == 0.25
    assert parse_time_ms("delay", 7) == 7.0


@pytest.mark.parametrize(
    ("words", "key"),
    [
        ("loss 150%", "loss"),
        ("loss 5", "loss"),
        ("reorder 10%", "reorder"),
        ("delay 10", "delay"),
        ("loss 5% loss gemodel 1%", "loss"),
        ("rate 10mbits", "rate"),
        ("lose 5%", "lose"),
        ("gap 3 delay 1ms", "gap"),
        ("loss state 1%", "loss state"),
        ("limit 0", "limit"),
        ("delay", "delay"),
    ],
)
def test_bad_words_name_the_key(words: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_netem(words)
    assert info.value.key == key


def test_constructor_validates() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        Profile(duplicate=-1)
    with pytest.raises(ConfigError, match="ge_r"):
        Profile(ge_r=5)
    with pytest.raises(ConfigError, match="seed"):
        Profile(seed=-1)
    with pytest.raises(ConfigError, match="jitter"):
        Profile(jitter=float("nan"))


def test_toml_table_top_level_and_one_liner(tmp_path: Path) -> None:
    table = tmp_path / "a.toml"
    table.write_text('[profile]\nloss = 5\ndelay = "10ms"\njitter = 2\nrate = "1mbit"\nseed = 9\n')
    assert load_toml(table) == Profile(loss=5, delay=10, jitter=2, rate=1_000_000, seed=9)
    top = tmp_path / "b.toml"
    top.write_text('ge_p = 1.0\nge_r = "20%"\n')
    assert load_toml(top) == NAMED_PROFILES["bursty"]
    words = tmp_path / "c.toml"
    words.write_text('netem = "duplicate 10%"\n')
    assert resolve(str(words)) == NAMED_PROFILES["duplicate-10"]


def test_toml_unknown_key_suggests(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[profile]\nlos = 5\n")
    with pytest.raises(ConfigError, match="did you mean 'loss'"):
        load_toml(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("loss = \n")
    with pytest.raises(ConfigError, match="cannot read profile"):
        load_toml(broken)


def test_resolve_name_words_and_seed_override() -> None:
    assert resolve("lossy-5") == Profile(loss=5)
    assert resolve("lossy-5", seed=1).seed == 1
    assert resolve("loss 1%") == NAMED_PROFILES["lossy-1"]
    with pytest.raises(ConfigError, match="lossy-5"):
        resolve("lossy5")


def test_named_profiles_say_what_they_are() -> None:
    assert NAMED_PROFILES["clean"].is_clean
    assert NAMED_PROFILES["bursty"].mean_loss == pytest.approx(1 / 21)
    hostile = NAMED_PROFILES["hostile"]
    assert hostile.loss
    assert hostile.duplicate
    assert hostile.reorder
    assert hostile.corrupt
    assert hostile.delay
    assert hostile.jitter


def test_cli_profiles_and_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMED_PROFILES)
    assert cli.main(["apply", "--dev", "eth9", "--profile", "lossy-5", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == (
        "tc qdisc replace dev eth9 root netem limit 1000 loss random 5%"
    )
    assert cli.main(["apply", "--dev", "eth9", "--profile", "loss 500%", "--dry-run"]) == 2
    assert "loss" in capsys.readouterr().err


def test_cli_relay_requires_forward(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["relay", "--listen", "127.0.0.1:0"]) == 2
    assert "forward" in capsys.readouterr().err
