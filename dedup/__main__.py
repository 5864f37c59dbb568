"""``python -m dedup`` runs ``kafka-diode dedup`` (its own CLI, not the dispatcher)."""

import sys

from dedup.cli import main

sys.exit(main(sys.argv[1:], prog="kafka-diode dedup"))
