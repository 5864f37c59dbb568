"""Low side: deduplicate the raw topic into clean topic(s) and report gaps."""
