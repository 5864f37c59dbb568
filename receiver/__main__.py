"""``python -m receiver`` runs the component's command."""

import sys

from kafka_diode.cli import main

sys.exit(main(["receive", *sys.argv[1:]]))
