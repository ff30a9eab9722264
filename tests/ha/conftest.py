"""Fixtures of the replication tests."""
from __future__ import annotations

import pytest

from test_ha import Pair


@pytest.fixture
def pair(tmp_path):
    """``pair(**kw)``: a master store with its HA service (``Pair``), closed after the
    test with the replica it started."""
    made = []

    def make(**kw):
        p = Pair(tmp_path, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()
