"""SendPipeline with FEC on real loopback sockets, decoded by the receiver's glue (no Kafka).

The pipeline's FEC glue: repairs follow their block on the same target, are paced and copied like
any datagram, the block latency timer sends the repairs of a block that does not fill, and drain
flushes open blocks. The receiving side (tests/fec_support.FecLink) rebuilds what a lossy "link"
(datagrams the test throws away) lost.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from common import settings
from common.errors import ConfigError
from common.wire import Encoder, WireConfig
from common.wire.fec import FecConfig, FecEncoder, is_repair
from sender.config import SenderConfig
from sender.pacing import Pacer, PacingConfig
from sender.send_pipeline import SendPipeline
from sender.transport import UdpSender
from tests.fec_support import FecLink
from tests.wire_support import SESSION, ring


class Rig:
    def __init__(
        self,
        fec: FecConfig,
        *,
        targets: int = 1,
        copies: int = 1,
        pacing: PacingConfig | None = None,
    ) -> None:
        self.socks = []
        for _ in range(targets):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.setblocking(False)
            self.socks.append(s)
        self.udp = UdpSender([("127.0.0.1", s.getsockname()[1]) for s in self.socks])
        size = 1452 - fec.overhead_bytes
        keys = ring()
        loop = asyncio.get_running_loop()
        self.fec = FecEncoder(fec, keys, session_id=SESSION, max_source_size=size)
        self.pipeline = SendPipeline(
            encoder=Encoder(WireConfig(max_datagram_size=size), keys, session_id=SESSION),
            pacer=Pacer(pacing or PacingConfig(), loop.time()),
            udp=self.udp,
            loop=loop,
            copies=copies,
            fec=self.fec,
        )

    def received(self) -> list[list[bytes]]:
        """Datagrams per target socket, in arrival order."""
        out = []
        for s in self.socks:
            got = []
            while True:
                try:
                    got.append(s.recv(65536))
                except BlockingIOError:
                    break
            out.append(got)
        return out

    def close(self) -> None:
        self.pipeline.close()
        self.udp.close()
        for s in self.socks:
            s.close()


def run(coro):  # type: ignore[no-untyped-def]
    with asyncio.Runner() as runner:
        return runner.run(coro)


def _add(pipeline: SendPipeline, n: int) -> None:
    for i in range(n):
        pipeline.record("t", i % 3, i, 1_700_000_000_000 + i, 1, b"k", os.urandom(300), None)


def test_lossy_link_loses_nothing_and_offsets_complete() -> None:
    async def scenario() -> None:
        rig = Rig(FecConfig(overhead=20, block_size=16))
        try:
            _add(rig.pipeline, 2000)
            assert await rig.pipeline.drain(5.0)
            (wire,) = rig.received()
            repairs = [d for d in wire if is_repair(d)]
            assert len(repairs) == rig.fec.repairs > 0
            assert rig.pipeline.datagrams_sent == len(wire)
            link = FecLink()
            for i, d in enumerate(wire):
                if i % 10 != 3:  # every tenth datagram lost (10 %, well inside 20 %)
                    link.receive(d)
            assert sorted(o for _, _, o in link.offsets) == list(range(2000))
            assert link.fec.blocks_unrecoverable == 0
            assert rig.pipeline.records_sent == 2000
            assert rig.pipeline.sent_high == {("t", 0): 1998, ("t", 1): 1999, ("t", 2): 1997}
        finally:
            rig.close()

    run(scenario())


def test_block_latency_timer_sends_the_repairs_of_a_block_that_does_not_fill() -> None:
    async def scenario() -> None:
        rig = Rig(FecConfig(overhead=50, block_size=64, block_latency=0.05))
        try:
            _add(rig.pipeline, 3)
            rig.pipeline.flush()  # the records leave at once (loopback send); the block stays open
            first = rig.received()[0]
            assert first
            assert not any(is_repair(d) for d in first)

            async def repairs_arrive() -> list[bytes]:
                got: list[bytes] = []
                while not got:
                    got = [d for d in rig.received()[0] if is_repair(d)]
                    await asyncio.sleep(0.005)
                return got

            got = await asyncio.wait_for(repairs_arrive(), timeout=2.0)
            assert len(got) == 1  # one source datagram: ceil(1 x 50 %) = 1 repair
        finally:
            rig.close()

    run(scenario())


def test_each_target_gets_its_own_blocks_with_their_repairs_and_copies() -> None:
    async def scenario() -> None:
        rig = Rig(FecConfig(overhead=20, block_size=8, streams=2), targets=2, copies=2)
        try:
            _add(rig.pipeline, 1500)
            assert await rig.pipeline.drain(5.0)
            per_target = rig.received()
            assert all(any(is_repair(d) for d in got) for got in per_target)
            for got in per_target:  # each worker alone rebuilds its share with a source lost
                unique = list(dict.fromkeys(got))
                assert len(got) == 2 * len(unique)  # every datagram, repairs too, twice
                link = FecLink()
                dropped = next(d for d in unique if not is_repair(d))
                for d in got:
                    if d != dropped:
                        link.receive(d)
                assert link.fec.datagrams_reconstructed == 1
                assert link.fec.blocks_unrecoverable == 0
                assert link.drops.get("fec_duplicate", 0) > 0  # the repair copies
        finally:
            rig.close()

    run(scenario())


def test_repairs_are_paced_and_counted_like_any_datagram() -> None:
    async def scenario() -> None:
        rate = 4000.0  # datagrams/s
        rig = Rig(
            FecConfig(overhead=50, block_size=8),
            pacing=PacingConfig(datagrams_per_s=rate, max_datagram_size=1452),
        )
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            _add(rig.pipeline, 1200)
            assert await rig.pipeline.drain(10.0)
            elapsed = loop.time() - start
            (wire,) = rig.received()
            sent = rig.pipeline.datagrams_sent
            assert sent == len(wire) == len(set(wire))
            assert sum(is_repair(d) for d in wire) == rig.fec.repairs > 0
            # every datagram, repairs included, took its token: no faster than the rate allows
            burst = rate * 0.02
            assert elapsed >= (sent - burst) / rate * 0.9
            assert rig.pipeline.pacing_delay > 0
        finally:
            rig.close()

    run(scenario())


# -- configuration --------------------------------------------------------------------------

_BASE = {
    "bootstrap_servers": "127.0.0.1:9092",
    "target": "127.0.0.1:9000",
    "topics": ["a"],
    "insecure_cleartext": True,
}


def _config(**overrides: object) -> SenderConfig:
    return settings.build(SenderConfig, file_values={**_BASE, **overrides})


def test_fec_is_off_by_default_and_sources_keep_their_size() -> None:
    cfg = _config()
    assert cfg.fec_config() is None
    assert cfg.fec_encoder(None, SESSION) is None
    assert cfg.wire_config().max_datagram_size == cfg.max_datagram_size == 1452


def test_fec_settings_from_flags_environment_and_file() -> None:
    cfg = settings.build(
        SenderConfig,
        file_values={**_BASE, "fec_block_size": 64},
        env={"DIODE_SENDER_FEC_INTERLEAVE": "4"},
        env_prefix="DIODE_SENDER_",
        flags={"fec_overhead": 20.0},
    )
    fec = cfg.fec_config()
    assert fec == FecConfig(overhead=20.0, block_size=64, interleave=4, streams=1)
    # sources leave room for the repair envelope, FEC header and a 512-bit member bitmap
    assert cfg.wire_config().max_datagram_size == 1452 - (81 + 512 // 8)
    assert cfg.fec_encoder(None, SESSION) is not None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"fec_overhead": -1}, "fec_overhead"),
        ({"fec_overhead": 101}, "fec_overhead"),
        ({"fec_overhead": 20, "fec_block_latency": 2}, "fec_block_latency"),
        ({"fec_overhead": 20, "fec_block_size": 256}, "fec_block_size"),
        ({"fec_overhead": 20, "max_datagram_size": 300}, "max_datagram_size"),
    ],
)
def test_bad_fec_settings_name_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(**overrides)
    assert err.value.key == key
