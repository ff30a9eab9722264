"""Helpers shared by the store tests (message builders, segment paths)."""
