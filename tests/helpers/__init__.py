"""Helpers shared by the tests: store tools (message builders, segment paths), a manual
clock, broker configs on free ports, and daemon processes (start, stop, kill -9)."""
