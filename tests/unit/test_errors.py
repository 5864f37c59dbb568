"""The exception tree drawn in common/errors.py names every exception class we define."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import common.errors
from common.errors import DiodeError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "runtime", "sender", "receiver", "dedup", "netem", "kafka_diode")


def _our_exceptions() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for package in PACKAGES:
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if info.name.endswith("__main__") or ".local_kafka." in info.name + ".":
                continue
            module = importlib.import_module(info.name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                # Private control-flow signals (kafka_diode.cli_reference._Captured) are no errors.
                if obj.__name__.startswith("_") or obj.__module__.split(".")[0] not in PACKAGES:
                    continue
                if issubclass(obj, BaseException):
                    found.add(obj)
    return found


def test_every_exception_is_in_the_tree_and_derives_from_the_root() -> None:
    tree = common.errors.__doc__ or ""
    classes = _our_exceptions()
    assert classes, "no exception classes found"
    for cls in classes:
        assert issubclass(cls, DiodeError), f"{cls.__module__}.{cls.__name__} is outside the tree"
        assert f"── {cls.__name__} " in tree or f"    {cls.__name__}\n" in tree, (
            f"{cls.__module__}.{cls.__name__} is missing from the tree in common/errors.py"
        )


def test_every_class_the_tree_names_exists() -> None:
    """The tree names no exception that is gone (a stale entry misleads like a missing one)."""
    tree = common.errors.__doc__ or ""
    names = {cls.__name__ for cls in _our_exceptions()} | {"DiodeError"}
    drawn = re.findall(r"(?:── |^    )([A-Z]\w+(?:Error|Large))\b", tree, re.MULTILINE)
    assert drawn
    for name in drawn:
        assert name in names, f"{name} is drawn in common/errors.py but defined nowhere"
