"""Documentation must match the code: what is generated from it, and what the docs state (links,
section references, paths, defaults, page lengths, the README's two set-up commands)."""

import dataclasses
import importlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from common import settings
from common.settings import field_docs
from dedup.config import DedupConfig, env_var, from_sources
from kafka_diode import cli_reference, docs_gen
from kafka_diode.cli import SUBCOMMANDS
from receiver.config import ENV_PREFIX as RECEIVER_PREFIX
from receiver.config import ReceiverConfig
from sender.config import ENV_PREFIX as SENDER_PREFIX
from sender.config import SenderConfig

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_matches_the_code() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == docs_gen.render(), (
        "docs/configuration.md is stale: run `make docs` (python -m kafka_diode.docs_gen)"
    )


def test_every_config_field_is_documented() -> None:
    for section in docs_gen.SECTIONS:
        cls = getattr(importlib.import_module(section.module), section.class_name)
        docs = field_docs(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not undocumented, f"{section.class_name} fields without a docstring: {undocumented}"


def test_every_option_of_every_command_is_in_the_reference() -> None:
    """Against each command's argparse parser: every flag and positional has a row."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = cli_reference.command_parsers()
    titles = [title for title, _ in found]
    assert {f"kafka-diode {c}" for c in SUBCOMMANDS} <= set(titles)
    for must in ("gaps", "resend", "netem relay", "keygen", "local-kafka start", "dedup reset"):
        assert f"kafka-diode {must}" in titles
    missing = []
    for title, parser in found:
        section = committed.partition(f"\n### {title}\n")[2].partition("\n### ")[0]
        assert section, f"no section for {title}"
        for action in cli_reference.documented_actions(parser):
            for option in action.option_strings or [action.dest]:
                name = option if action.option_strings else cli_reference._argument(action)
                if f"`{name}`" not in section:
                    missing.append(f"{title} {name}")
    assert not missing, f"options missing from docs/configuration.md: {missing}"


def test_capture_runs_nothing_of_the_command(tmp_path: Path) -> None:
    """Finding keygen's parser writes no key file: the command stopped at parsing."""
    key = tmp_path / "link.key"
    parser = cli_reference.capture_parser("keygen", ["--out", str(key)])
    assert parser.prog == "kafka-diode keygen"
    assert not key.exists()


def test_every_table_row_of_the_reference_has_its_header_s_columns() -> None:
    """A ``|`` inside a cell (a Literal's choices, a docstring) must be escaped, or it splits the
    row and shifts every later cell of it."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    bars = re.compile(r"(?<!\\)\|")
    width = 0
    broken = []
    for line in committed.splitlines():
        if not line.startswith("|"):
            width = 0
            continue
        cells = len(bars.findall(line))
        if width == 0:
            width = cells  # a header row
        elif cells != width:
            broken.append(line[:80])
    assert not broken, broken


# --- documentation for its readers (issue 47) ----------------------------------------------------
#
# Every doc is checked for references that lead nowhere (links, `docs/x.md §n`, repository paths),
# for defaults stated differently from the code, and for length on the operator's path.

DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: The pages an operator reads to deploy and run kafka-diode, each kept to about 5,000 words.
#: Reference and explanation pages are exempt: docs/protocol.md (the normative wire
#: specification), docs/configuration.md (generated from the code) and docs/dedup-internals.md (how
#: the dedup works, for developers).
OPERATOR_PAGES = (
    "deployment.md",
    "operations.md",
    "metrics.md",
    "packaging.md",
    "security.md",
    "sender.md",
    "receiver.md",
    "dedup.md",
    "resend.md",
    "gaps.md",
    "topics.md",
    "benchmarks.md",
)
REFERENCE_PAGES = ("protocol.md", "configuration.md", "dedup-internals.md")
OPERATOR_PAGE_WORDS = 5_000
README_WORDS = 1_000
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE_FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced and indented code blocks (commands and examples, not references)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _CODE_FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            out.append("")
            continue
        out.append(line)
    return "\n".join(out)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _words(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").split())


def test_slug_follows_github() -> None:
    view = "the-operators-view-kafka-diode-status"
    assert _slug("The operator's view: `kafka-diode status`") == view
    assert _slug("4.3 Compression") == "43-compression"
    assert _slug("Choosing the settings (block size, latency, burst tolerance)") == (
        "choosing-the-settings-block-size-latency-burst-tolerance"
    )


def test_every_link_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in _pages():
        for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading in {dest.name})")
    assert not broken, "\n".join(broken)


def test_every_section_reference_exists() -> None:
    """``docs/x.md §n`` (and ``x.md §n``) names a numbered heading of that page; a bare
    ``DESIGN.md §n`` names a file that is not in the repository."""
    broken = []
    pattern = re.compile(r"(?:docs/)?([A-Za-z_-]+\.md)\s*§\s*(\d+(?:\.\d+)*)")
    for page in _pages():
        for name, number in pattern.findall(page.read_text(encoding="utf-8")):
            dest = DOCS / name if (DOCS / name).exists() else ROOT / name
            if not dest.exists():
                broken.append(f"{page.name}: {name} §{number} (no such file in the repository)")
                continue
            heads = re.findall(rf"^#+\s+{re.escape(number)}\.?\s", dest.read_text(), re.M)
            if not heads:
                broken.append(f"{page.name}: {name} §{number} (no heading numbered {number})")
    assert not broken, "\n".join(broken)


_REPO_PATH = re.compile(r"`((?:packaging|bench|tests|docs|scripts)/[A-Za-z0-9_./@*{}-]+)")


def test_every_repository_path_a_doc_names_exists() -> None:
    missing = []
    for page in _pages():
        for raw in _REPO_PATH.findall(page.read_text(encoding="utf-8")):
            path = raw.split("::")[0].rstrip(".,:;)")
            if any(c in path for c in "*{}<") or path.endswith("/"):
                if not (ROOT / path.split("*")[0].split("{")[0].split("<")[0]).parent.exists():
                    missing.append(f"{page.name}: {raw}")
                continue
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {raw}")
    assert not missing, "\n".join(missing)


def test_readme_stays_short() -> None:
    assert _words(README) <= README_WORDS, f"README.md has {_words(README)} words"


def test_operator_pages_stay_readable() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    unlisted = pages - set(OPERATOR_PAGES) - set(REFERENCE_PAGES)
    # every other page is short enough not to need a decision (netem, chaos, local Kafka, design)
    too_long = {name: _words(DOCS / name) for name in unlisted if _words(DOCS / name) > 5_000}
    assert not too_long, f"classify these pages (operator or reference): {too_long}"
    over = {n: _words(DOCS / n) for n in OPERATOR_PAGES if (DOCS / n).exists()}
    over = {n: w for n, w in over.items() if w > OPERATOR_PAGE_WORDS}
    assert not over, f"operator pages over {OPERATOR_PAGE_WORDS} words: {over}"


def test_reference_pages_say_they_are_reference() -> None:
    protocol = (DOCS / "protocol.md").read_text(encoding="utf-8")[:2_000]
    assert "reference" in protocol.lower()
    internals = (DOCS / "dedup-internals.md").read_text(encoding="utf-8")[:1_000]
    assert "not needed to run" in internals.lower()


def test_every_quoted_section_reference_exists() -> None:
    """``docs/x.md "Some heading"`` names a heading of that page."""
    broken = []
    pattern = re.compile(r'(?:docs/)?([a-z_-]+\.md),?\s+"([^"\n]{3,80})"')
    for page in _pages():
        for name, title in pattern.findall(_prose(page.read_text(encoding="utf-8"))):
            dest = DOCS / name
            if not dest.exists():
                continue  # a file elsewhere, checked as a path
            if not any(a.startswith(_slug(title)) for a in _anchors(dest)):
                broken.append(f'{page.name}: {name} "{title}"')
    assert not broken, "\n".join(broken)


def test_readme_set_up_commands_are_make_demo_and_make_test() -> None:
    text = README.read_text(encoding="utf-8")
    commands = {m.group(1).strip() for m in re.finditer(r"^\s*(make\s+[\w-]+)", text, re.M)}
    inline = set(re.findall(r"`(make\s+[\w-]+)`", text))
    assert commands == {"make demo", "make test"}, commands
    assert inline <= {"make demo", "make test"}, inline


# --- defaults stated in prose agree with the code -------------------------------------------------


def _defaults() -> dict[str, set[str]]:
    """Every setting's name as docs write it (snake_case key, ``--flag``, environment variable)
    -> the default(s) the code gives it, as text."""

    out: dict[str, set[str]] = {}

    def add(name: str, value: object) -> None:
        out.setdefault(name, set()).add(str(value))

    for cls, prefix in ((SenderConfig, SENDER_PREFIX), (ReceiverConfig, RECEIVER_PREFIX)):
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING or isinstance(f.default, (dict, tuple)):
                continue
            for name in (f.name, "--" + f.name.replace("_", "-"), prefix + f.name.upper()):
                add(name, f.default)
    for f in dataclasses.fields(DedupConfig):
        if f.default is dataclasses.MISSING or f.default is None:
            continue
        add(env_var(f.name), f.default)
    return out


_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "ms": 0.001, "s": 1, "": 1}


def _same(stated: str, default: str) -> bool:
    """Does ``stated`` (as a doc writes it: ``65,536``, ``64 MiB``, ``20 ms``) equal ``default``?"""

    def number(text: str) -> float | None:
        try:
            return float(text.replace(",", "").replace("_", ""))
        except ValueError:
            return None

    value, _, unit = stated.strip("`*'\" ").partition(" ")
    a, b = number(value), number(default)
    if a is not None and b is not None:
        scale = _UNITS.get(unit, 1)
        return b in (a, a * scale) or abs(a * scale - b) < 1e-9
    return value.lower() == default.lower()


def _default_claims(text: str, names: set[str]) -> list[tuple[str, str]]:
    """(name, value) for every "NAME ... default X" or "NAME (default X)" in ``text``."""
    claims: set[tuple[str, str]] = set()
    value = r"\**`?([\w.\-\[\]*{},]*\w(?:\s(?:KiB|MiB|GiB|ms|s)\b)?)`?"
    for name in names:
        n = re.escape(name)
        patterns = (
            rf"`{n}`\s*\(default:?\s+{value}",
            rf"`{n}`[^.;\n`]{{0,30}}\bdefaults?\s+(?:is\s+|to\s+|of\s+)?{value}",
            rf"`{n}=([^`\s]+)`\s*\(the default\)",
            rf"default\s+`{n}=([^`\s]+)`",
        )
        for pattern in patterns:
            claims.update((name, m.group(1)) for m in re.finditer(pattern, text))
    return sorted(claims)


def test_claims_parser_finds_the_shapes_docs_use() -> None:
    names = {"WINDOW_SIZE", "linger"}
    text = "`WINDOW_SIZE` (default 65536) and `linger`, whose default is `0.005`."
    assert sorted(_default_claims(text, names)) == [("WINDOW_SIZE", "65536"), ("linger", "0.005")]


def test_no_doc_states_a_default_the_code_does_not_have() -> None:
    defaults = _defaults()
    wrong = []
    for page in _pages():
        if page.name == "configuration.md":
            continue  # generated from the same dataclasses
        text = page.read_text(encoding="utf-8")
        for name, stated in _default_claims(text, set(defaults)):
            if not any(_same(stated, d) for d in defaults[name]):
                wrong.append(f"{page.name}: {name} default {stated!r}, code: {defaults[name]}")
    assert not wrong, "\n".join(wrong)


# --- docs/deployment.md: its configurations load through the components' own loaders ------------


def _block_after(text: str, marker: str) -> str:
    """The indented code block that follows the first line mentioning ``marker``."""
    after = text[text.index(marker) :].splitlines()[1:]
    block: list[str] = []
    for line in after:
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line[4:])
        elif block:
            break
    return "\n".join(block).strip() + "\n"


def test_deployment_guide_configurations_are_valid() -> None:

    text = (DOCS / "deployment.md").read_text(encoding="utf-8")
    sender = tomllib.loads(_block_after(text, "`/etc/kafka-diode/sender/main.toml`"))
    receiver = tomllib.loads(_block_after(text, "`/etc/kafka-diode/receiver/main.toml`"))
    assert settings.build(SenderConfig, file_values=sender).rate_bytes == 100_000_000
    assert settings.build(ReceiverConfig, file_values=receiver).raw_topic == "diode.raw"
    env = {}
    for line in _block_after(text, "`/etc/kafka-diode/dedup/main.env`").splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    config = from_sources(env=env)
    assert config.spark_master.startswith("spark://")
    assert config.new_topic_replication == 3
    assert config.spark_conf["spark.driver.blockManager.port"] == "7079"


#: How a doc's code line starts a kafka-diode command (after ``$``, ``sudo`` and ``VAR=value``).
_KAFKA_DIODE = ("kafka-diode", ".venv/bin/kafka-diode", "/usr/bin/kafka-diode")
#: Lines that are diagrams or usage synopses, not commands to type.
_NOT_A_COMMAND = ("[", "...", "…", "─", "→", "►")


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every ``kafka-diode`` command typed in a code block or indented block of the README and
    docs/, continuation lines joined: (``file:line``, its arguments)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_fence, pending, start = False, "", 0
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            if not (in_fence or line.startswith("    ")):
                continue
            text = line.strip()
            start = start if pending else no
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            command, pending = pending + text, ""
            if any(mark in command for mark in _NOT_A_COMMAND):
                continue
            lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
            lexer.whitespace_split, lexer.commenters = True, "#"
            try:
                words = list(lexer)
            except ValueError:  # an unbalanced quote: prose, not a command
                continue
            while words and (words[0] in ("$", "sudo") or re.match(r"[A-Z_][A-Z0-9_]*=", words[0])):
                words = words[1:]
            if words and words[0] in _KAFKA_DIODE:
                found.append((f"{path.relative_to(ROOT)}:{start}", words[1:]))
    return found


def test_every_command_in_the_docs_is_one_the_cli_accepts() -> None:
    """A command an operator copies from the docs names a real command and only options its
    ``--help`` lists (options are never abbreviated, so a shortened one is caught too)."""
    from tests.unit.test_packaging import assert_cli_accepts  # noqa: PLC0415

    commands = doc_commands()
    assert len(commands) >= 30, commands  # the scan finds the docs' commands
    for where, args in commands:
        assert_cli_accepts(args, where)


def test_a_command_with_an_option_the_cli_lacks_is_caught() -> None:
    from tests.unit.test_packaging import assert_cli_accepts  # noqa: PLC0415

    with pytest.raises(AssertionError, match="has no option"):
        assert_cli_accepts(["send", "--rate-byte", "1"], "planted")


#: The packages whose comments and docstrings cite the docs.
_CODE = ("common", "runtime", "sender", "receiver", "dedup", "netem", "kafka_diode", "bench")


def test_every_section_the_code_cites_exists() -> None:
    """A comment or docstring citing ``docs/x.md "Some heading"`` names a heading of that page
    (a reference may wrap onto the next comment line)."""
    pattern = re.compile(r'docs/([a-z_-]+\.md),?\s+"([^"]{3,80})"')
    broken = []
    for package in _CODE:
        for source in sorted((ROOT / package).rglob("*.py")):
            text = re.sub(r"\n\s*(?:#:?\s*)?", " ", source.read_text(encoding="utf-8"))
            for name, title in pattern.findall(text):
                dest = DOCS / name
                if not dest.exists():
                    broken.append(f"{source.relative_to(ROOT)}: no docs/{name}")
                elif not any(a.startswith(_slug(title)) for a in _anchors(dest)):
                    broken.append(f'{source.relative_to(ROOT)}: docs/{name} "{title}"')
    assert not broken, "\n".join(broken)
