"""Does a model trained with `geonp train` on the README's ERA5 config fill another region's gaps?

    python -m pipelines.benchmarks.era5_transfer_infill                                  # the committed weights
    python -m pipelines.benchmarks.era5_transfer_infill --checkpoint runs/te_pt_tnp_era5_uk/model.safetensors

The README's ERA5 config (``pipelines/configs/te_pt_tnp_era5_uk.yaml``) trains te-pt-tnp on
ERA5 2 m temperature over the northern UK (54-58 N, 1-20 March 2019) with elevation as an input.
Its checkpoint is used here exactly as a user would use it, through :func:`geonp.evaluate.evaluate`
(the engine of ``geonp evaluate --checkpoint ... --elevation ...``): cells are hidden under
random clouds in three places the training never saw, filled, and scored against the truth.

* ``uk_south``: the southern UK (50-53.75 N), 5-6 March 2019 hourly (48 steps): the same days
  in another region, the TE-TNP paper's region-transfer split;
* ``iberia_mediterranean``: ERA5 at 30-50 N, 10 W-40 E on 2017-01-01 12 UTC, one scene: another
  region, season and year;
* ``usa``: ERA5 over the contiguous USA on 1995-07-14 12 UTC, one scene: another continent.

Rows: ``linear`` and ``kriging`` (no weights), the bundled te-pt-tnp (no elevation) and the ERA5
checkpoint with elevation, without fine-tuning and after 30 fine-tuning steps on the scene's
own observed cells. Every row of a case scores the very same hidden cells (one seed). The goal
(issue: one task world): the ERA5 checkpoint's RMSE within 1.5x linear's on every case.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from geonp.data.cube import open_cube
from geonp.data.readers import data_folder
from geonp.data.regions import crop_to_region, get_region, select_time
from geonp.evaluate import evaluate
from geonp.skill_table import write_table
from pipelines.provenance import REPO, header

#: The committed weights of the README's ERA5 config (see pipelines/weights/README.md).
WEIGHTS = REPO / "pipelines" / "weights" / "te-pt-tnp-era5-uk.safetensors"
DEM = "elevation/era5_orography_0p25.nc"
#: name: (file under the data folder, variable, region [S, N, W, E] or None, time [first, last] or None)
CASES: dict[str, tuple[str, str, list[float] | None, list[str] | None]] = {
    "uk_south": ("era5/era5_t2m_uk_2019-03_hourly.nc", "t2m", [50.0, 53.75, -10.0, 2.0],
                 ["2019-03-05T00", "2019-03-06T23"]),
    "iberia_mediterranean": ("era5/era5_t2m_europe_2017-01-01T12.nc", "t2m", [30.0, 50.0, -10.0, 40.0], None),
    "usa": ("era5/era5_usa_1995-07-14T12.nc", "t2m", None, None),
}
#: Goal: the ERA5 checkpoint's RMSE at most this many times linear's.
GOAL = 1.5
RESULTS = REPO / "pipelines" / "results" / "era5_transfer_infill.md"


def rows(checkpoint: str, fit_steps: int) -> list[tuple[str, str, str | None, int]]:
    """``(label, model, checkpoint, fit steps)`` of every row."""
    return [("linear", "linear", None, 0), ("kriging", "kriging", None, 0),
            ("te-pt-tnp bundled (no elevation)", "te-pt-tnp", None, 0),
            ("te-pt-tnp ERA5 UK", "te-pt-tnp", checkpoint, 0),
            (f"te-pt-tnp ERA5 UK @{fit_steps}", "te-pt-tnp", checkpoint, fit_steps)]


def run_case(name: str, checkpoint: str, fit_steps: int, seed: int) -> dict[str, Any]:
    """One case's :func:`evaluate` result with every row (their ``model`` is the row's label)."""
    path, variable, region, time = CASES[name]
    folder = data_folder()
    ds = open_cube(folder / path, [variable])
    if region is not None:
        ds = crop_to_region(ds, get_region(region))
    if time is not None:
        ds = select_time(ds, time, name)
    merged: dict[str, Any] | None = None
    for label, model, ckpt, steps in rows(checkpoint, fit_steps):
        res = evaluate(ds, variable, [model], checkpoints={model: ckpt} if ckpt else None, fit_steps=steps,
                       seed=seed, options={"device": "cpu"}, elevation=str(folder / DEM) if ckpt else None)
        row = {**res["rows"][0], "model": label}
        print(f"{name} {label}: RMSE {row['rmse']:.4g} CRPS {row['crps']:.4g} cov90 {row['coverage_90']:.3f} "
              f"({row['wall_s']:.0f} s)", flush=True)
        if merged is None:
            merged = {**res, "source": f"{name}: {path}", "rows": []}
        merged["rows"].append(row)
    assert merged is not None
    return merged


def summary(results: list[dict[str, Any]], fit_steps: int) -> str:
    """The goal table: each ERA5 row's RMSE over linear's, per case."""
    lines = ["", f"Goal: the ERA5 checkpoint's RMSE <= {GOAL}x linear's on every case.", "",
             "| case | hidden cells | linear RMSE | ERA5 UK / linear | ERA5 UK @"
             f"{fit_steps} / linear | bundled / linear | kriging / linear |", "|---|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        by = {r["model"]: r["rmse"] for r in res["rows"]}
        labels = ("te-pt-tnp ERA5 UK", f"te-pt-tnp ERA5 UK @{fit_steps}", "te-pt-tnp bundled (no elevation)", "kriging")
        ratios = " | ".join(f"{by[label] / by['linear']:.2f}" for label in labels)
        lines.append(f"| {res['source'].split(':')[0]} | {res['hidden_cells']} | {by['linear']:.4g} | {ratios} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default=str(WEIGHTS), help="weights of the README's ERA5 config")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--fit-steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [run_case(name, args.checkpoint, args.fit_steps, args.seed) for name in args.cases]
    from geonp.checkpoint import read_checkpoint

    meta = read_checkpoint(args.checkpoint)[1]
    where = Path(args.checkpoint).resolve()
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    budget = (f"{shown} ({meta.get('step', '?')} steps, val NLL {float(meta.get('val_nll', 'nan')):.4f}); "
              f"fine-tuning {args.fit_steps} steps; seed {args.seed}")
    head = header("ERA5 region transfer through geonp infill --checkpoint", torch.device("cpu"), budget)
    out = Path(args.out)
    write_table(results, out, out.with_suffix(".json"), header=head + summary(results, args.fit_steps))
    print(json.dumps({r["source"]: {row["model"]: round(row["rmse"], 4) for row in r["rows"]} for r in results}))


if __name__ == "__main__":
    main()
