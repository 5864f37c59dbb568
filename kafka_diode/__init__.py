"""kafka-diode: the command-line front door and the tooling around the components.

The components live in the top-level packages ``common`` (pure wire protocol), ``sender``,
``receiver``, ``dedup`` and ``netem``. This package holds the ``kafka-diode`` dispatcher, the
embedded local Kafka broker used by tests and the demo, the demo itself and the benchmark front end.
"""

from importlib import metadata

try:
    __version__ = metadata.version("kafka-diode")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
