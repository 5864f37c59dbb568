"""``python -m receiver`` runs ``kafka-diode receive`` (its own CLI, not the dispatcher)."""

import sys

from receiver.cli import main

sys.exit(main(sys.argv[1:], prog="kafka-diode receive"))
