"""Moving from pydantic-ai-harness: its stores read through `harness+...://` URLs, its SQL databases
adopted in place. See docs/migrating.md."""
