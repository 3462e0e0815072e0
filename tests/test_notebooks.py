"""notebooks/: each runs top to bottom (nbclient), renders to HTML with its figures, and is
committed without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import data_dir

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
#: notebook -> (shared data it reads or None, figures it must show at least)
EXPECTED = {"01_quickstart.ipynb": (None, 1), "02_region_transfer.ipynb": ("era5", 2),
            "03_explore_maps.ipynb": ("reanalysis", 1)}


def test_every_notebook_is_listed_and_stripped():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)
    for path in NOTEBOOKS.glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: outputs in git"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_and_renders(name, tmp_path):
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    folder, figures = EXPECTED[name]
    if folder is not None and (data_dir() is None or not (data_dir() / folder).is_dir()):
        pytest.skip(f"{name} reads ../shared/data/{folder} (GEONP_DATA), which is absent")
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in book.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= figures, f"{name}: {len(images)} figures"
    html, _ = HTMLExporter().from_notebook_node(book)
    (tmp_path / "out.html").write_text(html)
    assert html.count("data:image/png;base64") >= figures
