"""Golden vectors pin the FEC repair datagrams byte for byte (tests/vectors/fec_v1.json, made by
scripts/make_fec_vectors.py, printed in docs/protocol.md §13.6)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from common.wire import Encoder, Key, KeyRing, WireConfig
from common.wire.envelope import HEADER, HEADER_SIZE
from common.wire.fec import (
    FEC_HEADER,
    KIND_FEC_REPAIR,
    FecConfig,
    FecDecoder,
    FecEncoder,
    FecLimits,
)
from scripts.make_vectors import records

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "fec_v1.json").read_text(encoding="utf-8")
)
RING = KeyRing([Key.from_material(bytes.fromhex(VECTORS["key_hex"]))])
SESSION = bytes.fromhex(VECTORS["session_id_hex"])
_IDS = {"ids": lambda v: v["name"]}


def _ring(vector: dict[str, Any]) -> KeyRing | None:
    return None if vector["cipher"] == "none" else RING


@pytest.mark.parametrize("vector", VECTORS["vectors"], **_IDS)
def test_encoders_reproduce_the_vector(vector: dict[str, Any]) -> None:
    # the vectors were made with one block per stream: pinned, whatever the default interleave
    fec = FecConfig(
        overhead=vector["fec"]["overhead"], block_size=vector["fec"]["block_size"], interleave=1
    )
    size = vector["max_datagram_size"] - fec.overhead_bytes
    ring = _ring(vector)
    enc = Encoder(
        WireConfig(max_datagram_size=size, allow_cleartext=ring is None),
        ring,
        session_id=SESSION,
        first_sequence=VECTORS["first_sequence"],
    )
    fenc = FecEncoder(fec, ring, session_id=SESSION, max_source_size=size)
    sources, repairs = [], []
    for r in records():
        for d in enc.add(*r, now=0.0) + enc.flush():
            sources.append(d.data.hex())
            repairs += [x.hex() for x in fenc.add(d.data, 0, 0.0)]
    assert sources == vector["sources"]
    assert repairs == vector["repairs"]


@pytest.mark.parametrize("vector", VECTORS["vectors"], **_IDS)
def test_any_three_of_five_rebuild_the_sources(vector: dict[str, Any]) -> None:
    sources = [bytes.fromhex(s) for s in vector["sources"]]
    repairs = [bytes.fromhex(r) for r in vector["repairs"]]
    limits = FecLimits(allow_cleartext=vector["cipher"] == "none")
    for kept in itertools.combinations(range(5), 3):
        dec = FecDecoder(limits, _ring(vector))
        got = {i: sources[i] for i in kept if i < 3}
        for i in got:
            dec.add_source(sources[i], 0.0)
        for i in kept:
            if i >= 3:
                for d in dec.receive_repair(repairs[i - 3], 0.0):
                    got[sources.index(d)] = d
        assert got == dict(enumerate(sources)), kept


def test_cleartext_repair_fields_as_documented() -> None:
    vector = next(v for v in VECTORS["vectors"] if v["cipher"] == "none")
    repair = bytes.fromhex(vector["repairs"][1])
    fields = HEADER.unpack_from(repair)
    assert fields[2] == KIND_FEC_REPAIR
    assert fields[6] == 1  # the second repair of the session
    assert fields[10] == len(repair) - HEADER_SIZE - 2  # message length, 2-byte varint prefix
    plain = repair[HEADER_SIZE + 2 :]
    first, scheme, k, m, index, size, span = FEC_HEADER.unpack_from(plain)
    assert (first, scheme, k, m, index, span) == (5, 1, 3, 2, 1, 3)
    assert plain[FEC_HEADER.size] == 0b111
    longest = max(len(bytes.fromhex(s)) for s in vector["sources"])
    assert size == 2 + longest == len(plain) - FEC_HEADER.size - 1
