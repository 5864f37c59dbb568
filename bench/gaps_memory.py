"""Gap detector state: serialized bytes per offset and observe_many throughput.

10 million offsets with 1 % random single-offset gaps go through one PartitionDetector in batches
of 100k (default config: WINDOW_SIZE 65536, MAX_WINDOWS 1024, so nothing is evicted). Reports the
serialized state per offset (bitmap alone, and the whole state after two scans have reported every
gap) against docs/gaps.md's worst case of 0.125 B/offset, plus throughput in offsets/s, with the
same-run baseline of pyroaring's own bulk insert of the same arrays. Last line: one JSON object.

    .venv/bin/python bench/gaps_memory.py [--offsets N] [--loss 0.01] [--dup 0.1]
"""

from __future__ import annotations

import argparse
import array
import json
import platform
import random
import time

from pyroaring import BitMap64

from dedup.detector import DetectorConfig, PartitionDetector


def batches(n: int, loss: float, dup: float, size: int, seed: int) -> list[array.array]:
    rnd = random.Random(seed)
    kept = array.array("Q", (o for o in range(n) if rnd.random() >= loss))
    out = []
    for i in range(0, len(kept), size):
        part = kept[i : i + size]
        if dup:
            extra = array.array("Q", rnd.choices(part, k=int(len(part) * dup)))
            part = part + extra
        out.append(part)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--offsets", type=int, default=10_000_000)
    parser.add_argument("--loss", type=float, default=0.01)
    parser.add_argument("--dup", type=float, default=0.10, help="duplicates in the second run")
    parser.add_argument("--batch", type=int, default=100_000)
    args = parser.parse_args()
    n = args.offsets
    config = DetectorConfig()

    clean = batches(n, args.loss, 0.0, args.batch, 1)
    t0 = time.perf_counter()
    base = BitMap64()
    for part in clean:
        base |= BitMap64(part)
    baseline_s = time.perf_counter() - t0

    det = PartitionDetector("bench", 0, config)
    t0 = time.perf_counter()
    for part in clean:
        det.observe_many(part, 0)
    observe_s = time.perf_counter() - t0
    assert det.delivered == len(base)

    bitmap_blob = det.to_bytes()
    t0 = time.perf_counter()
    det.scan(1)
    reported = det.scan(2)
    scan_s = time.perf_counter() - t0
    full_blob = det.to_bytes()
    t0 = time.perf_counter()
    restored = PartitionDetector.from_bytes(full_blob, config)
    restore_s = time.perf_counter() - t0
    assert restored.open_gaps() == det.open_gaps()

    dupped = batches(n // 4, args.loss, args.dup, args.batch, 2)
    det2 = PartitionDetector("bench", 0, config)
    total_dup = sum(len(p) for p in dupped)
    t0 = time.perf_counter()
    for part in dupped:
        det2.observe_many(part, 0)
    dup_s = time.perf_counter() - t0

    result = {
        "machine": f"{platform.machine()} {platform.python_version()}",
        "offsets": n,
        "loss": args.loss,
        "gaps": len(reported),
        "bitmap_state_bytes": len(bitmap_blob),
        "bitmap_bytes_per_offset": round(len(bitmap_blob) / n, 5),
        "state_bytes_after_scans": len(full_blob),
        "state_bytes_per_offset": round(len(full_blob) / n, 5),
        "worst_case_bytes_per_offset": 0.125,
        "observe_many_offsets_per_s": round(n * (1 - args.loss) / observe_s),
        "observe_many_dup_offsets_per_s": round(total_dup / dup_s),
        "baseline_bitmap_union_offsets_per_s": round(n * (1 - args.loss) / baseline_s),
        "two_scans_s": round(scan_s, 3),
        "from_bytes_s": round(restore_s, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
