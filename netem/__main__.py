"""``python -m netem`` runs ``kafka-diode netem`` (its own CLI, not the dispatcher)."""

import sys

from netem.cli import main

sys.exit(main(sys.argv[1:], prog="kafka-diode netem"))
