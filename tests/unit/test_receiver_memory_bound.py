"""The receiver's memory bound against its service's memory limit (receiver/memory_bound.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from receiver.config import ReceiverConfig
from receiver.memory_bound import BESIDE_PROCESS_MIB, MIB, bound_bytes, check_memory_fits

GIB = 1024 * MIB
KEY = Path("link.key")


def test_the_defaults_fit_the_shipped_unit() -> None:
    """buffer 512 + backlog 64 + reassembly 128 + one 64 MiB socket + the process's own."""
    config = ReceiverConfig(key_file=KEY)
    assert bound_bytes(config) == (512 + 64 + 128 + 64 + BESIDE_PROCESS_MIB) * MIB
    check_memory_fits(config, GIB)  # MemoryMax=1G (packaging/systemd)
    check_memory_fits(config, None)  # no limit, nothing to check


def test_raised_buffers_without_a_raised_limit_stop_the_start_naming_the_fixes() -> None:
    config = ReceiverConfig(key_file=KEY, buffer_max_bytes=GIB)
    with pytest.raises(ConfigError) as caught:
        check_memory_fits(config, GIB)
    text = str(caught.value)
    assert caught.value.key == "buffer_max_bytes"
    assert "memory limit (cgroup, MemoryMax=) is 1024 MiB" in text
    assert "buffer_max_bytes 1024" in text
    assert "MemoryMax=" in text
    check_memory_fits(config, 2 * GIB)  # the drop-in the message names


def test_every_worker_process_holds_its_own_buffers() -> None:
    one = ReceiverConfig(key_file=KEY, listen_ports=(9472,))
    workers = ReceiverConfig(key_file=KEY, listen_ports=(9472,), worker_processes=True)
    # one process: both sockets' buffers; workers: each a socket, all its buffers, plus a parent
    assert bound_bytes(one) == bound_bytes(ReceiverConfig(key_file=KEY)) + 64 * MIB
    assert bound_bytes(workers) == 2 * bound_bytes(ReceiverConfig(key_file=KEY)) + (
        BESIDE_PROCESS_MIB * MIB
    )
    check_memory_fits(one, GIB)
    with pytest.raises(ConfigError, match="2 worker processes, each holding"):
        check_memory_fits(workers, GIB)


def test_public_key_mode_counts_the_datagrams_held_for_their_key() -> None:
    shared = ReceiverConfig(key_file=KEY)
    pubkey = ReceiverConfig(
        receiver_key_file=Path("r.key"), trusted_senders_file=Path("t.pub"), hold_bytes=100 * MIB
    )
    assert bound_bytes(pubkey) == bound_bytes(shared) + 100 * MIB


def test_a_limit_just_above_the_bound_passes_and_at_it_stops() -> None:
    config = ReceiverConfig(key_file=KEY)
    check_memory_fits(config, bound_bytes(config) + 1)
    with pytest.raises(ConfigError):
        check_memory_fits(config, bound_bytes(config))
