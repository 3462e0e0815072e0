"""Skill tables of ``geonp.evaluate`` results: markdown for people, JSON for everything.

Per dataset, four markdown tables: the main scores (RMSE, MAE, NLL, CRPS, coverage, interval
score, wall time), RMSE by distance to the nearest observed cell, calibration (central 50/90/95%
coverage and the PIT histogram) and 90% coverage by distance. Results written before the
diagnostics existed (no ``rmse_by_distance``, ``pit``, ``coverage_50`` or
``coverage_90_by_distance`` in their rows) still render: a missing value
prints as "–", and a dataset none of whose rows has the diagnostics gets only the main table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geonp.atomic import write_text_atomic
from geonp.metrics import DISTANCE_BINS
from geonp.tasks.clouds import DONOR_CLOUDS, DONOR_GIVEN  # a result's donor codes: synthetic clouds, a given mask

COLUMNS = [("model", "model"), ("fit steps", "fit_steps"), ("RMSE", "rmse"), ("MAE", "mae"), ("NLL", "nll"),
           ("CRPS", "crps"), ("cov50", "coverage_50"), ("cov90", "coverage_90"), ("cov95", "coverage_95"),
           ("IS90", "interval_score_90"), ("wall s", "wall_s"), ("n", "n")]
CALIBRATION = [("cov50", "coverage_50"), ("cov90", "coverage_90"), ("cov95", "coverage_95")]
#: The figures of samples scored as a whole (geonp.sample_scores.cube_sample_scores), each beside its
#: independent-draws twin.
SAMPLE_KEYS = ("energy", "variogram", "patch_cov90", "block_cov90")


def _steps(row: Mapping[str, Any]) -> Any:
    """A row's fine-tuning steps as the table shows them: those the fill took (0 for a model with
    nothing to fine-tune), else, in rows written before that was kept, those asked for; the row's
    ``fit_steps`` (asked) stays its key where pipelines merge runs."""
    return row.get("fit_steps_taken", row.get("fit_steps"))


def write_table(
    results: Sequence[Mapping[str, Any]],
    md_path: str | Path,
    json_path: str | Path | None = None,
    header: str = "",
) -> tuple[Path, Path]:
    """Write ``evaluate`` results as markdown (up to four tables per dataset) and JSON (everything).

    Numbers get 4 significant digits; the best RMSE and CRPS of the main table, and the best RMSE
    of each distance bin, are bold.

    Args:
        results: results of :func:`geonp.evaluate.evaluate`, one per dataset.
        md_path: the markdown file to write.
        json_path: the JSON file, ``{"header", "results"}`` with non-finite numbers as null;
            default ``md_path`` with the suffix ``.json``.
        header: markdown prepended to the tables (e.g. ``pipelines.provenance.header``).

    Returns:
        ``(md_path, json_path)`` as written.
    """
    md_path = Path(md_path)
    json_path = Path(json_path) if json_path is not None else md_path.with_suffix(".json")
    parts = [header.rstrip() + "\n"] if header.strip() else []
    parts += [markdown(res) for res in results]
    write_text_atomic(md_path, "\n".join(parts))
    write_text_atomic(json_path, results_json(header, _plain(list(results))))
    return md_path, json_path


def rows_json(head: Mapping[str, Any], rows: list, key: str = "rows", allow_nan: bool = True) -> str:
    """``{**head, key: rows}`` as JSON text, one item of ``rows`` a line without padding (an item
    with a ``"rows"`` list of its own gets those a line each too): a results table stays small in a
    repository, and a rerun's diff shows the rows that changed. ``rows`` must be a list.

    Raises:
        TypeError: ``rows`` is not a list (a table keyed by model writes its own way).
        ValueError: a non-finite number where ``allow_nan`` is False.
    """
    if not isinstance(rows, list):
        raise TypeError(f"rows_json: rows must be a list, got {type(rows).__name__}")
    return _lines(head, key, rows, allow_nan) + "\n"


def _lines(head: Mapping[str, Any], key: str, rows: list, allow_nan: bool) -> str:
    def compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), allow_nan=allow_nan)

    def item(value: Any) -> str:
        if isinstance(value, dict) and isinstance(value.get("rows"), list):
            return _lines({k: v for k, v in value.items() if k != "rows"}, "rows", value["rows"], allow_nan)
        return compact(value)

    lead = compact(dict(head))[:-1] + ("," if head else "")
    return lead + json.dumps(key) + ":[\n" + ",\n".join(map(item, rows)) + "\n]}"


def results_json(header: str, results: list[dict]) -> str:
    """``{"header", "results"}`` as JSON (:func:`rows_json`, each result's rows a line); non-finite
    numbers are refused (:func:`_plain` makes them null first)."""
    return rows_json({"header": header}, results, key="results", allow_nan=False)


def markdown(res: Mapping[str, Any]) -> str:
    """One dataset's section: a title, what was hidden, the main table and the diagnostics tables."""
    rows = res["rows"]
    # Rows a pipeline kept from earlier runs say which commit produced them.
    columns = COLUMNS + ([("commit", "commit")] if any("commit" in r for r in rows) else [])
    donors = res.get("donors", [])
    real, synthetic = sum(d >= 0 for d in donors), sum(d == DONOR_CLOUDS for d in donors)
    given = sum(d == DONOR_GIVEN for d in donors)
    how = (f"({given} under a given cloud mask)" if given else
           f"({real} real gap patterns of other steps, {synthetic} synthetic clouds)")
    units = f" in {res['units']}" if res.get("units") else ""
    lines = [f"## {res['variable']} · {Path(str(res.get('source', ''))).name}", "",
             f"Hidden: {res['hidden_cells']} cells ({100 * res['hidden_fraction']:.1f}% of the observed) in "
             f"{real + synthetic + given} of {res.get('steps', len(donors))} steps {how}, seed "
             f"{res.get('seed', '?')}. Scores{units} at the hidden cells only; NLL in nats per cell; wall s: "
             "seconds per infill call.", ""]
    lines += _table(columns, [[_steps(row) if key == "fit_steps" else row.get(key) for _, key in columns]
                              for row in rows],
                    bold={columns.index(c) for c in (("RMSE", "rmse"), ("CRPS", "crps"))})
    if any("rmse_by_distance" in r for r in rows) or "hidden_by_distance" in res:
        lines += ["", f"RMSE{units} by distance to the nearest observed cell (cells), same time step; n: hidden "
                  "cells in the bin.", ""]
        counts = res.get("hidden_by_distance", {})
        bins = [(f"{label} (n={counts[label]})" if label in counts else label, label) for label in _bin_labels(res)]
        body = [[row["model"], _steps(row)]
                + [row.get("rmse_by_distance", {}).get(label, {}).get("rmse") for _, label in bins] for row in rows]
        lines += _table([("model", ""), ("fit steps", "")] + bins, body, bold=set(range(2, 2 + len(bins))))
    if any("pit" in r or "coverage_50" in r for r in rows):
        lines += ["", "Calibration: coverage of the central 50/90/95% intervals; PIT counts in 10 equal bins from "
                  "0 to 1 (flat: calibrated; U: too narrow; hump: too wide; slope: biased).", ""]
        body = [[row["model"], _steps(row)] + [row.get(key) for _, key in CALIBRATION]
                + [" ".join(map(str, row["pit"])) if row.get("pit") else None] for row in rows]
        lines += _table([("model", ""), ("fit steps", "")] + CALIBRATION + [("PIT", "")], body)
    if any("coverage_90_by_distance" in r for r in rows):
        lines += ["", "90% interval coverage by distance to the nearest observed cell (cells): where sigma is "
                  "too small (below 0.9) or too large.", ""]
        labels = _bin_labels(res)
        body = [[row["model"], _steps(row)] + [row.get("coverage_90_by_distance", {}).get(label)
                                                         for label in labels] for row in rows]
        lines += _table([("model", ""), ("fit steps", "")] + [(label, "") for label in labels], body)
    if any("samples" in r for r in rows):
        lines += ["", "Samples as a whole (`--samples`): energy and variogram scores (lower is better) and 90% "
                  "coverage of the means of hidden patches and 8x8 blocks (0.90), coherent samples / independent "
                  "per-cell draws of the same mean and sigma; spread: the samples' s.d. over sigma (1).", ""]
        body = [[row["model"]] + [f"{_fmt(s[key])} / {_fmt(s['independent_' + key])}" for key in SAMPLE_KEYS]
                + [s["spread_ratio"]] for row in rows if (s := row.get("samples"))]
        lines += _table([("model", "")] + [(key.replace("_", " "), "") for key in SAMPLE_KEYS] + [("spread", "")],
                        body)
    return "\n".join(lines) + "\n"


def _bin_labels(res: Mapping[str, Any]) -> list[str]:
    """The distance bins a result was scored in: the default ones, unless its counts
    (``hidden_by_distance``) name bins of their own (e.g. ``WIDE_DISTANCE_BINS``)."""
    default = [label for label, _ in DISTANCE_BINS]
    own = list(res.get("hidden_by_distance") or [])
    return own if set(own) - set(default) else default


def _table(columns: Sequence[tuple[str, str]], body: Sequence[Sequence[Any]], bold: Collection[int] = ()) -> list[str]:
    """Markdown lines of a table: titles from ``columns``, one list of values per row.

    In the columns named by ``bold`` (indices) the smallest finite value is bold, when there are at
    least two to compare.
    """
    best = {}
    for j in bold:
        finite = [r[j] for r in body if isinstance(r[j], (int, float, np.number)) and math.isfinite(r[j])]
        best[j] = min(finite) if len(finite) > 1 else None
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|---" + "|---:" * (len(columns) - 1) + "|"]
    for values in body:
        cells = []
        for j, value in enumerate(values):
            text = _fmt(value, 3 if columns[j][1] == "wall_s" else 4)
            cells.append(f"**{text}**" if best.get(j) is not None and value == best[j] else text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.{digits}g}" if math.isfinite(value) else "–"
    return "–" if value is None else str(value)


def _plain(obj: Any) -> Any:
    """``obj`` with numpy types as Python ones and non-finite floats as None (strict JSON)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj
