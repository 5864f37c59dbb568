"""``python -m dedup`` runs the component's command."""

import sys

from kafka_diode.cli import main

sys.exit(main(["dedup", *sys.argv[1:]]))
