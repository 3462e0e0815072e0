"""Where is the whole-scene ``kriging`` behind ``linear``? Step by step on a history benchmark scene.

    python -m pipelines.experiments.kriging_by_step                      # Alaska NDVI, validation split
    python -m pipelines.experiments.kriging_by_step --scene s2ndvi --split test

The history benchmark (``pipelines.benchmarks.history_cv``) hides the split's steps under other
steps' real gaps; this hides the same cells (same seed), fills them with ``linear`` and
``kriging`` through infill, and scores each hidden step on its own. For each step it then refits
the step's variogram (:func:`geonp.variogram.fit_grid_variogram`, the baseline's own fit)
and kriges the same cells with PyKrige from every observed cell of the step, ordinary and
universal (a regional linear drift in row and column), per variogram family: whether a trend or
another family would have closed a gap to ``linear``. Global PyKrige systems grow with the
observed cells squared, so steps with more than ``--max-points`` observed cells are scored by
infill only. Writes ``pipelines/results/kriging_by_step_<scene>_<split>.md``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import torch

from geonp.data.readers import data_folder
from geonp.evaluate import _engine, evaluate
from geonp.models.field_kriging import BOUNDED_MODELS
from geonp.variogram import MIN_SCENE_POINTS, fit_grid_variogram
from pipelines.benchmarks.history_cv import SCENES, split_steps
from pipelines.provenance import REPO, header


def _rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - truth) ** 2)))


def pykrige_fill(values: np.ndarray, cells: np.ndarray, family: str, trend: bool) -> np.ndarray | None:
    """PyKrige's ordinary (``trend`` False) or universal kriging (regional linear drift) of the
    observed cells of ``values [R, C]`` at ``cells [M, 2]`` (row, col), the variogram fitted as
    the ``kriging`` baseline fits it, to the (detrended, when ``trend``) standardised scene.
    None where the baseline would not fit a variogram of its own either (fewer than
    ``MIN_SCENE_POINTS`` observed cells, a constant scene, fewer than three lags)."""
    from pykrige.ok import OrdinaryKriging
    from pykrige.uk import UniversalKriging

    pts = np.argwhere(np.isfinite(values)).astype(np.float64)
    z = values[np.isfinite(values)]
    if len(z) < MIN_SCENE_POINTS or z.std() == 0:
        return None
    centre, scale = z.mean(), z.std()
    zs = (z - centre) / scale
    fit = zs
    if trend:  # the variogram of the residuals from the plane the drift will take out
        design = np.c_[np.ones(len(pts)), pts]
        fit = zs - design @ np.linalg.lstsq(design, zs, rcond=None)[0]
    grid = np.full(values.shape, np.nan)
    grid[np.isfinite(values)] = fit
    params = fit_grid_variogram(grid, family)
    if params is None:
        return None
    psill, rng, nugget = params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = dict(variogram_model=family, variogram_parameters={"psill": psill, "range": rng, "nugget": nugget})
        if trend:
            krig = UniversalKriging(pts[:, 1], pts[:, 0], zs, drift_terms=["regional_linear"], **args)
        else:
            krig = OrdinaryKriging(pts[:, 1], pts[:, 0], zs, **args)
        pred, _ = krig.execute("points", cells[:, 1].astype(float), cells[:, 0].astype(float))
    return centre + scale * np.asarray(pred)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scene", default="alaska", choices=[s for s, (_, _, by_place) in SCENES.items()
                                                               if not by_place])
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-points", type=int, default=3000)
    args = parser.parse_args()
    variable, opener, _ = SCENES[args.scene]
    ds = opener(data_folder(), args.split)
    steps = split_steps(ds.sizes["time"], args.split)
    filled: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def keep(masked, var, model, **kw):
        out = _engine([model])(masked, var, model, **kw)
        filled[model] = (masked[var].values, out[var].values)
        return out

    evaluate(ds, variable, ["linear", "kriging"], infill_fn=keep, hide_steps=steps, seed=args.seed)
    truth, valid = ds[variable].values, np.broadcast_to(np.asarray(ds["valid"].values, bool), ds[variable].shape)
    variants = [f"{'universal' if t else 'ordinary'} {f}" for t in (False, True) for f in BOUNDED_MODELS]
    lines = ["| step | observed | hidden | linear | kriging | " + " | ".join(variants) + " |",
             "|---:|---:|---:|---:|---:|" + "---:|" * len(variants)]
    for t in steps:
        masked = np.where(valid[t], filled["linear"][0][t], np.nan)
        hidden = np.isnan(masked) & np.isfinite(truth[t]) & valid[t] & np.isfinite(filled["linear"][1][t])
        if not hidden.any():
            continue
        cells, want = np.argwhere(hidden), truth[t][hidden]
        row = [str(t), str(int(np.isfinite(masked).sum())), str(int(hidden.sum()))]
        row += [f"{_rmse(filled[m][1][t][hidden], want):.4g}" for m in ("linear", "kriging")]
        small = np.isfinite(masked).sum() <= args.max_points
        for trend in (False, True):
            for family in BOUNDED_MODELS:
                pred = pykrige_fill(masked, cells, family, trend) if small else None
                row.append("–" if pred is None else f"{_rmse(pred, want):.4g}")
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    out = REPO / "pipelines" / "results" / f"kriging_by_step_{args.scene}_{args.split}.md"
    budget = (f"{args.scene} {variable}, {args.split} steps hidden as the history benchmark hides them (seed "
              f"{args.seed}); RMSE at each step's hidden cells; PyKrige columns krige from every observed cell")
    title = f"Kriging against linear, step by step ({args.scene}, {args.split} split)"
    text = header(title, torch.device("cpu"), budget)
    Path(out).write_text(text + "\n" + "\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
