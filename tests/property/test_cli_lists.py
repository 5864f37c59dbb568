"""Every list option of every command keeps every value it is given (docs/configuration.md,
"Lists, tables and typos"), and no parser takes abbreviations.

The parsers are found by running the commands (``kafka_diode.cli_reference.command_parsers``), so a
new command or option is covered without being listed here.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.settings import ListAction
from kafka_diode import cli_reference

ROOT = Path(__file__).resolve().parents[2]
PARSERS = cli_reference.command_parsers()


#: Options whose help says "comma-separated" but whose value is one string handed on as it is
#: (librdkafka's bootstrap.servers): scalars, where a repeat replaces the value.
ONE_STRING = frozenset({"bootstrap_servers"})


def _is_list_option(action: argparse.Action) -> bool:
    """An option that can hold more than one value, whatever its action."""
    return bool(action.option_strings) and (
        isinstance(action, ListAction | argparse._AppendAction | argparse._ExtendAction)
        or action.nargs in ("+", "*")
        or ("comma-separated" in (action.help or "") and action.dest not in ONE_STRING)
    )


LIST_OPTIONS = [
    pytest.param(parser, action, id=f"{title} {action.option_strings[0]}")
    for title, parser in PARSERS
    for action in parser._actions
    if _is_list_option(action)
]


def test_the_walk_finds_the_list_options_operators_use() -> None:
    found = {p.id for p in LIST_OPTIONS}
    for must in (
        "kafka-diode send --topics",
        "kafka-diode send --rename",
        "kafka-diode send --kafka",
        "kafka-diode send --check-chains",
        "kafka-diode receive --listen-ports",
        "kafka-diode dedup --raw-topics",
        "kafka-diode dedup --spark-conf",
        "kafka-diode resend --partition",
        "kafka-diode bundle create --topic",
        "kafka-diode status --raw-topics",
        "kafka-diode status --receiver-metrics",
        "kafka-diode keygen --merge",
        "kafka-diode demo verify --topics",
    ):
        assert must in found, must


@pytest.mark.parametrize(("parser", "action"), LIST_OPTIONS)
def test_every_list_option_is_a_list_action(
    parser: argparse.ArgumentParser, action: argparse.Action
) -> None:
    """One rule for every command: the shared action, never argparse's keep-the-last store."""
    assert isinstance(action, ListAction), f"{parser.prog} {action.option_strings[0]}"
    assert action.default is None  # unset: the file's or environment's list stays


def _required_argv(parser: argparse.ArgumentParser) -> list[str]:
    """Values for the parser's positionals and required options, so that it parses at all."""
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings and not action.required:
            continue
        value = str(next(iter(action.choices))) if action.choices else "1"
        argv += [*action.option_strings[:1], value]
    return argv


_TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789._", min_size=1, max_size=8)


def _values(action: ListAction) -> st.SearchStrategy[list[str]]:
    if action.item_type is int:
        item: st.SearchStrategy[str] = st.integers(0, 10_000).map(str)
    elif action.metavar == "PROP=VALUE":
        item = st.builds(lambda k, v: f"{k}={v}", _TOKEN, _TOKEN)
    else:
        item = _TOKEN
    return st.lists(item, min_size=1, max_size=4)


def _occurrence(action: ListAction, values: list[str]) -> list[str]:
    """One occurrence of the option carrying ``values``."""
    flag = action.option_strings[0]
    if action.nargs in ("+", "*"):
        return [flag, *values]
    if action.split:
        return [flag, ",".join(values)]
    return [arg for value in values for arg in (flag, value)]


def _typed(action: ListAction, values: list[str]) -> list[Any]:
    return [action.item_type(v) if action.item_type else v for v in values]


@pytest.mark.parametrize(("parser", "action"), LIST_OPTIONS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_list_option_given_twice_keeps_both(
    parser: argparse.ArgumentParser, action: argparse.Action, data: st.DataObject
) -> None:
    assert isinstance(action, ListAction)
    first = data.draw(_values(action), label="first")
    second = data.draw(_values(action), label="second")
    argv = [*_required_argv(parser), *_occurrence(action, first), *_occurrence(action, second)]
    args = parser.parse_args(argv)
    assert getattr(args, action.dest) == _typed(action, first + second)


@pytest.mark.parametrize(("parser", "action"), LIST_OPTIONS)
def test_an_empty_list_option_gives_the_empty_list(
    parser: argparse.ArgumentParser, action: argparse.Action
) -> None:
    """``--topics ""`` clears the file's list; not given, the option leaves it alone (None)."""
    assert isinstance(action, ListAction)
    assert getattr(parser.parse_args(_required_argv(parser)), action.dest) is None
    if action.split and action.nargs is None:
        empty = parser.parse_args([*_required_argv(parser), action.option_strings[0], ""])
        assert getattr(empty, action.dest) == []


def abbreviations_taken(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option less its last letter that the parser accepts (as the option)."""
    actions = {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}
    taken = []
    for option, action in sorted(actions.items()):
        prefix = option[:-1]
        if len(prefix) < 3 or any(o.startswith(prefix) and o != option for o in actions):
            continue  # "--" alone, or a prefix of two options: never an abbreviation of one
        value = [] if action.nargs == 0 else [str(next(iter(action.choices or ["1"])))]
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                parser.parse_args([prefix, *value, *_required_argv(parser)])
        except SystemExit as exc:
            if exc.code == 2:
                continue  # refused, as it should be
        taken.append(prefix)
    return taken


@pytest.mark.parametrize(("title", "parser"), PARSERS, ids=[t for t, _ in PARSERS])
def test_no_parser_takes_abbreviations(title: str, parser: argparse.ArgumentParser) -> None:
    assert parser.allow_abbrev is False, title
    assert abbreviations_taken(parser) == [], title


def test_the_abbreviation_check_finds_a_parser_that_guesses() -> None:
    """The check above would fail on argparse's default (``--rate-byte`` for ``--rate-bytes``)."""
    parser = next(p for t, p in PARSERS if t == "kafka-diode send")
    guessing = copy.copy(parser)
    guessing.allow_abbrev = True
    assert "--rate-byte" in abbreviations_taken(guessing)


def test_every_argument_parser_in_the_repository_refuses_abbreviations() -> None:
    """Benchmarks and scripts too: every ``ArgumentParser(...)`` and ``add_parser(...)`` call says
    ``allow_abbrev=False`` (argparse's default is to guess)."""
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = []
    for name in files:
        tree = ast.parse((ROOT / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called not in ("ArgumentParser", "add_parser") or name.startswith("tests/"):
                continue
            if not any(
                k.arg == "allow_abbrev"
                and isinstance(k.value, ast.Constant)
                and k.value.value is False
                for k in node.keywords
            ):
                missing.append(f"{name}:{node.lineno}")
    assert not missing, missing
