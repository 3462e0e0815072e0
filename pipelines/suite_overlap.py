"""How much of te-pt-tnp's error the classical fills share: the ceiling of any rule that combines them.

    python -m pipelines.benchmarks.suite --split validation --rows linear kriging dineof te-pt-tnp --cells DIR
    python -m pipelines.suite_overlap --split validation --cells DIR

Issue 53 asks te-pt-tnp for at most 0.92x the RMSE of the better of kriging and DINEOF, and names
per-scene choices or blends of fillers as a way there. Whether any such rule can get there is a
question the suite's hidden cells answer with hindsight, before one is built. Per scene, from the
predictions ``--cells`` kept (:func:`pipelines.benchmarks.suite.save_cells`), against the *other*
(the better of kriging and DINEOF on that scene, by RMSE):

- the Pearson correlation of the two fills' errors at the hidden cells: near 1, both miss the same
  way, and what limits them is what the observed cells say, not the method;
- the best fixed blend ``w * te-pt-tnp + (1 - w) * other`` (``w`` in 0, 0.05, ..., 1, chosen on the
  truth): no rule that blends the two with one weight per scene does better;
- the better of the two in each distance bin (bins of at least :data:`MIN_BIN_CELLS` cells; chosen
  on the truth, te-pt-tnp in smaller bins): no rule that chooses a filler per scene and bin does better.

Both hindsight figures are ceilings, never a method: they use the truth to choose.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from geonp.metrics import distance_bin
from pipelines.benchmarks.suite import BINS
from pipelines.provenance import REPO, header
from pipelines.suite_rule import MIN_BIN_CELLS, geometric_interval
from pipelines.suite_scenes import draw

#: Blend weights tried with hindsight (on te-pt-tnp; the rest on the other fill).
WEIGHTS = np.linspace(0.0, 1.0, 21)
MODEL = "te-pt-tnp"


def _rmse(err: np.ndarray) -> float:
    return float(np.sqrt(np.mean(err**2)))


def overlap(cells: dict[str, np.ndarray], model: str = MODEL) -> dict:
    """One scene's figures from its kept cells (``truth``, ``distance`` and ``LABEL:mean`` per row).

    Returns ``{"other", "hidden", "model_rmse", "other_rmse", "correlation", "blend_weight",
    "blend_rmse", "by_bin_rmse"}``, RMSE in the variable's units; ``other`` is the better of
    kriging and DINEOF by RMSE (the rows the scene has)."""
    truth = np.asarray(cells["truth"], np.float64)
    errors = {label[:-5]: np.asarray(v, np.float64) - truth for label, v in cells.items() if label.endswith(":mean")}
    ok = np.isfinite(truth) & np.all([np.isfinite(e) for e in errors.values()], axis=0)
    errors = {k: e[ok] for k, e in errors.items()}
    others = [k for k in ("kriging", "dineof") if k in errors]
    if model not in errors or not others:
        raise ValueError(f"the cells hold rows {sorted(errors)}; need {model!r} and kriging or dineof")
    other = min(others, key=lambda k: _rmse(errors[k]))
    a, b = errors[model], errors[other]
    blends = [_rmse(w * a + (1 - w) * b) for w in WEIGHTS]
    best = int(np.argmin(blends))
    bins = distance_bin(np.asarray(cells["distance"], np.float64)[ok], BINS)
    chosen = a.copy()
    for i in np.unique(bins):
        here = bins == i
        if here.sum() >= MIN_BIN_CELLS and _rmse(b[here]) < _rmse(a[here]):
            chosen[here] = b[here]
    return {"other": other, "hidden": int(a.size), "model_rmse": _rmse(a), "other_rmse": _rmse(b),
            "correlation": float(np.corrcoef(a, b)[0, 1]), "blend_weight": float(WEIGHTS[best]),
            "blend_rmse": blends[best], "by_bin_rmse": _rmse(chosen)}


def read_cells(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def table(split: str, cells_dir: Path) -> tuple[str, list[dict]]:
    """The markdown body and the per-scene records of the scenes of ``split`` with cells in ``cells_dir``."""
    kinds = {s.name: s.kind for s in draw(split)}
    records = []
    for name, kind in kinds.items():
        path = cells_dir / f"{name.replace('#', '_')}.npz"
        if path.exists():
            records.append({"scene": name, "kind": kind, **overlap(read_cells(path))})
    if not records:
        raise SystemExit(f"--cells {cells_dir}: no scene of the {split} split has cells there")
    lines = ["| scenes | n | te-pt-tnp / other | best blend / other | better per bin / other | "
             "error correlation (median) |", "|---|---:|---|---|---|---:|"]
    for group in ("single", "multi", "all"):
        rs = [r for r in records if group in ("all", r["kind"])]
        if not rs:
            continue
        cols = [geometric_interval([r[k] / r["other_rmse"] for r in rs]) for k in ("model_rmse", "blend_rmse",
                                                                                  "by_bin_rmse")]
        shown = " | ".join(f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in cols)
        name = "every scene" if group == "all" else f"{group}-date"
        lines.append(f"| {name} | {len(rs)} | {shown} | {np.median([r['correlation'] for r in rs]):.3f} |")
    lines += ["", "| scene | kind | hidden cells | other | te-pt-tnp RMSE | other RMSE | error correlation | "
              "best blend weight | best blend / te-pt-tnp | better per bin / te-pt-tnp |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['scene']} | {r['kind']} | {r['hidden']} | {r['other']} | {r['model_rmse']:.4g} | "
                     f"{r['other_rmse']:.4g} | {r['correlation']:.3f} | {r['blend_weight']:.2f} | "
                     f"{r['blend_rmse'] / r['model_rmse']:.3f} | {r['by_bin_rmse'] / r['model_rmse']:.3f} |")
    return "\n".join(lines), records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("validation", "test"), required=True)
    parser.add_argument("--cells", required=True, metavar="DIR", help="the suite's --cells folder")
    parser.add_argument("--made-by", default=None, metavar="TEXT",
                        help="the suite runs that wrote the cells (commands and commits), for the header")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    body, records = table(args.split, Path(args.cells))
    out = Path(args.out or REPO / "pipelines" / "results" / f"suite_overlap_{args.split}.md")
    text = header(f"te-pt-tnp's errors beside kriging's and DINEOF's ({args.split} split)", torch.device("cpu"),
                  "none: an analysis of the hidden cells and predictions the suite's rows kept (bundled weights, "
                  "defaults); the blend weight and the per-bin choice are taken with hindsight, as ceilings",
                  {"cells": args.made_by} if args.made_by else None)
    intro = ("Per scene the *other* is the better of kriging and DINEOF by RMSE. Ratios are geometric means over "
             "scenes with 95% intervals from resampling scenes. A best blend or per-bin choice near te-pt-tnp's own "
             "ratio means no rule combining the two fills can do much better there.")
    out.write_text(f"{text}\n{intro}\n\n{body}\n")
    out.with_suffix(".json").write_text(json.dumps({"header": text, "split": args.split, "rows": records}, indent=0)
                                        + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
