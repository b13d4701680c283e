"""The fuzz and fault suite's harness (tests/test_fuzz.py, docs/reliability.md)."""
