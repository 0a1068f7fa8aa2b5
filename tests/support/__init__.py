"""Helpers the test modules share. No test module imports another test module (tests/test_layout.py says so)."""
