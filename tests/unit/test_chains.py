"""Chains (docs/sender.md "Chains"): the sender's chain keys, the plan check over all chains'
files (``kafka-diode send --check-chains``), the heartbeat fields and the dedup's vouching."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from common.errors import ConfigError
from common.raw_topic import heartbeat_records
from common.wire import Heartbeat
from dedup.rows import KIND_HEARTBEAT
from sender import cli
from sender.chain_plan import plan_problems
from sender.config import SenderConfig
from tests.dedup_support import FakeState, detect_one_partition, frame
from tests.unit.test_dedup_job import DATA, PARAMS, open_gaps, settle

SESSION = bytes(16)


def _config(**kw: object) -> SenderConfig:
    values: dict[str, object] = {
        "bootstrap_servers": "k:9092",
        "target": "127.0.0.1:1",
        "topics": ("orders",),
        "insecure_cleartext": True,
    }
    values.update(kw)
    return SenderConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("chain", ["1", "0/2", "3/2", "a/b", "1/65", "-1/2"])
def test_a_bad_chain_is_refused_naming_the_key(chain: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(chain=chain)
    assert err.value.key == "chain"


def test_share_mode_carries_one_residue_copy_mode_everything() -> None:
    assert _config().chain_share() is None
    assert _config(chain="2/3").chain_share() == (1, 3)
    assert _config(chain="1/1").chain_share() is None
    assert _config(chain="2/3", chain_mode="copy").chain_share() is None
    assert _config(chain="2/3").chain_counters() == {
        "chain_index": 2,
        "chain_count": 3,
        "chain_share": 1,
    }
    assert _config(chain="1/2", chain_mode="copy").chain_counters()["chain_share"] == 0
    assert _config().chain_counters() == {}


def _members(*specs: tuple[str, str]) -> list[tuple[str, SenderConfig]]:
    return [
        (f"s{i}", _config(chain=chain, group_id=group)) for i, (chain, group) in enumerate(specs)
    ]


def test_a_complete_set_of_chains_has_no_problem() -> None:
    assert plan_problems(_members(("1/3", "a"), ("2/3", "b"), ("3/3", "c"))) == []


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        ((("1/2", "a"), ("1/2", "b")), "s0 and s1 are all chain 1/2"),
        ((("1/2", "a"), ("1/2", "b")), "no sender is chain 2/2"),
        ((("1/2", "a"), ("2/3", "b")), "disagree on N"),
        ((("1/2", "a"), ("2/2", "a")), "share 'a'"),
        ((("1/2", "a"), ("", "b")), "s1: chain is not set"),
    ],
)
def test_a_broken_set_of_chains_is_named(specs: tuple[tuple[str, str], ...], says: str) -> None:
    problems = plan_problems(_members(*specs))
    assert any(says in p for p in problems), problems


def test_chains_must_read_the_same_source() -> None:
    members = _members(("1/2", "a"), ("2/2", "b"))
    members[1] = ("s1", _config(chain="2/2", group_id="b", topics=("other",)))
    assert any(p.startswith("topics:") for p in plan_problems(members))
    members[1] = ("s1", _config(chain="2/2", group_id="b", chain_mode="copy"))
    assert any(p.startswith("chain_mode:") for p in plan_problems(members))


def test_check_chains_reads_the_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def write(name: str, chain: str, group: str) -> Path:
        path = tmp_path / name
        path.write_text(
            "[sender]\nbootstrap_servers = 'k:9092'\ntarget = '127.0.0.1:1'\n"
            f"topics = ['orders']\ninsecure_cleartext = true\nchain = '{chain}'\n"
            f"group_id = '{group}'\n"
        )
        return path

    mine = write("a.toml", "1/3", "a")
    ok = [write("b.toml", "2/3", "b"), write("c.toml", "3/3", "c")]
    assert cli.main(["--config", str(mine), "--check-chains", *map(str, ok)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "3 chains, share: every offset is carried by exactly one chain" in out
    bad = write("d.toml", "2/3", "d")
    assert cli.main(["--config", str(mine), "--check-chains", str(ok[0]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "no sender is chain 3/3" in err
    assert "are all chain 2/3" in err


def test_heartbeat_control_records_carry_the_chain() -> None:
    beat = Heartbeat(
        SESSION, 0, "s", 1, 2, (("t", 0, 9),), (("t", 0, 0),),
        (("records_read", 5), ("chain_index", 2), ("chain_count", 3), ("chain_share", 1)),
    )  # fmt: skip
    [(_, _, _, value)] = heartbeat_records(beat)
    assert b'"chain_index":2,"chain_count":3,"chain_share":1' in value
    plain = Heartbeat(SESSION, 0, "s", 1, 2, (("t", 0, 9),), (("t", 0, 0),), ())
    assert b"chain" not in next(iter(heartbeat_records(plain)))[3]


def _rows(*items: tuple[int, int, int]) -> pd.DataFrame:
    """(kind, src_offset, hb_chain) rows as classify() produces them; every chain heartbeat
    names its session's low offset (0): it must not vouch."""
    return frame(*[(k, o, 0 if k == KIND_HEARTBEAT else -1, -1, c) for k, o, c in items])


def test_the_dedup_vouches_per_share_chain_not_for_the_fastest_one() -> None:
    state = FakeState()
    hb = KIND_HEARTBEAT
    chain1, chain2 = 2 * 256 + 1, 2 * 256 + 2
    # chain 1 (even offsets) is at 20, chain 2 (odd) only at 5: 7..19 odd are not due yet
    rows = [(DATA, o, -1) for o in [*range(0, 21, 2), 1, 3, 5]]
    frames = [_rows(*rows, (hb, 20, chain1), (hb, 5, chain2))]
    list(detect_one_partition(PARAMS, ("t", 0), iter(frames), state))
    assert open_gaps(settle(state)) == []
    out = list(detect_one_partition(PARAMS, ("t", 0), iter([_rows((hb, 11, chain2))]), state))
    stats = pd.concat(out)
    assert int(stats["chains_missing"].max()) == 0
    assert open_gaps(settle(state)) == [(7, 7), (9, 9), (11, 11)]  # now chain 2 vouched to 11
