"""The quickstart notebook runs top to bottom (real kernel, real SparkSession)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("SPARKMQ_QUICKSTART_DIR", str(tmp_path))
    monkeypatch.setenv("SPARKMQ_QUICKSTART_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "received 200" in outputs
    assert "lag per queue:" in outputs
    assert (tmp_path / "lag.png").stat().st_size > 0
