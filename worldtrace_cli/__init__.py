"""worldtrace: long-horizon video generation with addressable KV-cache memory for MG2."""

__version__ = "0.1.0"
