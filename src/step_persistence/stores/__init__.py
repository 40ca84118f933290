"""Step-store backends."""
