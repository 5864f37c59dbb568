"""The content filter in a running sender (glue): rules from config and file, reload, counts.

The decisions are ``sender.filter_rules``'s (pure); this module reads ``filter_file``, swaps in
a new filter when the file changes (``runtime.file_watch``: a file that no longer parses keeps
the filter in force; withholding everything because of a typo, or sending everything, would both
surprise the operator at 3 a.m.; the failure is logged and counted instead), and counts what was
withheld by verdict. Used by live sending (``sender/app.py``) and resend
(``sender/resend_job.py``) alike, so a resend withholds exactly what live sending would.
"""

from __future__ import annotations

import logging
from pathlib import Path

from common.errors import ConfigError
from common.logging import RateLimitedLog
from runtime.file_watch import FileReloader
from sender.config import SenderConfig
from sender.filter_rules import ContentFilter, Rule, Verdict, parse_rules_text

log = logging.getLogger(__name__)

#: What ``RecordFilter.decide`` says to do with a record.
SEND, WITHHOLD, SKIP = 0, 1, 2
#: Metric label of each withholding verdict.
LABELS = {
    Verdict.DENY_RULE: "deny_rule",
    Verdict.DENY_DEFAULT: "deny_default",
    Verdict.ERROR: "error",
}


def _file_rules(path: Path) -> list[Rule]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "filter_file", f"cannot read {path}: {exc}", "give a readable UTF-8 rules file"
        ) from exc
    return parse_rules_text(text, str(path), "filter_file")


def build_filter(config: SenderConfig) -> ContentFilter | None:
    """The configured filter (inline rules first, then the file's), or None when there is none.

    Raises:
        ConfigError: naming ``filter_rules`` or ``filter_file`` and the rule that is wrong.
    """
    return _compose(config) if config.filtering else None


def _compose(config: SenderConfig) -> ContentFilter:
    rules = config.inline_filter_rules()
    if config.filter_file is not None:
        rules += _file_rules(config.filter_file)
    return ContentFilter(rules, config.filter_default, config.filter_timeout_ms / 1000)


class RecordFilter:
    """The live filter, its rules file and its counters."""

    def __init__(self, config: SenderConfig) -> None:
        """Raises ConfigError as ``build_filter`` (call only when ``config.filtering``)."""
        self._config = config
        self.file = FileReloader(
            () if config.filter_file is None else (config.filter_file,),
            lambda: _compose(config),
            self._swap,
            what="content filter",
            kept="the rules in force stay",
            errors=(ConfigError,),
        )
        """The rules file, watched (``runtime.file_watch``); ``reload`` also re-reads the
        inline rules."""
        self.filter = _compose(config)
        self.withheld: dict[str, int] = dict.fromkeys(LABELS.values(), 0)
        """Records withheld, by verdict label (``deny_rule``, ``deny_default``, ``error``)."""
        self._ratelog = RateLimitedLog(log)
        log.info("content filter: %s", self.filter.describe())

    @property
    def withheld_total(self) -> int:
        """Records withheld so far, every verdict."""
        return sum(self.withheld.values())

    def decide(  # noqa: PLR0917  per-record hot path, positional like Encoder.add
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
    ) -> int:
        """``SEND``, ``WITHHOLD`` (a rule or the default denied it) or ``SKIP`` (a rule failed or
        ran over its time: not sent, and not reported as withheld either, so the far side sees
        a gap that a resend with a fixed rule closes). Counted, and logged on error."""
        verdict = self.filter.verdict(key, value, headers)
        if verdict is Verdict.SEND:
            return SEND
        self.withheld[LABELS[verdict]] += 1
        if verdict is not Verdict.ERROR:
            return WITHHOLD
        self._ratelog.warning(
            "filter_error",
            "content filter: a rule failed or ran over %g ms on %s:%d@%d: not sent"
            " (it will be reported as a gap downstream)",
            self._config.filter_timeout_ms,
            topic,
            partition,
            offset,
        )
        return SKIP

    @property
    def reloads(self) -> int:
        """Reloads that took effect."""
        return self.file.reloads

    @property
    def reload_errors(self) -> int:
        """Reloads that failed (the rules in force stayed)."""
        return self.file.reload_errors

    def changed(self) -> bool:
        """The rules file's modification time differs from the one last loaded."""
        return self.file.changed()

    def reload(self, why: str) -> bool:
        """Re-read the rules; the filter in force stays on any error. True when swapped."""
        return self.file.reload(why)

    def _swap(self, built: ContentFilter) -> str:
        self.filter = built
        return f": {built.describe()}"
