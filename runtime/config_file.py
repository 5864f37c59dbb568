"""The file a command's ``--config`` names: read here, parsed by ``common.settings``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.settings import toml_section


def read_toml_section(path: Path | str | None, section: str) -> dict[str, Any]:
    """The ``[section]`` table of the TOML file at ``path``, or its top level when there is no
    such table; ``{}`` without a file.

    Raises:
        ConfigError: naming ``--config`` when the file cannot be read or parsed, or the section is
            not a table.
    """
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", f"{path} is not UTF-8 text: {exc}") from exc
    return toml_section(text, path, section)
