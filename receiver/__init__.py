"""Low side: receive UDP datagrams, authenticate, decode and write the raw topic."""
