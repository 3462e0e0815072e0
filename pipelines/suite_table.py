"""The scene suite's JSON tables on disk: one writer, one reader, block layouts stored once per scene.

Every row of a suite table carries per-block sums for the rule's bootstrap (``pipelines.suite_rule``):
per (block, distance bin) the block id ``block``, the bin ``bin``, the cells scored ``n`` and the sums
``sse``, ``crps``, ``in90``. The first three (the *layout*) depend only on the scene's hidden cells, so
they are the same for every row of a scene that predicted every cell; on disk the table keeps each
scene's layout once, under ``"layouts"``, and such rows keep only their sums. A row whose layout
differs (a model that left cells unscored) keeps its own in full. :func:`read` gives the rows back
with their whole ``blocks``, so no reader sees the difference; a table written before layouts were
shared (no ``"layouts"`` key) reads as it is. A row's own figures (RMSE, CRPS, coverage, their
values by distance, wall seconds) are stored to :data:`FIGURES` significant digits, as the block
sums are (:func:`rounded`, for both): 17 digits of float noise were a tenth of the validation table.
A row's figures by distance (``rmse_by_distance``, ``n_by_distance``, ``cov90_by_distance``) follow
from its block sums; each is left off the disk where :func:`by_distance` of the stored sums gives it
back to the digit (always for the counts and coverage, for RMSE on most rows: the sums' rounding can
move its sixth digit), and :func:`read` puts it back from the bin labels the table records
(``"bins"``), so reading a table needs no torch.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

LAYOUT = ("block", "bin", "n")  # a block sum's keys that depend only on the scene's hidden cells
FIGURES = 6  # significant digits of the block sums and of a row's own figures on disk
BY_DISTANCE = ("rmse_by_distance", "n_by_distance", "cov90_by_distance")  # derivable from a row's blocks


def rounded(value):
    """``value`` with its floats (and the floats of a dict of them) to :data:`FIGURES` significant digits."""
    if isinstance(value, float):  # numpy's float64 sums are floats too
        return float(f"{value:.{FIGURES}g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def bin_labels() -> list[str]:
    """The suite's distance bins (``geonp.metrics.WIDE_DISTANCE_BINS``' labels), which :func:`write`
    records in the table, so reading one (``pipelines.suite_rule``) needs no torch."""
    from geonp.metrics import WIDE_DISTANCE_BINS  # imports torch: only where a table is written

    return [label for label, _ in WIDE_DISTANCE_BINS]


def by_distance(blocks: dict, labels: list[str]) -> dict[str, dict]:
    """A row's RMSE, cells scored and 90% coverage per distance bin (a block's ``bin`` indexes
    ``labels``; an empty bin's figures are ``None``), from its whole ``blocks`` (the suite's
    ``block_stats``)."""
    n, sse, in90 = ([0] * len(labels) for _ in range(3))
    for b, count, err, inside in zip(blocks["bin"], blocks["n"], blocks["sse"], blocks["in90"]):
        n[b] += count
        sse[b] += err
        in90[b] += inside
    return {"rmse_by_distance": {k: rounded(math.sqrt(sse[i] / n[i])) if n[i] else None for i, k in enumerate(labels)},
            "n_by_distance": dict(zip(labels, n)),
            "cov90_by_distance": {k: rounded(in90[i] / n[i]) if n[i] else None for i, k in enumerate(labels)}}


def _drop_derivable(row: dict, labels: list[str]) -> dict:
    """``row`` without the figures by distance that :func:`by_distance` of its blocks gives back exactly;
    a scored row that has none of its own says so with ``null`` (read back as absent, not derived)."""
    if "blocks" not in row or "rmse" not in row:
        return row
    derived = by_distance(row["blocks"], labels)
    return {**{k: None for k in BY_DISTANCE if k not in row},
            **{k: v for k, v in row.items() if k not in BY_DISTANCE or v != derived[k]}}


def _restore_derivable(row: dict, labels: list[str]) -> dict:
    """A scored ``row`` (its blocks whole) with the figures by distance that :func:`_drop_derivable` left
    off, where a row holds them (after ``nll``, as the suite writes them: a rewrite keeps each line), and
    without those it marked absent."""
    if "blocks" not in row or "rmse" not in row:  # only a scored row had them
        return row
    derived = by_distance(row["blocks"], labels)
    figures = {k: row.get(k, derived[k]) for k in BY_DISTANCE}
    out: dict = {}
    for key, value in row.items():
        if key in BY_DISTANCE:
            continue
        out[key] = value
        if key == "nll":
            out.update(figures)
    if "nll" not in row:
        out.update(figures)
    return {k: v for k, v in out.items() if not (k in BY_DISTANCE and v is None)}


def _key(blocks: dict) -> tuple:
    return tuple(tuple(blocks[k]) for k in LAYOUT)


def pack(rows: list[dict]) -> tuple[dict[str, dict], list[dict]]:
    """``(layouts, rows)``: each scene's most common block layout, and the rows with it taken out of
    their ``blocks`` where it is the scene's (the rows given are not changed)."""
    counts: dict[str, Counter] = {}
    for r in rows:
        if "blocks" in r:
            counts.setdefault(r["scene"], Counter())[_key(r["blocks"])] += 1
    layouts = {s: dict(zip(LAYOUT, map(list, c.most_common(1)[0][0]))) for s, c in counts.items()}
    packed = []
    for r in rows:
        b = r.get("blocks")
        if b is not None and _key(b) == _key(layouts[r["scene"]]):
            r = {**r, "blocks": {k: v for k, v in b.items() if k not in LAYOUT}}
        packed.append(r)
    return layouts, packed


def unpack(layouts: dict[str, dict], rows: list[dict]) -> list[dict]:
    """The rows with every ``blocks`` whole again (a row without ``block`` ids takes its scene's layout)."""
    return [{**r, "blocks": {**layouts[r["scene"]], **r["blocks"]}}
            if "blocks" in r and "block" not in r["blocks"] else r for r in rows]


def write(path: Path, text: str, split: str, scenes: list[dict], rows: list[dict]) -> None:
    """The table's JSON: header, split, scene records, layouts and rows, one scene, layout or row a
    line (diffs of a rerun stay readable)."""
    labels = bin_labels()
    layouts, rows = pack([_drop_derivable({k: v if k == "blocks" else rounded(v) for k, v in r.items()}, labels)
                          for r in rows])
    def lines(items):
        return ",\n".join(json.dumps(x, separators=(",", ":"), allow_nan=False) for x in items)
    layout_lines = ",\n".join(f"{json.dumps(s)}:{json.dumps(v, separators=(',', ':'))}" for s, v in layouts.items())
    head = json.dumps({"header": text, "split": split, "bins": labels})[:-1]
    path.write_text(head + ',\n"scenes":[\n' + lines(scenes) + '\n],\n"layouts":{\n' + layout_lines
                    + '\n},\n"rows":[\n' + lines(rows) + "\n]}\n")


def read(path: Path) -> dict:
    """The table at ``path``: ``{"header", "split", "scenes", "rows"}``, every row's ``blocks`` whole and
    its figures by distance back (a table written before they were left off has no ``bins`` and
    keeps every row as stored)."""
    table = json.loads(path.read_text())
    rows = unpack(table.pop("layouts", {}), table["rows"])
    labels = table.pop("bins", None)
    table["rows"] = rows if labels is None else [_restore_derivable(r, labels) for r in rows]
    return table
