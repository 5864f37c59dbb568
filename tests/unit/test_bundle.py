"""Resend bundle format: build, sign, verify, and refusal of every kind of bad file."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import bundle as b
from common.errors import BundleError

KEY = bytes(range(32))
OTHER = bytes(32)


def _bundle() -> b.Bundle:
    gaps = [
        ("orders", 0, 10, 19),
        ("orders", 0, 15, 25),
        ("orders", 0, 27, 27),
        ("a.b-c_d", 2, 5, 5),
    ]
    return b.build(gaps, bundle_id="00ff", created_at_ms=1_700_000_000_000)


def test_build_merges_ranges_per_partition_and_counts() -> None:
    bundle = _bundle()
    assert [(p.topic, p.partition, p.ranges) for p in bundle.partitions] == [
        ("a.b-c_d", 2, ((5, 5),)),
        ("orders", 0, ((10, 25), (27, 27))),
    ]
    assert bundle.gap_count == 4
    assert bundle.record_count == 1 + 16 + 1


def test_sign_then_verify_round_trips() -> None:
    data = b.sign(_bundle(), key_id=7, link_key=KEY)
    assert b.verify(data, {7: KEY}) == _bundle()
    json.loads(data)  # human-readable JSON


def test_max_records_cuts_the_last_range() -> None:
    bundle = b.build(
        [("t", 0, 0, 9), ("t", 1, 0, 9)], bundle_id="x", created_at_ms=0, max_records=13
    )
    assert [(p.partition, p.ranges) for p in bundle.partitions] == [(0, ((0, 9),)), (1, ((0, 2),))]
    assert bundle.record_count == 13


def test_tampered_range_is_refused() -> None:
    doc = json.loads(b.sign(_bundle(), key_id=7, link_key=KEY))
    doc["partitions"][1]["ranges"][0][1] = 26
    doc["partitions"][1]["records"] += 1
    doc["record_count"] += 1
    with pytest.raises(BundleError, match="altered"):
        b.verify(json.dumps(doc).encode(), {7: KEY})


def test_wrong_key_is_refused() -> None:
    data = b.sign(_bundle(), key_id=7, link_key=KEY)
    with pytest.raises(BundleError, match="altered or made with another key"):
        b.verify(data, {7: OTHER})


def test_unknown_key_id_is_refused() -> None:
    data = b.sign(_bundle(), key_id=7, link_key=KEY)
    with pytest.raises(BundleError, match="key id 7"):
        b.verify(data, {8: KEY})


@pytest.mark.parametrize("cut", [1, 10, 100, -2])
def test_truncated_file_is_refused(cut: int) -> None:
    data = b.sign(_bundle(), key_id=7, link_key=KEY)
    with pytest.raises(BundleError):
        b.verify(data[:cut], {7: KEY})


def test_wrong_version_is_refused() -> None:
    doc = json.loads(b.sign(_bundle(), key_id=7, link_key=KEY))
    doc["version"] = 2
    with pytest.raises(BundleError, match="version 2 is not supported"):
        b.verify(json.dumps(doc).encode(), {7: KEY})


def test_missing_auth_is_refused() -> None:
    doc = json.loads(b.sign(_bundle(), key_id=7, link_key=KEY))
    del doc["auth"]
    with pytest.raises(BundleError, match="no HMAC"):
        b.verify(json.dumps(doc).encode(), {7: KEY})


def test_other_json_is_refused() -> None:
    with pytest.raises(BundleError, match="not a kafka-diode bundle"):
        b.verify(b'{"hello": 1}', {7: KEY})


def test_oversized_file_is_refused_before_parsing() -> None:
    with pytest.raises(BundleError, match="over the"):
        b.verify(b" " * (b.MAX_BUNDLE_BYTES + 1), {7: KEY})


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), max_size=40))
def test_merge_covers_exactly_the_union(pairs: list[tuple[int, int]]) -> None:
    ranges = [(a, a + n) for a, n in pairs]
    merged = b.merge_ranges(ranges)
    union = {o for a, z in ranges for o in range(a, z + 1)}
    assert {o for a, z in merged for o in range(a, z + 1)} == union
    assert all(merged[i][1] + 1 < merged[i + 1][0] for i in range(len(merged) - 1))
