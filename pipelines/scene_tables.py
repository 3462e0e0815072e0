"""Tables of scenes read back: the rows of an earlier run of satellite_cv, history_cv or
wide_clouds that a rerun with ``--reuse`` (or a ``--merge``) keeps beside its own."""

from __future__ import annotations

import json
import re
from pathlib import Path


def earlier_results(path: Path) -> dict[str, dict]:
    """Results of an earlier run by source; rows that predate the commit column get the table's commit."""
    if not path.exists():
        raise SystemExit(f"{path}: no earlier table to take rows from")
    commit = header_field(path, "commit", "unknown")
    out = {}
    for res in json.loads(path.read_text())["results"]:
        for row in res["rows"]:
            row.setdefault("commit", commit)
        out[res["source"]] = res
    return out


def header_field(path: Path, key: str, missing: str = "unrecorded") -> str:
    """The value of the ``- key: value`` line of a results table's provenance header, else ``missing``."""
    found = re.search(rf"^- {key}: (.+)$", json.loads(path.read_text()).get("header", ""), re.MULTILINE)
    return found.group(1).strip() if found else missing


def keep_earlier(res: dict, old: dict, name: str) -> None:
    """Add to ``res`` the rows of ``old`` (same scene) for (model, fit steps) not run now.

    Rows from tables older than the diagnostics lack them and print "–" there; the hidden cells'
    counts by distance are the same for both (same cells), so ``res`` takes ``old``'s if it has none.
    """
    same_cells(res, old, name)
    ran = {(r["model"], r["fit_steps"]) for r in res["rows"]}
    res["rows"] += [r for r in old["rows"] if (r["model"], r["fit_steps"]) not in ran]
    if "hidden_by_distance" in old:
        res.setdefault("hidden_by_distance", old["hidden_by_distance"])


def same_cells(a: dict, b: dict, name: str) -> None:
    """Stop (one line) unless two runs of scene ``name`` hid the same cells (seed, donors, count)."""
    if (a["seed"], a["donors"], a["hidden_cells"]) != (b["seed"], b["donors"], b["hidden_cells"]):
        raise SystemExit(f"{name}: rows to combine hid different cells (seed, donors or count differ); "
                         "rerun every model without --reuse")
