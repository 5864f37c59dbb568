"""Layered process settings: defaults, then a TOML file, then environment, then flags.

Every long-running command describes its settings as a frozen, keyword-only dataclass whose fields
carry a docstring (the attribute docstring right below the field). This module turns that one
description into:

- argparse options (``add_flags``), with the field docstring as help text; a list or table option
  (``ListAction``) accumulates when repeated: ``--topics a --topics b,c`` is ``[a, b, c]``;
- a merged configuration (``build``) where a later layer overrides an earlier one
  (defaults < file < environment < flags: a list given by a later layer replaces the earlier
  list, a property table is merged key by key), unknown keys are refused with a "did you mean"
  hint, and strings from the environment are converted to the field's type;
- for commands that read unprefixed environment names (the dedup's ``WINDOW_SIZE``),
  ``check_env_names``: a variable within two edits of a known name is refused as a typo;
- a printable, secret-masked view (``describe``) for ``--check-config`` and start-up logs;
- the reference tables in ``docs/configuration.md`` (``field_docs``), so docs cannot drift.

Dictionary-typed fields (librdkafka or Spark pass-through properties) take environment variables
of the form ``<PREFIX><FIELD>__<PROPERTY>``, with ``_`` in the property read as ``.``:
``DIODE_SENDER_KAFKA__SECURITY_PROTOCOL=SASL_SSL`` sets ``kafka["security.protocol"]``.

Pure: ``runtime.config_file`` reads the configuration file a command names, and the caller
passes ``os.environ``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import itertools
import textwrap
import tomllib
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from common.errors import ConfigError

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_SECRET_WORDS = ("password", "secret", "passphrase", "token", "sasl.oauthbearer", "private", "jaas")
MASK = "***"


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Return ``{field name: docstring}`` read from the attribute docstrings in ``cls``'s source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        statements = body.body
        for first, second in itertools.pairwise(statements):
            if (
                isinstance(first, ast.AnnAssign)
                and isinstance(first.target, ast.Name)
                and isinstance(second, ast.Expr)
                and isinstance(second.value, ast.Constant)
                and isinstance(second.value.value, str)
            ):
                docs[first.target.id] = " ".join(second.value.value.split())
    return docs


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _convert(key: str, raw: Any, tp: Any) -> Any:
    """Convert ``raw`` (a string from env/flags or a TOML value) to type ``tp``."""
    inner, optional = _unwrap_optional(tp)
    if raw is None:
        if optional:
            return None
        raise ConfigError(key, "must not be empty")
    if optional and isinstance(raw, str) and raw == "":
        return None
    origin = typing.get_origin(inner)
    try:
        if inner is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(raw)
        if inner is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(str(raw).replace("_", "")) if isinstance(raw, str) else int(raw)
        if inner is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if inner is str:
            if not isinstance(raw, str | int | float):
                raise ValueError(raw)
            return str(raw)
        if inner is Path:
            return Path(str(raw)).expanduser()
        if origin is tuple:
            args = typing.get_args(inner)
            item_tp = args[0] if args else str
            items = (
                [s.strip() for s in raw.split(",") if s.strip()] if isinstance(raw, str) else raw
            )
            if not isinstance(items, list | tuple):
                raise ValueError(raw)
            return tuple(_convert(key, item, item_tp) for item in items)
        if origin is dict:
            if not isinstance(raw, Mapping):
                raise ValueError(raw)
            return {
                str(k): str(v) if not isinstance(v, bool) else str(v).lower()
                for k, v in raw.items()
            }
        if origin is typing.Literal:
            allowed = typing.get_args(inner)
            if raw not in allowed:
                raise ConfigError(key, f"is {raw!r}", f"use one of: {', '.join(map(str, allowed))}")
            return raw
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(key, f"{raw!r} is not a valid {_type_name(tp)}") from exc
    return raw


def _type_name(tp: Any) -> str:
    inner, optional = _unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if origin is tuple:
        name = "comma-separated list"
    elif origin is dict:
        name = "table of properties"
    elif origin is typing.Literal:
        name = " | ".join(map(str, typing.get_args(inner)))
    else:
        name = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}.get(
            inner, getattr(inner, "__name__", str(inner))
        )
    return f"{name} (optional)" if optional else name


def toml_section(text: str, path: Path | str, section: str) -> dict[str, Any]:
    """The ``[section]`` table of TOML ``text`` (read from ``path``), or its top level when there
    is no such table (``runtime.config_file.read_toml_section`` reads the file).

    Raises:
        ConfigError: naming ``--config`` when the text is not TOML or the section is not a table.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    table = doc.get(section, doc)
    if not isinstance(table, dict):
        raise ConfigError("--config", f"[{section}] in {path} must be a table")
    return table


def env_name(prefix: str, field_name: str) -> str:
    """The environment variable that sets ``field_name``."""
    return prefix + field_name.upper()


def flag_name(field_name: str) -> str:
    """The command-line flag that sets ``field_name``."""
    return "--" + field_name.replace("_", "-")


def _unknown(key: str, known: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
    return ConfigError(key, f"unknown {where}", fix)


#: Most edits (insert, delete, change, swap of neighbours) between a variable and one of a
#: command's unprefixed names for the variable to count as a typo of it (``check_env_names``).
TYPO_DISTANCE = 2


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, change, swap of two neighbours) that turn ``a`` into ``b``
    (the optimal string alignment distance)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def check_env_names(
    env: Mapping[str, str],
    known: Collection[str],
    *,
    table_prefixes: Collection[str] = (),
    ignore: Collection[str] = (),
) -> None:
    """Refuse environment variables that look like typos of a command's unprefixed names.

    A command that reads names without a prefix of its own (the dedup's ``WINDOW_SIZE``) shares
    the environment with everything else (``PATH``, ``JAVA_HOME``, ``SPARK_HOME``), so it cannot
    refuse every name it does not know. A variable counts as ours, and is refused, when it is
    not a known name, not in ``ignore``, does not start with a table prefix, and either

    - its name, upper-cased, is within ``TYPO_DISTANCE`` edits of a known name
      (``WINDOW_SIZ``, ``window_size``, ``RAW_TOPIC``), or
    - its leading words (up to an ``_``, with more after it) are within ``TYPO_DISTANCE`` edits
      of a table prefix (``KAFKA_CNF_SECURITY_PROTOCOL`` for ``KAFKA_CONF_``).

    Raises:
        ConfigError: naming the variable, with "did you mean" the closest name.
    """
    names = sorted(known)
    prefixes = sorted(table_prefixes)
    for var in sorted(env):
        if var in known or var in ignore or any(var.startswith(p) for p in prefixes):
            continue
        upper = var.upper()
        near = [n for n in names if edit_distance(upper, n) <= TYPO_DISTANCE]
        if near:
            best = min(near, key=lambda n: (edit_distance(upper, n), n))
            raise ConfigError(var, "unknown environment variable", f"did you mean {best!r}?")
        for prefix in prefixes:
            head = prefix.rstrip("_")
            for cut in (i for i, c in enumerate(upper) if c == "_" and i < len(upper) - 1):
                if edit_distance(upper[:cut], head) <= TYPO_DISTANCE:
                    meant = prefix + var[cut + 1 :]
                    raise ConfigError(
                        var, "unknown environment variable", f"did you mean {meant!r}?"
                    )


class ListAction(argparse.Action):
    """A list option: every occurrence adds to the list, none is dropped.

    ``--topics a --topics b,c`` gives ``["a", "b", "c"]`` (with ``split``, the default, each value
    is also split at commas; ``--topics ""`` gives the empty list). Works with ``nargs="+"`` too
    (``--merge A B --merge C`` gives ``[A, B, C]``). Until the option is given its value stays
    the default (``None``: no override of the configuration file or environment). ``item_type``
    converts each item (argparse's ``type`` would see the unsplit text).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        split: bool = True,
        item_type: Callable[[str], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("nargs") in (0, "?"):
            raise ValueError(f"{dest}: a list option takes one or more values per occurrence")
        if kwargs.get("type") is not None:
            raise ValueError(f"{dest}: give item_type, not type, to a list option")
        kwargs.setdefault("default", None)
        super().__init__(option_strings, dest, **kwargs)
        self.split = split
        self.item_type = item_type

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given = [values] if isinstance(values, str) or values is None else list(values)
        if not given and self.nargs != "*":
            # argparse (3.11) takes a value of exactly "--" (``--topics=--``) for the end of the
            # options and hands over nothing: refuse rather than drop an item silently
            raise argparse.ArgumentError(
                self,
                'a value of exactly "--" is read as the end of the options; give that item in '
                "the configuration file or the environment",
            )
        items: list[Any] = []
        for value in given:
            text = "" if value is None else str(value)
            parts = [p.strip() for p in text.split(",") if p.strip()] if self.split else [text]
            for part in parts:
                items.append(self._typed(part))
        current = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(current or ()), *items])  # a new list: never the default

    def _typed(self, part: str) -> Any:
        if self.item_type is None:
            return part
        try:
            return self.item_type(part)
        except (TypeError, ValueError) as exc:
            name = getattr(self.item_type, "__name__", "item")
            raise argparse.ArgumentError(self, f"invalid {name} value: {part!r}") from exc


def add_list_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *names: str,
    split: bool = True,
    item_type: Callable[[str], Any] | None = None,
    **kwargs: Any,
) -> argparse.Action:
    """Add a list option (``ListAction``); its help says it may be repeated."""
    help_text = kwargs.pop("help", None)
    if help_text is not None and help_text != argparse.SUPPRESS:
        how = "repeatable, comma-separated" if split else "repeatable"
        help_text = f"{help_text} ({how})"
    return parser.add_argument(
        *names, action=ListAction, split=split, item_type=item_type, help=help_text, **kwargs
    )


def add_flags(
    parser: argparse.ArgumentParser, cls: type[Any], *, skip: tuple[str, ...] = ()
) -> None:
    """Add one ``--flag`` per field of ``cls``; an unset flag stays ``None`` (no override)."""
    docs = field_docs(cls)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = hints[f.name]
        inner, _ = _unwrap_optional(tp)
        default = _default_text(f)
        help_text = f"{docs.get(f.name, '')} [{_type_name(tp)}; default: {default}]"
        if typing.get_origin(inner) is dict:
            add_list_argument(
                parser,
                flag_name(f.name),
                dest=f.name,
                split=False,  # a property's value may hold commas (bootstrap lists, JAAS)
                metavar="PROP=VALUE",
                help=help_text,
            )
        elif typing.get_origin(inner) is tuple:
            add_list_argument(
                parser, flag_name(f.name), dest=f.name, metavar="ITEM", help=help_text
            )
        else:
            parser.add_argument(flag_name(f.name), dest=f.name, default=None, help=help_text)


def _default_text(f: dataclasses.Field[Any]) -> str:
    if not f.repr:
        return "unset"
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        if f.default_factory not in (dict, list, tuple, set):
            return "computed at start-up"  # e.g. the host name: not the same on every machine
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "empty"
    if isinstance(value, dict):
        return "none" if not value else ", ".join(f"{k}={v}" for k, v in value.items())
    if value == "":
        return "empty"
    return "none" if value is None else str(value)


def build(
    cls: type[T],
    *,
    file_values: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "",
    flags: argparse.Namespace | Mapping[str, Any] | None = None,
    env_names: Mapping[str, str] | None = None,
    env_tables: Mapping[str, str] | None = None,
) -> T:
    """Merge defaults < file < environment < flags into an instance of ``cls``.

    The environment is read by ``env_prefix`` (``<PREFIX><KEY>``, ``<PREFIX><KEY>__<PROP>`` for a
    property table) and, for commands whose operators know other names (the dedup's
    ``WINDOW_SIZE``, ``KAFKA_CONF_*``), by ``env_names`` (variable -> key) and ``env_tables``
    (variable prefix -> property-table key; ``SECURITY_PROTOCOL`` reads as
    ``security.protocol``). With those, an error names the variable or flag that set the value.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or whatever ``cls`` refuses in
            its ``__post_init__``.
    """
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values: dict[str, Any] = {}

    for key, raw in (file_values or {}).items():
        if key not in hints:
            raise _unknown(key, names, "key in the configuration file")
        values[key] = _convert(key, raw, hints[key])

    if env is not None and env_prefix:
        for var, raw in env.items():
            if not var.startswith(env_prefix):
                continue
            field_part, _, prop = var[len(env_prefix) :].partition("__")
            name = field_part.lower()
            if name not in hints:
                raise _unknown(
                    var, [env_name(env_prefix, n) for n in names], "environment variable"
                )
            inner, _ = _unwrap_optional(hints[name])
            if typing.get_origin(inner) is dict:
                if not prop:
                    raise ConfigError(
                        var, "sets a property table", f"use {var}__PROPERTY_NAME=value"
                    )
                table = dict(values.get(name) or {})
                table[prop.lower().replace("_", ".")] = raw
                values[name] = table
            else:
                values[name] = _convert(var, raw, hints[name])

    origin: dict[str, str] = {}
    for var, name in (env_names or {}).items():
        if env is not None and var in env:
            values[name] = _convert(var, env[var], hints[name])
            origin[name] = var
    for prefix, name in (env_tables or {}).items():
        table = {
            _property_name(var[len(prefix) :]): raw
            for var, raw in (env or {}).items()
            if var.startswith(prefix) and len(var) > len(prefix)
        }
        if table:
            values[name] = {**(values.get(name) or {}), **table}
            origin[name] = prefix + "<NAME>"

    flag_map = vars(flags) if isinstance(flags, argparse.Namespace) else dict(flags or {})
    for name, raw in flag_map.items():
        if name not in hints or raw is None:
            continue
        origin[name] = flag_name(name)
        inner, _ = _unwrap_optional(hints[name])
        if typing.get_origin(inner) is dict and isinstance(raw, list):
            table = dict(values.get(name) or {})
            for item in raw:
                prop, sep, value = str(item).partition("=")
                if not sep:
                    raise ConfigError(flag_name(name), f"{item!r} is not PROP=VALUE")
                table[prop.strip()] = value
            values[name] = table
        else:
            values[name] = _convert(flag_name(name), raw, hints[name])

    try:
        return cls(**values)
    except ConfigError as exc:
        if (env_names or env_tables) and exc.key in origin and exc.key != origin[exc.key]:
            raise ConfigError(origin[exc.key], exc.problem, exc.fix) from exc
        raise
    except TypeError as exc:  # a required field without a value
        missing = [
            f.name
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            name = missing[0]
            named = [var for var, field_name in (env_names or {}).items() if field_name == name]
            if named:
                raise ConfigError(
                    named[0], "is required", f"set {named[0]} or {flag_name(name)}"
                ) from exc
            raise ConfigError(
                name,
                "is required",
                f"set it in the file, as {env_name(env_prefix, name)} or with {flag_name(name)}",
            ) from exc
        raise


def _property_name(raw: str) -> str:
    """``SECURITY_PROTOCOL`` -> ``security.protocol``; a mixed-case name keeps its case."""
    name = raw.replace("_", ".")
    return name.lower() if raw.isupper() else name


def describe(config: Any) -> dict[str, Any]:
    """A JSON-friendly view of ``config`` with every secret masked."""
    out: dict[str, Any] = {}
    cls = type(config)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not f.repr:
            out[f.name] = None if value is None else MASK
        elif isinstance(value, dict):
            out[f.name] = {
                k: (MASK if any(w in k.lower() for w in _SECRET_WORDS) else v)
                for k, v in value.items()
            }
        elif isinstance(value, Path):
            out[f.name] = str(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    del cls
    return out


_ESCAPED_BAR = "\\|"


def reference_table(cls: type[Any], env_prefix: str | None, *, flags: bool = True) -> str:
    """A Markdown table of every field: key, env var, flag, type, default and meaning.

    ``env_prefix`` None: the keys have no environment variable; ``flags`` False: no flag (the
    cells say "—", so the reference never lists a name that nothing reads).
    """
    docs = field_docs(cls)
    hints = _hints(cls)
    rows = ["| key | environment | flag | type | default | meaning |", "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        # a Literal's choices are joined with " | ": escaped, or they would split the row
        type_text = _type_name(hints[f.name]).replace("|", _ESCAPED_BAR)
        rows.append(
            f"| `{f.name}` "
            f"| {'—' if env_prefix is None else f'`{env_name(env_prefix, f.name)}`'} "
            f"| {f'`{flag_name(f.name)}`' if flags else '—'} "
            f"| {type_text} | `{_default_text(f)}` | {docs.get(f.name, '')} |"
        )
    return "\n".join(rows)
