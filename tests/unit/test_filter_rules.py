"""The content filter's rules and verdicts (pure), its configuration keys and its reload glue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.errors import ConfigError
from sender.config import SenderConfig
from sender.filter_rules import ContentFilter, Verdict, parse_rule, parse_rules_text
from sender.record_filter import SEND, SKIP, WITHHOLD, RecordFilter, build_filter

#: Catastrophic backtracking on a run of x's: never finishes in any useful time.
SLOW = r"(x+x+)+y"


def _filter(*lines: str, default: str = "allow", timeout: float = 0.05) -> ContentFilter:
    rules = [parse_rule(line, f"t[{i}]", "filter_rules") for i, line in enumerate(lines)]
    return ContentFilter(rules, default, timeout)  # type: ignore[arg-type]


def _config(**kw: object) -> SenderConfig:
    return SenderConfig(
        bootstrap_servers="k:9092",
        target="127.0.0.1:1",
        topics=("t",),
        insecure_cleartext=True,
        **kw,
    )  # type: ignore[arg-type]


def test_the_first_matching_rule_decides() -> None:
    f = _filter("allow value ^public", "deny value secret", "deny key ^internal")
    assert f.verdict(b"k", b"public but secret", None) is Verdict.SEND
    assert f.verdict(b"k", b"a secret", None) is Verdict.DENY_RULE
    assert f.verdict(b"internal-1", b"plain", None) is Verdict.DENY_RULE
    assert f.verdict(b"k", b"plain", None) is Verdict.SEND


def test_the_default_decides_when_nothing_matches() -> None:
    f = _filter("allow value ^ok", default="deny")
    assert f.verdict(None, b"ok go", None) is Verdict.SEND
    assert f.verdict(None, b"other", None) is Verdict.DENY_DEFAULT
    assert _filter(default="deny").verdict(None, b"x", None) is Verdict.DENY_DEFAULT
    assert _filter(default="allow").verdict(None, b"x", None) is Verdict.SEND


def test_header_rules_match_header_names_not_values() -> None:
    f = _filter("deny header ^x-classified$")
    assert f.verdict(None, b"v", [("x-classified", b"1")]) is Verdict.DENY_RULE
    assert f.verdict(None, b"v", [("trace", b"x-classified")]) is Verdict.SEND
    assert f.verdict(None, b"v", None) is Verdict.SEND


def test_null_keys_and_values_match_nothing_but_empty_ones_do() -> None:
    f = _filter("deny value ^$", "deny key ^$")
    assert f.verdict(None, None, None) is Verdict.SEND
    assert f.verdict(None, b"", None) is Verdict.DENY_RULE
    assert f.verdict(b"", b"x", None) is Verdict.DENY_RULE


def test_patterns_match_utf8_bytes() -> None:
    f = _filter("deny value (?i)geheim|résumé")
    assert f.verdict(None, b"ein GEHEIM", None) is Verdict.DENY_RULE
    assert f.verdict(None, "mon résumé".encode(), None) is Verdict.DENY_RULE
    assert f.verdict(None, b"\xff\xfe binary", None) is Verdict.SEND


def test_a_rule_that_runs_over_its_time_fails_closed_even_if_it_allows() -> None:
    f = _filter(f"allow value {SLOW}", timeout=0.005)
    assert f.verdict(None, b"x" * 5000, None) is Verdict.ERROR
    assert f.verdict(None, b"xxy", None) is Verdict.SEND  # the same rule, quick on this input
    g = _filter(f"deny value {SLOW}", default="allow", timeout=0.005)
    assert g.verdict(None, b"x" * 5000, None) is Verdict.ERROR


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("permit value x", "action 'permit'"),
        ("deny body x", "field 'body'"),
        ("deny value", "is not a rule"),
        ("deny value (unclosed", "does not compile"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_key_and_where(line: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(filter_rules=("allow value ok", line))
    assert err.value.key == "filter_rules"
    assert says in str(err.value)
    assert "filter_rules[1]" in str(err.value)


def test_a_rules_file_skips_comments_and_names_the_bad_line(tmp_path: Path) -> None:
    text = "# policy\n\nallow value ^ok\n  # indented comment\ndeny key [\n"
    with pytest.raises(ConfigError) as err:
        parse_rules_text(text, "rules.txt", "filter_file")
    assert err.value.key == "filter_file"
    assert "rules.txt:5" in str(err.value)
    rules = parse_rules_text("# c\nallow value ^ok\ndeny value .\n", "r", "filter_file")
    assert [(r.action, r.field, r.pattern) for r in rules] == [
        ("allow", "value", "^ok"),
        ("deny", "value", "."),
    ]


def test_inline_rules_come_before_the_files(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    path.write_text("deny value .\n")
    built = build_filter(_config(filter_rules=("allow value ^keep",), filter_file=path))
    assert built is not None
    assert built.verdict(None, b"keep me", None) is Verdict.SEND
    assert built.verdict(None, b"drop me", None) is Verdict.DENY_RULE
    assert build_filter(_config()) is None


def test_filter_settings_are_validated() -> None:
    with pytest.raises(ConfigError) as err:
        _config(filter_rules=("deny value x",), filter_timeout_ms=0)
    assert err.value.key == "filter_timeout_ms"
    with pytest.raises(ConfigError) as err:
        _config(filter_check_interval=-1)
    assert err.value.key == "filter_check_interval"
    with pytest.raises(ConfigError) as err:
        build_filter(_config(filter_file=Path("/nonexistent/rules")))
    assert err.value.key == "filter_file"


def test_a_changed_rules_file_is_reloaded_and_a_broken_one_keeps_the_rules(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules"
    path.write_text("deny value a\n")
    live = RecordFilter(_config(filter_file=path))
    assert live.decide("t", 0, 0, None, b"a", None) == WITHHOLD
    assert live.decide("t", 0, 1, None, b"b", None) == SEND
    assert not live.changed()

    path.write_text("deny value b\n")
    os.utime(path, ns=(1, 10**18))  # a new mtime whatever the file system's resolution
    assert live.changed()
    assert live.reload("test")
    assert live.decide("t", 0, 2, None, b"a", None) == SEND
    assert live.decide("t", 0, 3, None, b"b", None) == WITHHOLD

    path.write_text("deny value (\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert live.changed()
    assert not live.reload("test")  # the rules in force stay
    assert not live.changed()  # and the broken file is not retried in a loop
    assert live.decide("t", 0, 4, None, b"b", None) == WITHHOLD
    assert (live.reloads, live.reload_errors) == (1, 1)
    assert live.withheld == {"deny_rule": 3, "deny_default": 0, "error": 0}


def test_withheld_records_are_counted_by_verdict(tmp_path: Path) -> None:
    live = RecordFilter(
        _config(
            filter_rules=("deny key ^x", f"allow value {SLOW}"),
            filter_default="deny",
            filter_timeout_ms=5,
        )
    )
    assert live.decide("t", 0, 0, b"x", b"v", None) == WITHHOLD
    assert live.decide("t", 0, 1, b"k", b"v", None) == WITHHOLD
    assert live.decide("t", 0, 2, b"k", b"x" * 5000, None) == SKIP  # a gap downstream
    assert live.decide("t", 0, 3, b"k", b"xxy", None) == SEND
    assert live.withheld == {"deny_rule": 1, "deny_default": 1, "error": 1}
    assert live.withheld_total == 3
