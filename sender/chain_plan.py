"""Chains as a whole (pure): do the senders of one source carry every offset exactly once?

A chain is one sender -> receiver path (docs/sender.md, "Chains"). Each sender only knows its own
``chain = I/N``; whether the N senders together cover every offset exactly once (``share``) or
exactly N times (``copy``) depends on all of them. ``kafka-diode send --config mine.toml
--check-chains other.toml ...`` runs :func:`plan_problems` over the whole set before any of them
is started, so a typo never becomes a silent hole: two senders both configured as ``1/2`` would
leave every odd offset uncarried.
"""

from __future__ import annotations

from collections.abc import Sequence

from sender.config import SenderConfig


def plan_problems(members: Sequence[tuple[str, SenderConfig]]) -> list[str]:
    """Every reason the named configurations do not form one valid set of chains ([] if they do).

    Rules: each names a chain; all agree on N and the mode; the indices are exactly 1..N, once
    each; all read the same topics under the same names (``topics``, ``exclude_topics``,
    ``rename``), from the same brokers, each in its own consumer group (a shared group would
    split the partitions between the chains, so neither would carry all of them).
    """
    problems: list[str] = []
    positions: dict[str, tuple[int, int]] = {}
    for name, config in members:
        position = config.chain_position()
        if position is None:
            problems.append(f"{name}: chain is not set (give each sender I/N)")
        else:
            positions[name] = position
    if not positions:
        return problems
    counts = {n for _, n in positions.values()}
    if len(counts) > 1:
        said = ", ".join(f"{name}: {p[0]}/{p[1]}" for name, p in sorted(positions.items()))
        problems.append(f"chain: the senders disagree on N ({said})")
    modes = {c.chain_mode for _, c in members}
    if len(modes) > 1:
        problems.append(f"chain_mode: the senders disagree ({', '.join(sorted(modes))})")
    n = max(counts)
    if len(counts) == 1:
        taken: dict[int, list[str]] = {}
        for name, (index, _) in positions.items():
            taken.setdefault(index, []).append(name)
        for index in range(1, n + 1):
            holders = taken.get(index, [])
            if not holders:
                problems.append(f"chain: no sender is chain {index}/{n}")
            elif len(holders) > 1:
                problems.append(f"chain: {' and '.join(holders)} are all chain {index}/{n}")
    for key in ("bootstrap_servers", "topics", "exclude_topics", "rename"):
        values = {repr(getattr(c, key)) for _, c in members}
        if len(values) > 1:
            problems.append(f"{key}: the senders differ (every chain must read the same source)")
    groups: dict[str, list[str]] = {}
    for name, config in members:
        groups.setdefault(config.group_id, []).append(name)
    for group, names in groups.items():
        if len(names) > 1:
            problems.append(
                f"group_id: {' and '.join(names)} share {group!r} (give each chain its own)"
            )
    return problems


def summary(members: Sequence[tuple[str, SenderConfig]]) -> str:
    """One line for a valid set: how many chains and what each offset gets."""
    config = members[0][1]
    n = len(members)
    if config.chain_mode == "share":
        return f"{n} chains, share: every offset is carried by exactly one chain (offset % {n})"
    return f"{n} chains, copy: every offset is carried by all {n} chains"
