"""Generate ``docs/configuration.md`` from the configuration dataclasses and the argument parsers.

The field docstrings in the code are the single source of truth; ``tests/unit/test_docs.py`` fails
when the committed file differs from what this produces, so the reference cannot drift.
Regenerate with ``python -m kafka_diode.docs_gen > docs/configuration.md`` (or ``make docs``).
"""

from __future__ import annotations

import importlib
import sys

from common.settings import reference_table
from kafka_diode import cli_reference

#: (section title, module, class, environment prefix, what it configures)
SECTIONS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "kafka-diode send",
        "sender.config",
        "SenderConfig",
        "DIODE_SENDER_",
        "The high-side sender (and `kafka-diode resend`, which takes the same wire and pacing"
        " keys). TOML file via `--config`, then environment, then flags.",
    ),
    (
        "kafka-diode receive",
        "receiver.config",
        "ReceiverConfig",
        "DIODE_RECEIVER_",
        "The low-side receiver. TOML file via `--config`, then environment, then flags.",
    ),
    (
        "kafka-diode dedup",
        "dedup.config",
        "DedupConfig",
        "",
        "The Spark dedup job. Configured by environment variables named as operators know them"
        " (the key upper-cased, no prefix), or the flags.",
    ),
    (
        "kafka-diode bundle create",
        "dedup.bundle_create",
        "BundleConfig",
        "DIODE_BUNDLE_",
        "The low-side bundle writer. TOML file via `--config` (top level or `[bundle]`), then the"
        " dedup's variables (`BOOTSTRAP_SERVERS`, `GAP_TOPIC`, `KAFKA_CONF_*`), then"
        " `DIODE_BUNDLE_*`, then flags. See docs/resend.md.",
    ),
    (
        "Wire protocol limits (common)",
        "common.wire.config",
        "WireConfig",
        "",
        "The protocol core's limits; the sender and receiver expose the ones that matter to"
        " them under the same names. Not set directly.",
    ),
    (
        "netem profiles",
        "netem.profile",
        "Profile",
        "",
        "Impairment profile keys (TOML `[profile]` table or netem words); see docs/netem.md.",
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


COMMANDS_INTRO = """## Command-line options of every command

Taken from each command's own argument parser (`kafka_diode/cli_reference.py`), so every flag of
every command and subcommand is here; `kafka-diode <command> --help` prints the same. Flags that
set a key of the tables above say so (`[env …; default: …]`).
"""


def render() -> str:
    """The whole Markdown document."""
    parts = [HEADER]
    for title, module_name, class_name, prefix, intro in SECTIONS:
        cls = getattr(importlib.import_module(module_name), class_name)
        parts.append(f"## {title}\n\n{intro}\n\n{reference_table(cls, prefix)}\n")
    parts.append(COMMANDS_INTRO)
    parts.append(cli_reference.render())
    return "\n".join(parts)


def main() -> int:
    """Print the reference to stdout."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
