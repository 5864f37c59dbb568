"""Entry point for ``spark-submit``: ``spark-submit --master spark://… dedup/spark_main.py``.

Runs exactly what ``kafka-diode dedup`` runs; settings from the environment (and flags after the
script name). Under spark-submit, the master and resources given to spark-submit win over
SPARK_MASTER. Ship the ``common``, ``dedup``, ``kafka_diode`` and ``runtime`` packages to the
executors with ``--py-files`` (a zip of them, also named in ``spark.executorEnv.PYTHONPATH`` for
the worker daemon) or install kafka-diode on every node (docs/dedup.md "Running on a Spark
cluster").
"""

from __future__ import annotations

import sys

from dedup.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="spark_main.py"))
