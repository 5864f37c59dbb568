"""Plot rate versus loss from a ``bench/e2e.py`` result (PNG, matplotlib).

Left: the offered-rate sweep, sender rate achieved (MB/s) and datagram loss at the socket (%)
against the offered rate (``--rate-bytes``; the unpaced point is drawn at the rate it reached).
Right: end-to-end records/s per case, with the same-run bare produce loop for its record size.

    .venv/bin/python bench/e2e.py --sweep --json-out /tmp/e2e.json
    .venv/bin/python bench/plot.py /tmp/e2e.json docs/img/e2e-rate-loss.png

matplotlib is a development extra; without it this script says so and exits 2. Prints one JSON
object (what it wrote) as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    ap.add_argument("result", type=Path, help="JSON written by bench/e2e.py --json-out")
    ap.add_argument("png", type=Path, help="where to write the plot")
    args = ap.parse_args(argv)
    try:
        import matplotlib as mpl  # noqa: PLC0415  optional dev extra; absence is reported

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415  as above
    except ImportError:
        print("bench/plot.py needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    result: dict[str, Any] = json.loads(args.result.read_text().strip().splitlines()[-1])
    sweep = result.get("rate_sweep") or []
    cases = result.get("cases") or []
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    load = " ".join(result.get("machine", {}).get("loadavg", []))
    fig.suptitle(f"kafka-diode end to end, {result.get('machine', {}).get('cpus')} vCPUs, "
                 f"load average at start {load}")  # fmt: skip

    if sweep:
        xs = [p["offered_mb_per_s"] or p["sender_mb_per_s"] for p in sweep]
        order = sorted(range(len(xs)), key=xs.__getitem__)
        xs = [xs[i] for i in order]
        achieved = [sweep[i]["sender_mb_per_s"] for i in order]
        loss = [100 * sweep[i]["loss_rate"] for i in order]
        left.plot(xs, achieved, "o-", color="tab:blue", label="sender MB/s achieved")
        left.plot(xs, xs, ":", color="grey", label="offered = achieved")
        left.set_xlabel("offered rate, MB/s of datagrams (unpaced point at its achieved rate)")
        left.set_ylabel("sender MB/s", color="tab:blue")
        twin = left.twinx()
        twin.plot(xs, loss, "s--", color="tab:red", label="socket loss %")
        twin.set_ylabel("datagram loss at the socket, %", color="tab:red")
        twin.set_ylim(bottom=0, top=max(1.0, *loss) * 1.2)
        left.set_title("offered-rate sweep (200 B records, sender -> receiver)")
        left.legend(loc="upper left")
        twin.legend(loc="lower right")
    else:
        left.text(0.5, 0.5, "no rate sweep in this result", ha="center")

    if cases:
        labels = [c["label"].replace(", ", "\n") for c in cases]
        rates = [c["records_per_s"] for c in cases]
        right.bar(range(len(cases)), rates, color="tab:green", label="end to end")
        base = result.get("baselines") or {}
        for i, c in enumerate(cases):
            size = c["case"]["size"]
            for name, figs in base.items():
                if name.startswith("kafka") and figs.get("size") == size:
                    right.plot([i - 0.4, i + 0.4], [figs["produce_records_per_s"]] * 2, "k--")
        right.set_xticks(range(len(cases)), labels, fontsize=7)
        right.set_yscale("log")
        right.set_ylabel("records/s (log)")
        right.set_title("end-to-end records/s per case (dashed: bare produce loop)")
    else:
        right.text(0.5, 0.5, "no cases in this result", ha="center")
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=100)
    print(json.dumps({"bench": "plot", "png": str(args.png), "points": len(sweep)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
