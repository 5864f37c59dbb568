"""The I/O layer between ``common`` (pure) and the components (sender, receiver, dedup, netem).

Everything that touches the outside world in the same way for several components lives here, once:
Kafka clients and their errors (``kafka``), signals and event loops (``service``), key files
(``link_key``), Maven artifacts such as Spark's Kafka connector (``maven``). No component
constructs a Kafka client or installs a signal handler by itself (tests/unit/test_architecture.py).
"""
