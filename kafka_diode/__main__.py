"""``python -m kafka_diode`` is the same as ``kafka-diode``."""

import sys

from kafka_diode.cli import main

sys.exit(main())
