"""Impairment profiles in netem's own words (``man tc-netem``), shared by every backend.

A :class:`Profile` says *what* a link does to datagrams: loss (independent, correlated or a
Gilbert-Elliott burst model), duplication, reordering with a gap, delay with jitter, corruption,
a rate limit and the bound on held packets. The same profile drives the userspace relay
(:mod:`netem.relay`, through the pure :mod:`netem.impair`) and the kernel's ``tc qdisc ... netem``
(:mod:`netem.tc`, through :meth:`Profile.to_tc_args`).

Three ways to write one, all ending in the same validated frozen dataclass:

- a named profile (:data:`NAMED_PROFILES`: ``clean``, ``lossy-5``, ``bursty``, ``hostile``, ...);
- a TOML file with the field names as keys, at top level or under ``[profile]``;
- a netem one-liner: ``"loss 5% duplicate 1% delay 10ms 2ms reorder 25% gap 5 corrupt 0.1%"``.

Units: percentages are percent (0-100), times are milliseconds, ``rate`` is bits per second
(TOML and the one-liner also take tc's unit strings such as ``"10mbit"``). Every problem raises
:class:`~common.errors.ConfigError` naming the key and the fix. Pure: no I/O except
:func:`load_toml`, which reads the one file it is given.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

#: netem's default queue limit in packets (``limit``), kept so both backends agree.
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000_000
MAX_DELAY_MS = 600_000.0  # ten minutes: anything longer is a typo, not a link
MAX_GAP = 1_000_000

_PERCENT_FIELDS = (
    "loss",
    "loss_correlation",
    "ge_p",
    "ge_r",
    "ge_1_h",
    "ge_1_k",
    "duplicate",
    "duplicate_correlation",
    "reorder",
    "reorder_correlation",
    "delay_correlation",
    "corrupt",
    "corrupt_correlation",
)
_TIME_FIELDS = ("delay", "jitter")
_RANDOM_LOSS = ("loss", "loss_correlation")
_GE_LOSS = ("ge_p", "ge_r", "ge_1_h", "ge_1_k")

# tc(8) "RATES": SI and IEC multiples of bit/s, and of bytes/s for the ...bps spellings.
_RATE_UNITS: dict[str, float] = {"bit": 1.0, "bps": 8.0}
for _prefix, _mult in (("k", 1e3), ("m", 1e6), ("g", 1e9), ("t", 1e12)):
    _RATE_UNITS[f"{_prefix}bit"] = _mult
    _RATE_UNITS[f"{_prefix}bps"] = _mult * 8
for _prefix, _mult in (("ki", 2.0**10), ("mi", 2.0**20), ("gi", 2.0**30), ("ti", 2.0**40)):
    _RATE_UNITS[f"{_prefix}bit"] = _mult
    _RATE_UNITS[f"{_prefix}bps"] = _mult * 8

# tc(8) "TIMES", converted to milliseconds.
_TIME_UNITS: dict[str, float] = {
    "s": 1000.0,
    "sec": 1000.0,
    "secs": 1000.0,
    "ms": 1.0,
    "msec": 1.0,
    "msecs": 1.0,
    "us": 0.001,
    "usec": 0.001,
    "usecs": 0.001,
}
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_RATE_RE = re.compile(rf"^({_NUMBER})\s*([a-zA-Z]*)$")
_TIME_RE = re.compile(rf"^({_NUMBER})\s*([a-zA-Z]+)$")
_PERCENT_RE = re.compile(rf"^({_NUMBER})\s*%$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """What the link does to each datagram, in netem's vocabulary (all off by default)."""

    loss: float = 0.0
    """Independent random loss, percent of datagrams (netem ``loss random P``)."""
    loss_correlation: float = 0.0
    """Correlation of successive loss decisions, percent (netem ``loss P C``); see docs/netem.md."""
    ge_p: float | None = None
    """Gilbert-Elliott model: good->bad transition probability, percent (``loss gemodel p``)."""
    ge_r: float | None = None
    """Gilbert-Elliott: bad->good transition probability, percent; default 100 - ge_p."""
    ge_1_h: float = 100.0
    """Gilbert-Elliott: loss probability in the bad state, percent (netem's ``1-h``)."""
    ge_1_k: float = 0.0
    """Gilbert-Elliott: loss probability in the good state, percent (netem's ``1-k``)."""
    duplicate: float = 0.0
    """Percent of datagrams sent twice (netem ``duplicate P``)."""
    duplicate_correlation: float = 0.0
    """Correlation of successive duplicate decisions, percent."""
    reorder: float = 0.0
    """Percent of eligible datagrams sent at once, ahead of delayed ones (needs ``delay``)."""
    reorder_correlation: float = 0.0
    """Correlation of successive reorder decisions, percent."""
    gap: int = 0
    """Reorder only after ``gap - 1`` datagrams were delayed normally (netem ``gap``; 0 means 1)."""
    delay: float = 0.0
    """Base one-way delay, milliseconds."""
    jitter: float = 0.0
    """Delay varies uniformly in ``delay +- jitter`` milliseconds (never below zero)."""
    delay_correlation: float = 0.0
    """Correlation of successive jitter draws, percent."""
    corrupt: float = 0.0
    """Percent of datagrams with one random bit flipped (netem ``corrupt P``)."""
    corrupt_correlation: float = 0.0
    """Correlation of successive corrupt decisions, percent."""
    rate: int = 0
    """Link rate in bits per second (0: unlimited); TOML and one-liners accept ``"10mbit"``."""
    limit: int = DEFAULT_LIMIT
    """Most datagrams held at once (netem ``limit``); arrivals beyond it are dropped and counted."""
    seed: int | None = None
    """Seed of the random decisions; None picks one at start and reports it (so a run repeats)."""

    def __post_init__(self) -> None:
        for name in _PERCENT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(name, f"must be a number of percent, got {value!r}")
            if not (math.isfinite(value) and 0.0 <= value <= 100.0):
                raise ConfigError(name, f"{value} is not a percentage", "use 0 to 100")
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(name, f"must be milliseconds, got {value!r}")
            if not (math.isfinite(value) and 0.0 <= value <= MAX_DELAY_MS):
                raise ConfigError(name, f"{value} ms is out of range", f"use 0 to {MAX_DELAY_MS}")
        _check_int("gap", self.gap, 0, MAX_GAP)
        _check_int("rate", self.rate, 0, 10**15)
        _check_int("limit", self.limit, 1, MAX_LIMIT)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**64 - 1)
        if self.ge_p is None:
            for name in ("ge_r", "ge_1_h", "ge_1_k"):
                default = 100.0 if name == "ge_1_h" else (None if name == "ge_r" else 0.0)
                if getattr(self, name) != default:
                    raise ConfigError(name, "is a Gilbert-Elliott parameter", "set ge_p as well")
        elif self.loss or self.loss_correlation:
            raise ConfigError(
                "loss", "random loss and the Gilbert-Elliott model are exclusive", "set one of them"
            )
        if self.reorder and not self.delay:
            # tc refuses the same: reordering means "not delayed", which needs a delay.
            raise ConfigError("reorder", "reordering needs a delay", "add delay, e.g. 'delay 10ms'")
        if (self.gap or self.reorder_correlation) and not self.reorder:
            raise ConfigError("gap", "only applies with reorder", "set reorder as well")

    @property
    def ge_r_effective(self) -> float:
        """``ge_r`` with netem's default (100 - p) applied; 0 when the GE model is off."""
        if self.ge_p is None:
            return 0.0
        return 100.0 - self.ge_p if self.ge_r is None else self.ge_r

    @property
    def effective_gap(self) -> int:
        """The gap netem uses: tc turns ``reorder`` without ``gap`` into gap 1."""
        return max(1, self.gap) if self.reorder else 0

    @property
    def mean_loss(self) -> float:
        """Long-run fraction (0-1) of datagrams the loss model drops."""
        if self.ge_p is None:
            return self.loss / 100.0
        p, r = self.ge_p / 100.0, self.ge_r_effective / 100.0
        if p + r == 0.0:
            return self.ge_1_k / 100.0
        bad = p / (p + r)
        return bad * self.ge_1_h / 100.0 + (1.0 - bad) * self.ge_1_k / 100.0

    @property
    def is_clean(self) -> bool:
        """True when the profile changes nothing (no loss, delay, ...; ``limit``/``seed`` aside)."""
        ignore = {"limit", "seed"}
        return all(
            getattr(self, f.name) == f.default
            for f in dataclasses.fields(self)
            if f.name not in ignore
        )

    def with_seed(self, seed: int | None) -> Profile:
        """The same profile with another seed."""
        return dataclasses.replace(self, seed=seed)

    def to_tc_args(self, *, include_seed: bool = False) -> list[str]:
        """Render for ``tc qdisc replace dev DEV root netem <args>``.

        ``seed`` is left out unless asked for: iproute2 before 6.3 and kernels before 6.3 lack it.
        """
        args: list[str] = ["limit", str(self.limit)]
        if self.delay or self.jitter:
            args += ["delay", _fmt_ms(self.delay)]
            if self.jitter or self.delay_correlation:
                args.append(_fmt_ms(self.jitter))
                if self.delay_correlation:
                    args.append(_fmt_pct(self.delay_correlation))
        if self.ge_p is not None:
            args += ["loss", "gemodel", _fmt_pct(self.ge_p), _fmt_pct(self.ge_r_effective)]
            args += [_fmt_pct(self.ge_1_h), _fmt_pct(self.ge_1_k)]
        elif self.loss:
            args += ["loss", "random", _fmt_pct(self.loss)]
            if self.loss_correlation:
                args.append(_fmt_pct(self.loss_correlation))
        for word in ("duplicate", "reorder", "corrupt"):
            value = getattr(self, word)
            if value:
                args += [word, _fmt_pct(value)]
                corr = getattr(self, f"{word}_correlation")
                if corr:
                    args.append(_fmt_pct(corr))
                if word == "reorder" and self.gap:
                    args += ["gap", str(self.gap)]
        if self.rate:
            args += ["rate", f"{self.rate}bit"]
        if include_seed and self.seed is not None:
            args += ["seed", str(self.seed)]
        return args

    def to_netem_words(self) -> str:
        """The one-liner form (:func:`parse_netem`), including the seed when set."""
        return " ".join(self.to_tc_args(include_seed=True))

    def to_dict(self) -> dict[str, Any]:
        """Field values that differ from the defaults (for summaries and TOML)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }


def _check_int(key: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(key, f"{value} is out of range", f"use {low} to {high}")


def _fmt_pct(value: float) -> str:
    return f"{value:g}%"


def _fmt_ms(value: float) -> str:
    return f"{value * 1000:g}us" if value and value < 1 else f"{value:g}ms"


# --- parsing -------------------------------------------------------------------------------------


def parse_rate(key: str, text: str | int | float) -> int:
    """Parse a tc rate (``"10mbit"``, ``"1.5gbit"``, ``"125kbps"`` = bytes/s) into bits/s."""
    if isinstance(text, bool):
        raise ConfigError(key, f"must be a rate, got {text!r}")
    if isinstance(text, int | float):
        value, unit = float(text), "bit"
    else:
        match = _RATE_RE.match(text.strip())
        if not match:
            raise ConfigError(key, f"cannot read rate {text!r}", "write e.g. 10mbit or 500kbit")
        value, unit = float(match.group(1)), (match.group(2).lower() or "bit")
    if unit not in _RATE_UNITS:
        raise ConfigError(key, f"unknown rate unit {unit!r}", f"use one of {sorted(_RATE_UNITS)}")
    bits = value * _RATE_UNITS[unit]
    if not math.isfinite(bits) or bits < 0 or bits > 10**15:
        raise ConfigError(key, f"rate {text!r} is out of range")
    return round(bits)


def parse_time_ms(key: str, text: str | int | float) -> float:
    """Parse a tc time (``"10ms"``, ``"1.5s"``, ``"500us"``) into ms; bare numbers are ms."""
    if isinstance(text, bool):
        raise ConfigError(key, f"must be a time, got {text!r}")
    if isinstance(text, int | float):
        return float(text)
    match = _TIME_RE.match(text.strip())
    if not match:
        raise ConfigError(key, f"cannot read time {text!r}", "write it with a unit, e.g. 10ms")
    unit = match.group(2).lower()
    if unit not in _TIME_UNITS:
        raise ConfigError(key, f"unknown time unit {unit!r}", "use s, ms or us")
    return float(match.group(1)) * _TIME_UNITS[unit]


def parse_percent(key: str, text: str | int | float) -> float:
    """Parse ``"5%"`` (one-liner) or a bare number of percent (TOML) into percent."""
    if isinstance(text, bool):
        raise ConfigError(key, f"must be a percentage, got {text!r}")
    if isinstance(text, int | float):
        return float(text)
    match = _PERCENT_RE.match(text.strip())
    if not match:
        raise ConfigError(key, f"cannot read percentage {text!r}", "write e.g. 5%")
    return float(match.group(1))


def _is_percent(token: str | None) -> bool:
    return token is not None and bool(_PERCENT_RE.match(token))


def _is_time(token: str | None) -> bool:
    if token is None:
        return False
    match = _TIME_RE.match(token)
    return bool(match) and match is not None and match.group(2).lower() in _TIME_UNITS


def parse_netem(words: str) -> Profile:
    """Parse a netem one-liner such as ``"loss 5% 25% delay 10ms 2ms reorder 25% gap 5"``.

    Understood: ``loss|drop [random] P [C]``, ``loss gemodel p [r [1-h [1-k]]]``,
    ``duplicate P [C]``, ``reorder P [C]``, ``gap N``, ``delay|latency T [J [C]]``,
    ``corrupt P [C]``, ``rate R``, ``limit N``, ``seed N``. Percentages need ``%``, times a unit.

    Raises:
        ConfigError: with the offending word as key.
    """
    tokens = words.split()
    values: dict[str, Any] = {}
    i = 0

    def take(key: str) -> str:
        nonlocal i
        if i >= len(tokens):
            raise ConfigError(key, "is missing its value", f"see 'man tc-netem' for {key}")
        token = tokens[i]
        i += 1
        return token

    def peek() -> str | None:
        return tokens[i] if i < len(tokens) else None

    while i < len(tokens):
        word = take("profile").lower()
        if word in ("loss", "drop"):
            model = (peek() or "").lower()
            if model == "gemodel":
                i += 1
                values["ge_p"] = parse_percent("ge_p", take("loss gemodel"))
                for name in ("ge_r", "ge_1_h", "ge_1_k"):
                    if _is_percent(peek()):
                        values[name] = parse_percent(name, take(name))
            elif model == "state":
                raise ConfigError("loss state", "the 4-state model is not supported", "use gemodel")
            else:
                if model == "random":
                    i += 1
                values["loss"] = parse_percent("loss", take("loss"))
                if _is_percent(peek()):
                    values["loss_correlation"] = parse_percent("loss_correlation", take("loss"))
        elif word in ("duplicate", "reorder", "corrupt"):
            values[word] = parse_percent(word, take(word))
            if _is_percent(peek()):
                values[f"{word}_correlation"] = parse_percent(word, take(word))
        elif word in ("delay", "latency"):
            values["delay"] = parse_time_ms("delay", take("delay"))
            if _is_time(peek()):
                values["jitter"] = parse_time_ms("jitter", take("jitter"))
                if _is_percent(peek()):
                    values["delay_correlation"] = parse_percent("delay_correlation", take("delay"))
        elif word in ("gap", "limit", "seed"):
            raw = take(word)
            if not raw.isdigit():
                raise ConfigError(word, f"must be a whole number, got {raw!r}")
            values[word] = int(raw)
        elif word == "rate":
            values["rate"] = parse_rate("rate", take("rate"))
        elif word in ("distribution", "slot", "ecn", "packetoverhead"):
            raise ConfigError(word, "is not supported by kafka-diode netem", "leave it out")
        else:
            raise ConfigError(word, "is not a netem word", _did_you_mean(word, _WORDS))
    return _build("profile", values)


_WORDS = ["loss", "drop", "duplicate", "reorder", "gap", "delay", "latency", "corrupt", "rate"]
_WORDS += ["limit", "seed"]


def _did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"


def _build(where: str, values: Mapping[str, Any]) -> Profile:
    try:
        return Profile(**values)
    except TypeError as exc:  # an unknown key slipped past; report it as configuration
        raise ConfigError(where, str(exc)) from exc


def from_mapping(values: Mapping[str, Any], *, where: str = "profile") -> Profile:
    """Build a profile from TOML-like keys (field names); strings with units are accepted.

    Raises:
        ConfigError: for unknown keys and bad values, naming the key.
    """
    known = [f.name for f in dataclasses.fields(Profile)]
    out: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in known:
            raise ConfigError(f"{where}.{key}", "is not a profile key", _did_you_mean(key, known))
        if key in _PERCENT_FIELDS and raw is not None:
            out[key] = parse_percent(key, raw)
        elif key in _TIME_FIELDS:
            out[key] = parse_time_ms(key, raw)
        elif key == "rate":
            out[key] = parse_rate(key, raw)
        else:
            out[key] = raw
    return _build(where, out)


def _number_or_text(value: str | float) -> str | float:
    if not isinstance(value, str):
        return value
    text = value.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def override(profile: Profile, values: Mapping[str, str | float]) -> Profile:
    """``profile`` with the keys in ``values`` replaced (the relay's and apply's ``--loss`` ...).

    A value is netem's word (``5%``, ``10ms``, ``10mbit``) or a bare number in the key's unit
    (percent, milliseconds, bits per second). Keys of one loss model (``loss``/``ge_*``) replace
    the profile's other model, as a netem command line holds one ``loss``.

    Raises:
        ConfigError: naming the key, for a bad value or a combination netem refuses (random loss
            and the Gilbert-Elliott model together, reorder without delay, ...).
    """
    if not values:
        return profile
    base = profile.to_dict()
    for model, other in ((_RANDOM_LOSS, _GE_LOSS), (_GE_LOSS, _RANDOM_LOSS)):
        if any(k in values for k in model) and not any(k in values for k in other):
            base = {k: v for k, v in base.items() if k not in other}
    merged = {**base, **{k: _number_or_text(v) for k, v in values.items()}}
    return from_mapping(merged)


def load_toml(path: Path) -> Profile:
    """Load a profile from a TOML file: keys at top level or in a ``[profile]`` table.

    A ``netem = "loss 5% ..."`` key is read as a one-liner instead of separate keys.

    Raises:
        ConfigError: when the file is unreadable, not TOML, or holds bad values.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read profile: {exc}") from exc
    table = data.get("profile", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: profile", "must be a table")
    if "netem" in table:
        rest = {k: v for k, v in table.items() if k != "netem"}
        if rest:
            raise ConfigError(f"{path}: netem", f"cannot be mixed with {sorted(rest)}")
        words = table["netem"]
        if not isinstance(words, str):
            raise ConfigError(f"{path}: netem", "must be a string of netem words")
        return parse_netem(words)
    return from_mapping(table, where=str(path))


#: The named profiles (docs/netem.md has the table). Seeds are left to the caller.
NAMED_PROFILES: dict[str, Profile] = {
    "clean": Profile(),
    "lossy-1": Profile(loss=1.0),
    "lossy-5": Profile(loss=5.0),
    "lossy-20": Profile(loss=20.0),
    # Mean loss p / (p + r) = 4.8 %, in bursts of 1 / r = 5 datagrams on average.
    "bursty": Profile(ge_p=1.0, ge_r=20.0),
    "duplicate-10": Profile(duplicate=10.0),
    # Jitter alone reorders (uniform 0-10 ms); reorder 25 % gap 3 sends some at once on top.
    "reorder-heavy": Profile(delay=5.0, jitter=5.0, reorder=25.0, gap=3),
    "corrupt-1": Profile(corrupt=1.0),
    "hostile": Profile(
        loss=5.0,
        loss_correlation=25.0,
        duplicate=5.0,
        reorder=10.0,
        gap=5,
        delay=5.0,
        jitter=2.0,
        corrupt=1.0,
    ),
    "demo": Profile(loss=2.0, reorder=5.0, gap=5, delay=2.0, jitter=1.0),
}


def resolve(spec: str, *, seed: int | None = None) -> Profile:
    """Turn ``--profile`` into a profile: a name, a TOML file path, or netem words.

    ``seed``, when given, overrides the profile's own seed.

    Raises:
        ConfigError: naming ``profile`` when the text is none of the three.
    """
    text = spec.strip()
    if not text:
        raise ConfigError("profile", "is empty", f"use one of {', '.join(NAMED_PROFILES)}")
    if text in NAMED_PROFILES:
        profile = NAMED_PROFILES[text]
    elif text.endswith(".toml") or Path(text).is_file():
        profile = load_toml(Path(text))
    else:
        first = text.split()[0].lower()
        if first not in _WORDS and len(text.split()) == 1:
            raise ConfigError(
                "profile",
                f"{text!r} is not a named profile, a file or netem words",
                _did_you_mean(text, list(NAMED_PROFILES)),
            )
        profile = parse_netem(text)
    return profile if seed is None else profile.with_seed(seed)
