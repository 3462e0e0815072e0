"""Refresh the rendered notebooks of the documentation: ``python docs/hooks/execute_notebooks.py``.

Runs every ``notebooks/*.ipynb`` top to bottom (as ``tests/test_notebooks.py`` does, with the
shared data of ``$GEONP_DATA`` or ``../shared/data``) and writes the executed copy, outputs and
figures included, to ``docs/notebooks/``. The documentation shows those copies as they are: the
site build never runs a notebook (the three take minutes and two need the shared data).
``tests/test_docs.py`` fails when a copy's cells no longer match its notebook, so rerun this
script after editing a notebook. Pass notebook names to refresh only those.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "notebooks"
RENDERED = ROOT / "docs" / "notebooks"


def execute(name: str) -> Path:
    """Run ``notebooks/<name>`` in its own folder and write the executed copy; returns its path."""
    import nbformat
    from nbclient import NotebookClient

    book = nbformat.read(SOURCE / name, as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(SOURCE)}}).execute()
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        raise SystemExit(f"{name}: a cell raised {errors[0].get('ename')}: {errors[0].get('evalue')}")
    tidy(book)
    RENDERED.mkdir(parents=True, exist_ok=True)
    out = RENDERED / name
    nbformat.write(book, out)
    return out


def tidy(book) -> None:
    """Drop what only describes the machine that ran it: stderr streams (library warnings that
    print local paths) and per-cell execution timings. Results, figures and errors stay."""
    for cell in book.cells:
        cell.get("metadata", {}).pop("execution", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = [o for o in cell["outputs"]
                               if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]


def main(argv: list[str]) -> int:
    names = argv or sorted(p.name for p in SOURCE.glob("*.ipynb"))
    for name in names:
        print(f"{name}: running", flush=True)
        print(f"{name}: wrote {execute(name).relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
