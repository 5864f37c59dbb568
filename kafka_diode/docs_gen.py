"""Generate ``docs/configuration.md`` from the configuration dataclasses and the argument parsers.

The field docstrings in the code are the single source of truth; ``tests/unit/test_docs.py`` fails
when the committed file differs from what this produces, so the reference cannot drift.
Regenerate with ``python -m kafka_diode.docs_gen > docs/configuration.md`` (or ``make docs``).
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

from common.settings import reference_table
from kafka_diode import cli_reference


class Section(NamedTuple):
    """One table of keys in docs/configuration.md."""

    title: str
    module: str
    class_name: str
    env_prefix: str | None
    """Prefix of the keys' environment variables ("" for the dedup's unprefixed names); None:
    the keys have no environment variable."""
    commands: tuple[str, ...]
    """The commands (``cli_reference`` titles) that take the keys as flags; empty: no flags."""
    intro: str


SECTIONS: tuple[Section, ...] = (
    Section(
        "kafka-diode send",
        "sender.config",
        "SenderConfig",
        "DIODE_SENDER_",
        ("kafka-diode send",),
        "The high-side sender (and `kafka-diode resend`, which takes the same wire and pacing"
        " keys). TOML file via `--config`, then environment, then flags.",
    ),
    Section(
        "kafka-diode receive",
        "receiver.config",
        "ReceiverConfig",
        "DIODE_RECEIVER_",
        ("kafka-diode receive",),
        "The low-side receiver. TOML file via `--config`, then environment, then flags.",
    ),
    Section(
        "kafka-diode dedup",
        "dedup.config",
        "DedupConfig",
        "",
        ("kafka-diode dedup",),
        "The Spark dedup job. Configured by environment variables named as operators know them"
        " (the key upper-cased, no prefix), or the flags. A variable that looks like a typo of"
        ' one of these names stops the job (below, "Lists, tables and typos").',
    ),
    Section(
        "kafka-diode bundle create",
        "dedup.bundle_create",
        "BundleConfig",
        "DIODE_BUNDLE_",
        ("kafka-diode bundle create",),
        "The low-side bundle writer. TOML file via `--config` (top level or `[bundle]`), then the"
        " dedup's variables (`BOOTSTRAP_SERVERS`, `GAP_TOPIC`, `KAFKA_CONF_*`), then"
        " `DIODE_BUNDLE_*`, then flags. See docs/resend.md.",
    ),
    Section(
        "Wire protocol limits (common)",
        "common.wire.config",
        "WireConfig",
        None,
        (),
        "The protocol core's limits and defaults, for reference: they have no variables or flags"
        " of their own. The sender and receiver keys of the same names (tables above) set the"
        " ones that matter to each side.",
    ),
    Section(
        "netem profiles",
        "netem.profile",
        "Profile",
        None,
        ("kafka-diode netem relay", "kafka-diode netem apply"),
        "Impairment profile keys: a TOML profile file's keys (top level or `[profile]`), netem"
        " words in `--profile`, or the flags of `netem relay` and `netem apply`, which replace"
        " the `--profile`'s value (`--loss 5%`, `--delay 10ms`; bare numbers are percent,"
        " milliseconds and bits/s). See docs/netem.md.",
    ),
)

HEADER = """# Configuration reference

Generated from the code by `python -m kafka_diode.docs_gen`; a test fails when this file and the
code disagree. Precedence everywhere: defaults < configuration file < environment < flags.
Property tables (`kafka`, `spark_conf`, …) take environment variables of the form
`<PREFIX><KEY>__<PROPERTY>` with `_` read as `.` (e.g. `DIODE_SENDER_KAFKA__SECURITY_PROTOCOL`), or
repeated `--key PROP=VALUE` flags. Secrets (passwords) are never printed: `--check-config` shows
them as `***`.
"""


LISTS_AND_TYPOS = """## Lists, tables and typos

- **A list option keeps every value it is given.** Each occurrence of a list flag adds to the list
  and may itself be comma-separated: `--topics a --topics b,c` reads `a`, `b` and `c`;
  `--rename a=x --rename c=y` keeps both renames. This holds for every list option of every
  command (the option tables below say "repeatable"); `--topics ""` gives the empty list.
  Any other option is one value, and a repeat replaces it (`--bootstrap-servers` is one
  librdkafka string: give every broker in one comma-separated value).
  A list from a later layer replaces the earlier layer's list: flags given on the command line
  replace the environment's list, which replaces the file's (a TOML array keeps commas inside
  its items; on the command line and in the environment a comma always separates items).
- **A property table merges key by key** across layers and repeats: `--kafka a=1 --kafka b=2` sets
  both, and a flag's `a` replaces the environment's `a` but keeps its `b`.
- **Abbreviations are refused**: every flag must be written in full (`--rate-byte` is an error,
  not `--rate-bytes`).
- **Unknown names are refused** with the name they probably meant: keys of a configuration file,
  and variables with a component's prefix (`DIODE_SENDER_`, `DIODE_RECEIVER_`, `DIODE_BUNDLE_`,
  `DIODE_NETEM_`). The dedup's variables have no prefix, so the dedup (and `dedup reset`, `gaps`,
  `raw` and `status`, which read its environment file) refuse a variable that is not one of its
  names but is within two edits (a letter inserted, deleted, changed, or two swapped; case
  ignored) of one (`WINDOW_SIZ`, `window_size`, `RAW_TOPIC`), or whose leading words are within two
  edits of `SPARK_CONF_`, `KAFKA_CONF_` or `KAFKA_SOURCE_` (`KAFKA_CNF_SECURITY_PROTOCOL`);
  other variables (`PATH`, `JAVA_HOME`, `SPARK_HOME`) are not the dedup's and are left alone.
  `SPARK_CONF_DIR` is Spark's own variable, not a setting; any other `SPARK_CONF_<NAME>` must name
  a `spark.*` setting.
- **`--check-config` opens every file the configuration names** (key files, filter rules, the
  bundle of `resend --bundle`, and the files of librdkafka and Java client properties:
  `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`, `ssl.crl.location`,
  `ssl.keystore.location`, `sasl.kerberos.keytab`, `ssl.truststore.location`, …) and stops with
  the key, the path and the fix when one is missing or unreadable; start-up does the same.
"""


COMMANDS_INTRO = """## Command-line options of every command

Taken from each command's own argument parser (`kafka_diode/cli_reference.py`), so every flag of
every command and subcommand is here; `kafka-diode <command> --help` prints the same. Flags that
set a key of the tables above say so (`[env …; default: …]`).
"""


def render() -> str:
    """The whole Markdown document."""
    parts = [HEADER]
    for section in SECTIONS:
        cls = getattr(importlib.import_module(section.module), section.class_name)
        table = reference_table(cls, section.env_prefix, flags=bool(section.commands))
        parts.append(f"## {section.title}\n\n{section.intro}\n\n{table}\n")
    parts.append(LISTS_AND_TYPOS)
    parts.append(COMMANDS_INTRO)
    parts.append(cli_reference.render())
    return "\n".join(parts)


def main() -> int:
    """Print the reference to stdout."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
