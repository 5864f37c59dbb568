"""The write producers' linger default (dedup/fence.py, docs/dedup.md "The writer's linger")."""

from __future__ import annotations

import pytest

from dedup.fence import WRITE_LINGER_MS, _write_linger_ms


def test_the_write_linger_is_long_unless_a_timeout_is_shorter() -> None:
    assert _write_linger_ms({}) == WRITE_LINGER_MS == 2_000
    assert _write_linger_ms({"security.protocol": "SSL"}) == WRITE_LINGER_MS


@pytest.mark.parametrize(
    "name", ["message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms"]
)
def test_a_short_timeout_halves_into_the_linger(name: str) -> None:
    # librdkafka refuses linger.ms >= message.timeout.ms: "Invalid argument or configuration"
    assert _write_linger_ms({name: "3000"}) == 1_500
    assert _write_linger_ms({name: 3000}) == 1_500
    assert _write_linger_ms({name: "600000"}) == WRITE_LINGER_MS
