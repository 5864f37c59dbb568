"""``python -m sender`` runs the component's command."""

import sys

from kafka_diode.cli import main

sys.exit(main(["send", *sys.argv[1:]]))
