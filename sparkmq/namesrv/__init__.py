"""The NameServer routing registry. Not built yet (issue 4)."""
