"""Every command's argparse parser, found by running it, and its options as Markdown.

The configuration dataclasses document the *settings*; this module documents the *command lines*,
for every subcommand of ``kafka-diode`` (``kafka_diode.cli.SUBCOMMANDS``) and each of their own
subcommands, taken from the parsers themselves so nothing can be left out:
``command_parsers`` calls each command's ``main(argv)`` with ``--help`` while
``ArgumentParser.parse_known_args`` is replaced by a function that hands back the parser and stops
the command before it does anything. Subparsers are walked from the parser; subcommands that a
``main`` dispatches by hand before parsing are listed in ``MANUAL_SUBCOMMANDS``.

``docs_gen`` renders the tables into docs/configuration.md; tests/unit/test_docs.py checks every
option string of every parser found here appears there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from collections.abc import Iterator
from typing import Any, NoReturn

from kafka_diode.cli import ROUTES, SUBCOMMANDS

#: (command, first argument) pairs a ``main`` dispatches itself before its parser runs.
MANUAL_SUBCOMMANDS: tuple[tuple[str, str], ...] = (("dedup", "reset"),)


class _Captured(BaseException):
    """Raised from ``parse_known_args`` with the parser that was about to parse.

    A ``BaseException`` so that a command's ``except Exception`` cannot swallow it.
    """

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]


def capture_parser(command: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser ``kafka-diode <command> <argv…>`` builds (nothing else of the command runs).

    Raises:
        LookupError: the command parsed nothing (it has no argparse parser on that path).
    """
    module_name, prog = SUBCOMMANDS[command][0], f"kafka-diode {command}"
    if argv and (command, argv[0]) in ROUTES:  # the dispatcher's routing, as it does it
        module_name, prog, argv = ROUTES[command, argv[0]], f"{prog} {argv[0]}", argv[1:]
    module = importlib.import_module(module_name)
    with _capturing():
        try:
            module.main([*argv, "--help"], prog=prog)
        except _Captured as captured:
            return captured.parser
    raise LookupError(f"kafka-diode {command} {' '.join(argv)}: no argparse parser ran")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse lists subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """``("kafka-diode send", parser)`` for every command and subcommand, in a stable order."""
    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(title: str, parser: argparse.ArgumentParser) -> None:
        out.append((title, parser))
        for name, child in _subparsers(parser).items():
            walk(f"{title} {name}", child)

    for command in SUBCOMMANDS:
        walk(f"kafka-diode {command}", capture_parser(command, []))
        for manual_command, first in (*MANUAL_SUBCOMMANDS, *ROUTES):
            if manual_command == command:
                walk(f"kafka-diode {command} {first}", capture_parser(command, [first]))
    return out


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Options and positionals a user can give (help, hidden and subcommand actions left out)."""
    return [
        action
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    elif action.option_strings:
        metavar = action.dest.upper()
    else:
        metavar = action.dest
    if action.nargs == "?":
        return f"[{metavar}]"
    if action.nargs in ("*", "+", argparse.REMAINDER):
        return f"{metavar} …"
    return metavar


def options_table(parser: argparse.ArgumentParser) -> str:
    """The parser's options as a Markdown table (option, argument, description)."""
    formatter = parser._get_formatter()  # expands %(default)s as --help does
    rows = ["| option | argument | description |", "|---|---|---|"]
    for action in documented_actions(parser):
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{_argument(action)}`"
        argument = f"`{_argument(action)}`" if action.option_strings and _argument(action) else ""
        described = formatter._expand_help(action) if action.help else ""
        if action.required and action.option_strings:
            described = f"**required.** {described}"
        rows.append(f"| {names} | {argument} | {_cell(described)} |")
    return "\n".join(rows)


def render() -> str:
    """Every command's options, one section per command (Markdown, level-3 headings)."""
    parts: list[str] = []
    for title, parser in command_parsers():
        subcommands = _subparsers(parser)
        parts.append(f"### {title}\n")
        if parser.description:
            parts.append(_cell(parser.description) + "\n")
        if subcommands:
            listed = ", ".join(f"`{name}`" for name in subcommands)
            parts.append(f"Subcommands: {listed} (below).\n")
        if documented_actions(parser):
            parts.append(options_table(parser) + "\n")
    return "\n".join(parts)
