"""The content filter, pure: which records may cross, and the withheld offsets as ranges.

Theory of operation (docs/sender.md, "Content filter"). A filter is an ordered list of rules and
a default action. A rule is ``allow|deny FIELD REGEX`` with FIELD one of ``value``, ``key`` or
``header`` (a header *name*); the regular expression is searched (unanchored, anchor with ``^``
and ``$``) in the raw bytes, so a pattern written in UTF-8 text matches UTF-8 data. The first
rule that matches decides; when none does, the default does. A null key or value matches
nothing (not even ``^$``: an empty value is not a null one).

Failing closed: a rule whose search raises or runs over ``timeout`` seconds (the ``regex``
package's own timeout; catastrophic backtracking is the usual cause) withholds the record and
says ``ERROR``, whatever its action. A peer that sends on error turns a slow pattern into a
leak; here it becomes a counted, logged withheld record.

Withheld records are never sent, and never gaps: the wire encoder folds their offsets into
ranges and sends them as a withheld message (``Encoder.withhold``, docs/protocol.md §5a), so the
dedup records them as filtered. Nothing here reads a file or a clock; ``sender/record_filter.py``
loads and reloads the rules.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import regex

from common.errors import ConfigError

Action = Literal["allow", "deny"]
Field = Literal["value", "key", "header"]
ACTIONS: Final = ("allow", "deny")
FIELDS: Final = ("value", "key", "header")
#: A rules file or inline list longer than this is a mistake, not a policy (and each rule costs
#: a search per record).
MAX_RULES: Final = 1000


class Verdict(enum.IntEnum):
    """What the filter decided for one record (the metric label is the lower-case name)."""

    SEND = 0
    DENY_RULE = 1
    """A deny rule matched."""
    DENY_DEFAULT = 2
    """No rule matched and the default is deny."""
    ERROR = 3
    """A rule raised or timed out: withheld (fail closed)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One compiled ``allow|deny FIELD REGEX`` line."""

    action: Action
    field: Field
    pattern: str
    compiled: regex.Pattern[bytes]
    origin: str
    """Where it was written (``file:line`` or ``filter_rules[i]``), for messages."""


def parse_rule(text: str, origin: str, key: str) -> Rule:
    """One rule from ``allow|deny FIELD REGEX`` (one space or more between the parts).

    Raises:
        ConfigError: naming ``key`` and ``origin``: unknown action or field, no pattern, or a
            pattern that does not compile.
    """
    parts = text.strip().split(None, 2)
    if len(parts) < 3:
        raise ConfigError(
            key,
            f"{origin}: {text.strip()!r} is not a rule",
            "write 'allow|deny value|key|header REGEX', e.g. 'deny value (?i)secret'",
        )
    action, field_name, pattern = parts
    if action not in ACTIONS:
        raise ConfigError(key, f"{origin}: action {action!r}", "use allow or deny")
    if field_name not in FIELDS:
        raise ConfigError(key, f"{origin}: field {field_name!r}", "use value, key or header")
    try:
        compiled = regex.compile(pattern.encode("utf-8"))
    except regex.error as exc:
        raise ConfigError(
            key, f"{origin}: pattern {pattern!r} does not compile ({exc})", "fix the expression"
        ) from exc
    return Rule(action, field_name, pattern, compiled, origin)  # type: ignore[arg-type]


def parse_rules_text(text: str, source: str, key: str) -> list[Rule]:
    """Rules from a rules file: one per line; blank lines and lines starting with ``#`` skipped.

    Raises:
        ConfigError: naming ``key``, the file and the line of the first bad rule, or too many.
    """
    rules = [
        parse_rule(line, f"{source}:{number}", key)
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(rules) > MAX_RULES:
        raise ConfigError(key, f"{source}: {len(rules)} rules", f"keep at most {MAX_RULES}")
    return rules


class ContentFilter:
    """First matching rule wins; else the default. Immutable once built."""

    def __init__(self, rules: Sequence[Rule], default: Action, timeout: float) -> None:
        """Raises ConfigError when ``default`` is not allow/deny or ``timeout`` not positive."""
        if default not in ACTIONS:
            raise ConfigError("filter_default", f"is {default!r}", "use allow or deny")
        if not timeout > 0:
            raise ConfigError("filter_timeout_ms", f"is {timeout * 1000:g}", "use more than 0")
        if len(rules) > MAX_RULES:
            raise ConfigError("filter_rules", f"{len(rules)} rules", f"keep at most {MAX_RULES}")
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.default: Action = default
        self.timeout = timeout
        self._otherwise = Verdict.SEND if default == "allow" else Verdict.DENY_DEFAULT
        self._matchers = [
            (rule.compiled.search, rule.field, rule.action == "allow") for rule in self.rules
        ]

    def verdict(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] | None,
    ) -> Verdict:
        """Decide one record. Never raises: an error in a rule is ``ERROR`` (withhold)."""
        timeout = self.timeout
        names: list[bytes] | None = None
        try:
            for search, field_name, allow in self._matchers:
                if field_name == "value":
                    hit = value is not None and search(value, timeout=timeout) is not None
                elif field_name == "key":
                    hit = key is not None and search(key, timeout=timeout) is not None
                else:
                    if names is None:
                        names = [name.encode("utf-8") for name, _ in headers or ()]
                    hit = any(search(name, timeout=timeout) is not None for name in names)
                if hit:
                    return Verdict.SEND if allow else Verdict.DENY_RULE
        except Exception:  # noqa: BLE001  fail closed: whatever a rule raised, withhold
            return Verdict.ERROR
        return self._otherwise

    def describe(self) -> str:
        """One line for the start-up log."""
        return f"{len(self.rules)} rule(s), default {self.default}"
