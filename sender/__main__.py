"""``python -m sender`` runs ``kafka-diode send`` (its own CLI, not the dispatcher)."""

import sys

from sender.cli import main

sys.exit(main(sys.argv[1:], prog="kafka-diode send"))
