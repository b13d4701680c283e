"""GPU probes and measurement scripts: run from a checkout, never installed with the package."""
