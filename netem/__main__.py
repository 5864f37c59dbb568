"""``python -m netem`` runs the component's command."""

import sys

from kafka_diode.cli import main

sys.exit(main(["netem", *sys.argv[1:]]))
