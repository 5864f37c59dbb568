"""High side: read upstream Kafka, send paced, encrypted UDP datagrams."""
