"""The notebooks run top to bottom in a real kernel (ipykernel on this interpreter, a real
local SparkSession): no cell fails, every plot cell shows an inline PNG, and the numbers
they print are the expected ones. The committed copies carry no outputs; executed copies
are written to tmp_path."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL = "sparkmq-notebook-test"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernel spec that runs ipykernel on this very interpreter (sys.executable), found
    through JUPYTER_PATH in a temp dir, so no user or system kernel is picked up."""
    pytest.importorskip("ipykernel")
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "sparkmq tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def _run(name: str, tmp_path: Path, kernel: str):
    """Execute notebooks/<name> into tmp_path/<name>; the executed notebook and its
    stdout text."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL-PYTHON', sys.executable)"))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=kernel,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()                       # raises CellExecutionError on a failing cell
    finally:
        nbformat.write(nb, str(tmp_path / name))
    stdout = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("name") == "stdout")
    assert f"KERNEL-PYTHON {sys.executable}\n" in stdout
    return nb, stdout


def _assert_plots_inline(nb, expected: int) -> None:
    """Every cell that calls plt.show() displayed a PNG; nothing was saved to a file."""
    plot_cells = [c for c in nb.cells if c.cell_type == "code" and "plt.show()" in c.source]
    assert len(plot_cells) == expected
    for cell in plot_cells:
        pngs = [o for o in cell.outputs
                if o.output_type == "display_data" and "image/png" in o.get("data", {})]
        assert pngs, f"no inline image from:\n{cell.source[:300]}"
        assert "savefig" not in cell.source


def test_quickstart(tmp_path, monkeypatch, kernel):
    monkeypatch.setenv("SPARKMQ_QUICKSTART_DIR", str(tmp_path))
    monkeypatch.setenv("SPARKMQ_QUICKSTART_STORE", str(tmp_path / "store"))
    nb, out = _run("quickstart.ipynb", tmp_path, kernel)
    _assert_plots_inline(nb, 4)
    assert "received 200" in out
    assert "lag per queue: {0: 15, 1: 15, 2: 15, 3: 15}" in out
    produced = int(re.search(r"produced (\d+) messages in", out).group(1))
    assert produced >= 1000
    assert "events produced 4800" in out
    assert "final lag {'spark-dashboard': 0, 'audit': 0}" in out   # both groups caught up
    assert "audit consumer read 4800 messages" in out


def test_kafka_port(tmp_path, monkeypatch, kernel):
    monkeypatch.setenv("SPARKMQ_KAFKA_PORT_DIR", str(tmp_path))
    nb, out = _run("kafka_port.ipynb", tmp_path, kernel)
    _assert_plots_inline(nb, 1)
    # option columns=kafka: the source's schema is Kafka's (no hand-written select)
    assert ("root\n |-- key: binary (nullable = true)\n |-- value: binary (nullable = true)\n"
            " |-- topic: string (nullable = true)\n |-- partition: integer (nullable = true)\n"
            " |-- offset: long (nullable = true)\n |-- timestamp: timestamp (nullable = true)\n"
            " |-- timestampType: integer (nullable = true)\n\n") in out
    assert "micro-batches 3 rows per batch [1000, 1000, 1000]" in out   # maxOffsetsPerTrigger
    assert "rows in the sink 3000" in out
    assert "messages read by Polars 3000" in out
    assert "Polars and the Spark sink agree on 3000 clicks" in out


@pytest.mark.parametrize("name", ["quickstart.ipynb", "kafka_port.ipynb"])
def test_committed_notebooks_have_no_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["source"]
