"""The worker daemon's preload when a module is missing on an executor: reported, never fatal."""

from __future__ import annotations

import pytest

from dedup import worker_daemon


def test_a_preload_that_fails_says_so_and_leaves_the_workers_to_import(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(worker_daemon, "PRELOADED_MODULES", ("dedup.no_such_module_here",))
    monkeypatch.setattr(worker_daemon, "preloaded_by", None)
    assert worker_daemon.preload() is False
    assert worker_daemon.preloaded_by is None
    err = capsys.readouterr().err
    assert "preloading failed; workers import on their own" in err
    assert "dedup.no_such_module_here" in err


def test_the_preloaded_modules_are_the_ones_the_workers_run() -> None:
    # a renamed module would make the preload fail on every executor (and only warn): the names
    # must stay importable
    import importlib.util  # noqa: PLC0415

    for name in worker_daemon.PRELOADED_MODULES:
        assert importlib.util.find_spec(name) is not None, name
