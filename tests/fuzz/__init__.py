"""The fuzz and fault suite's harness (tests/system/test_fuzz.py, docs/reliability.md)."""
