"""Avro schemas of the wire protocol (docs/protocol.md); loaded by common.wire.envelope."""
