"""Entry point for ``spark-submit``: ``spark-submit --master spark://… dedup/spark_main.py``.

Runs exactly what ``kafka-diode dedup`` runs; settings from the environment (and flags after the
script name). Under spark-submit, the master and resources given to spark-submit win over
SPARK_MASTER. Ship the ``dedup``, ``common`` and ``kafka_diode`` packages to the executors with
``--py-files`` (a zip of them) or install kafka-diode on every node.
"""

from __future__ import annotations

import sys

from dedup.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="spark_main.py"))
