"""What the receiver may hold in memory, against the memory limit of its service.

During a long downstream outage a receiver fills its buffers: librdkafka's queue
(``buffer_max_bytes``), then its own backlog (``backlog_max_bytes``), beside the reassembly bound
(``max_reassembly_bytes``), its sockets' buffers (``rcvbuf_bytes`` each) and, in public-key mode,
the datagrams held for their session key (``hold_bytes``); with ``worker_processes`` every worker
process holds all of these. Past the cgroup limit (systemd's ``MemoryMax=``) the kernel kills the
receiver with every record it holds, so a configuration whose bound does not fit stops the start
instead (exit 2), naming the settings. The runs being filled are left out: they hold what arrives
within ``run_linger`` (20 ms: 2.5 MB at 125 MB/s). Pure: the caller passes the limit
(:mod:`runtime.cgroup_memory`).
"""

from __future__ import annotations

from common.errors import ConfigError
from receiver.config import ReceiverConfig

MIB = 1 << 20
#: What a receiver process holds beside its bounded buffers: Python and its modules (~60 MiB),
#: librdkafka's threads, the Python objects of waiting records. At the defaults a downstream
#: outage of 10 KB records peaked at ~680 MiB with 576 MiB of them in the two buffers
#: (tests/integration/test_receiver_memory.py).
BESIDE_PROCESS_MIB = 128


def processes(config: ReceiverConfig) -> int:
    """Receiver processes that each hold the buffers: one per socket with ``worker_processes``."""
    count = config.socket_count()
    return count if config.worker_processes and count > 1 else 1


def process_bound_bytes(config: ReceiverConfig) -> int:
    """The most one receiver process may hold, its beside share included."""
    sockets = 1 if processes(config) > 1 else config.socket_count()
    held = config.hold_bytes if config.receiver_key_file is not None else 0
    return (
        config.buffer_max_bytes
        + config.backlog_max_bytes
        + config.max_reassembly_bytes
        + sockets * config.rcvbuf_bytes
        + held
        + BESIDE_PROCESS_MIB * MIB
    )


def bound_bytes(config: ReceiverConfig) -> int:
    """The most the receiver may hold over all its processes (a parent of workers holds only
    its own Python)."""
    workers = processes(config)
    parent = BESIDE_PROCESS_MIB * MIB if workers > 1 else 0
    return workers * process_bound_bytes(config) + parent


def check_memory_fits(config: ReceiverConfig, limit_bytes: int | None) -> None:
    """Raise if the receiver's bound reaches ``limit_bytes`` (None: no limit, nothing to check).

    Raises:
        ConfigError: naming ``buffer_max_bytes``, the bound and its parts, and the fixes.
    """
    if limit_bytes is None:
        return
    total = bound_bytes(config)
    if total < limit_bytes:
        return
    workers = processes(config)
    each = f"{workers} worker processes, each holding " if workers > 1 else "one process holding "
    parts = (
        f"buffer_max_bytes {config.buffer_max_bytes // MIB} + backlog_max_bytes "
        f"{config.backlog_max_bytes // MIB} + max_reassembly_bytes "
        f"{config.max_reassembly_bytes // MIB} + rcvbuf_bytes + ~{BESIDE_PROCESS_MIB} MiB of "
        "its own"
    )
    raise ConfigError(
        "buffer_max_bytes",
        f"the receiver may hold {total // MIB} MiB during a long downstream outage ({each}"
        f"{parts}), but this process's memory limit (cgroup, MemoryMax=) is "
        f"{limit_bytes // MIB} MiB: the kernel would kill it with every record it holds",
        "lower buffer_max_bytes (or backlog_max_bytes, max_reassembly_bytes, rcvbuf_bytes), or "
        "raise the unit's MemoryMax= with a drop-in (systemctl edit kafka-diode-receiver@…; "
        "docs/packaging.md)",
    )
