"""A day under another day's clouds, the rest of the stack as context: the multi-date products.

    python -m pipelines.benchmarks.history_cv --split validation                  # every scene, default rows
    python -m pipelines.benchmarks.history_cv --split test --rows linear dineof   # some rows
    python -m pipelines.benchmarks.history_cv --split test --reuse --rows te-pt-tnp+dineof@30

The shared data's five multi-date products (Alboran SST, OLCI chlorophyll, Sentinel-2 NDVI, MODIS
NDVI Alaska, ESA CCI soil moisture). In each stack the steps of one split have their observed
cells hidden under another step's real gaps (``geonp.evaluate`` with ``hide_steps``); every other
step stays whole, the history a model may use. ``validation`` hides steps 0, 3, 6, ... and is
where variants are chosen; ``test`` hides steps 1, 4, 7, ... and is reported once per variant.
OLCI's box has water on three of its five scenes only: there every step is hidden (under half of
its cells) and the split is by place, a validation crop north of the test crop.

A row is ``MODEL[+COVARIATE...][@FIT_STEPS]``, or a label given weights with ``--checkpoint
LABEL=PATH`` or inference-only changes of the bundled te-pt-tnp with ``--variant LABEL=JSON``
(``{"covariates": [...], "model_args": {...}, "window": {...}}``; ``"covariates": []``: the same weights
without a history drift): ``te-pt-tnp+dineof@30`` is the bundled
te-pt-tnp weights with the ``dineof`` history covariate in its kriging head's drift
(``geonp.tasks.history.history_covariates``), fine-tuned 30 steps on the scene. The covariate
checkpoints are made here from the bundled weights (the drift adds no weight). ``--calibrated
LABEL`` runs that label's rows with sigma calibrated on the scene (``geonp.fill.calibrate``);
``--nugget LABEL=CHOICE`` gives a variant whose kriging head takes the scene's nugget infill's
``nugget`` option (``geonp.fill.nugget``: ``auto``, the default since it exists, ``scene`` or
``model``; rows before it, such as ``small-nugget``'s, always took the scene's).
Writes ``pipelines/results/history_cv_<split>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch
import xarray as xr

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.fill.options import NUGGET_CHOICES
from geonp.fill.predictor import bundled_checkpoint
from geonp.skill_table import write_table
from pipelines.checkpoint_variants import bundled_variants, variant_checkpoint
from pipelines.products import alaska_ndvi, esacci_soil_moisture
from pipelines.provenance import REPO, git_commit, header
from pipelines.scene_tables import earlier_results, keep_earlier

ROWS = ["linear", "kriging", "dineof", "te-pt-tnp", "te-pt-tnp+dineof", "te-pt-tnp+nearest_steps",
        "te-pt-tnp+dineof+nearest_steps"]
def _olci(folder: Path, split: str) -> xr.Dataset:
    """OLCI chlorophyll in the box the bundled weights never trained on: three of its five scenes hold
    water cells there (the others are cloud), too few to split by step, so the split is by place."""
    rows = slice(620, 820) if split == "validation" else slice(420, 620)
    return open_satellite(folder / "satellite/olci_chl_north_sea_2017-01.zarr", "conc_chl").isel(
        lat=rows, lon=slice(1100, 1400))


#: name -> (variable, how to open the stack for a split, whether the split is by place (every step hidden)).
SCENES = {
    "alboran": ("SST", lambda f, s: open_satellite(f / "satellite/alboran_sst_avhrr_2017-05.nc", "SST",
                                                   valid_mask="mask"), False),
    "olci": ("conc_chl", _olci, True),
    "s2ndvi": ("ndvi", lambda f, s: open_satellite(f / "satellite/eolearn_s2_ndvi_slovenia_2015-2017.nc", "ndvi"),
               False),
    "alaska": ("ndvi", lambda f, s: alaska_ndvi(f), False),
    "soil_moisture": ("sm", lambda f, s: esacci_soil_moisture(f), False),
}


def parse_row(row: str) -> tuple[str, list[str], int]:
    """``te-pt-tnp+dineof@30`` -> ``("te-pt-tnp", ["dineof"], 30)``."""
    name, _, steps = row.partition("@")
    model, *covariates = name.split("+")
    return model, covariates, int(steps or 0)


def covariate_checkpoint(model: str, covariates: list[str], folder: Path) -> Path:
    """The bundled weights of ``model`` with ``covariates`` in the kriging head's drift."""
    out = folder / f"{model}+{'+'.join(covariates)}.safetensors"
    return variant_checkpoint(bundled_checkpoint(model), out, covariates=covariates)


def _crop(ds: xr.Dataset) -> str:
    return ", ".join(f"{d} {float(ds[d].min()):.3f}..{float(ds[d].max()):.3f}" for d in ("lat", "lon"))


def split_steps(n_steps: int, split: str) -> list[int]:
    return list(range(0 if split == "validation" else 1, n_steps, 3))


def with_earlier(results: list[dict], earlier: dict[str, dict]) -> list[dict]:
    """The scenes run now and, with ``--reuse``, the earlier table's scenes not run now (``earlier``:
    results by source), in :data:`SCENES` order: ``--scenes`` narrows a run, not the table."""
    def scene(res: dict) -> str:
        return res["source"].split(":")[0]

    ran = {scene(res) for res in results}
    kept = results + [res for res in earlier.values() if scene(res) not in ran]
    names = list(SCENES)
    return sorted(kept, key=lambda res: names.index(scene(res)) if scene(res) in names else len(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=["validation", "test"], required=True)
    parser.add_argument("--scenes", nargs="*", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--rows", nargs="*", default=ROWS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="keep the earlier table's rows not run now")
    parser.add_argument("--chosen", default=None, metavar="LABEL@FIT",
                        help="the te-pt-tnp row chosen on the validation split, which the goals table reports")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="LABEL=PATH",
                        help="a row LABEL[@FIT] scores te-pt-tnp with these weights (e.g. a trained variant)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                        help='a row LABEL[@FIT] scores the bundled te-pt-tnp changed at inference only: '
                             '{"covariates": [...], "model_args": {...}, "window": {...}}')
    parser.add_argument("--calibrated", nargs="*", default=[], metavar="LABEL",
                        help="rows LABEL[@FIT] run with sigma calibrated on the scene (infill's calibrate_sigma)")
    parser.add_argument("--nugget", action="append", default=[], metavar="LABEL=CHOICE",
                        help="rows LABEL[@FIT] run with infill's nugget option CHOICE (auto, scene, model)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or REPO / "pipelines" / "results" / f"history_cv_{args.split}.md")
    earlier = earlier_results(out.with_suffix(".json")) if args.reuse else {}
    folder, commit = data_folder(), git_commit()
    trained = dict(item.split("=", 1) for item in args.checkpoint)
    nuggets = dict(item.split("=", 1) for item in args.nugget if "=" in item)
    bad = [item for item in args.nugget if item.partition("=")[2] not in NUGGET_CHOICES]
    if bad:
        parser.error(f"--nugget {bad[0]}: give LABEL=CHOICE, CHOICE one of {', '.join(NUGGET_CHOICES)}")
    results: list[dict] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        trained.update(bundled_variants(args.variant, Path(tmp)))
        for name in args.scenes:
            variable, opener, by_place = SCENES[name]
            ds = opener(folder, args.split)
            steps = list(range(ds.sizes["time"])) if by_place else split_steps(ds.sizes["time"], args.split)
            res = None
            for row in args.rows:
                model, covariates, fit = parse_row(row)
                checkpoints = {model: str(covariate_checkpoint(model, covariates, Path(tmp)))} if covariates else None
                if row.partition("@")[0] in trained:
                    model, checkpoints = "te-pt-tnp", {"te-pt-tnp": trained[row.partition("@")[0]]}
                options = {"device": "auto", "calibrate_sigma": row.partition("@")[0] in args.calibrated}
                if row.partition("@")[0] in nuggets:
                    options["nugget"] = nuggets[row.partition("@")[0]]
                try:
                    part = evaluate(ds, variable, [model], checkpoints=checkpoints, fit_steps=fit, seed=args.seed,
                                    options=options, hide_steps=steps)
                except ValueError as err:  # e.g. dineof on a stack with too short a history: say so, go on
                    print(f"{name} {row}: not scored: {err}", flush=True)
                    skipped.append(f"{name} {row}: {err}")
                    continue
                for r in part["rows"]:
                    r.update(model=row.partition("@")[0], commit=commit, checkpoint=None)
                if res is None:
                    res = part
                else:
                    res["rows"] += part["rows"]
                r = part["rows"][0]
                print(f"{name} {row}: RMSE {r['rmse']:.4g} CRPS {r['crps']:.4g} cov90 {r['coverage_90']:.3f} "
                      f"({r['wall_s']:.0f} s)" + (f"; nugget {r['nugget']}" if "nugget" in r else ""), flush=True)
            if res is None:
                continue
            where = f"{args.split} crop {_crop(ds)}" if by_place else \
                f"{args.split} steps {steps[:4]}{'...' if len(steps) > 4 else ''}"
            res["source"] = f"{name}: {variable}, {where}"
            if res["source"] in earlier:
                keep_earlier(res, earlier[res["source"]], name)
            results.append(res)
    results = with_earlier(results, earlier)
    order = {m: i for i, m in enumerate(ROWS)}
    for res in results:
        res["rows"].sort(key=lambda r: (order.get(r["model"], len(order)), r["fit_steps"]))
    text = header(f"History cross-validation ({args.split} split): a day under another day's clouds",
                  resolve_device("auto"), BUDGET)
    notes = "".join(f"- not scored: {s}\n" for s in skipped)
    write_table(results, out, header=text + "\n" + summary(results, args.chosen) + ("\n" + notes if notes else ""))
    print(out.read_text())


BUDGET = ("bundled weights (te-pt-tnp: covariates added to the kriging drift, no weight changed), fine-tuned "
          "on the scene for a row's fit steps; the hidden steps' cells under other steps' real gaps, at most half "
          "of a step's observed cells; a row's commit is the run that produced it")


def _best(rows: list[dict], wanted) -> dict | None:
    """The row of lowest RMSE among those whose model name ``wanted`` accepts."""
    return min((r for r in rows if wanted(r["model"])), key=lambda r: r["rmse"], default=None)


def summary(results: list[dict], chosen: str | None = None) -> str:
    """Per scene, the issue's goals: a te-pt-tnp row against linear, kriging and dineof. ``chosen``
    (``LABEL@FIT``, the variant picked on the validation split) names the row; without it, the
    best te-pt-tnp row of this split (fine for choosing on validation, never for reporting a test)."""
    what = f"`{chosen}` (chosen on the validation split)" if chosen else "the best te-pt-tnp row of this split"
    lines = ["| scene | te-pt-tnp row | RMSE / linear | RMSE / best of kriging, dineof | CRPS / best of "
             "kriging, dineof | >12 cells RMSE / linear | 90% coverage by distance |",
             "|---|---|---:|---:|---:|---:|---|"]
    label, _, fit = (chosen or "").partition("@")
    for res in results:
        rows = res["rows"]
        if chosen:
            ours = next((r for r in rows if r["model"] == label and r["fit_steps"] == int(fit or 0)), None)
        else:
            ours = _best(rows, lambda m: m not in ("linear", "kriging", "dineof"))
        lin = _best(rows, lambda m: m == "linear")
        others = [r for r in (_best(rows, lambda m, k=k: m == k) for k in ("kriging", "dineof")) if r]
        if ours is None or lin is None or not others:
            continue
        best_rmse, best_crps = min(r["rmse"] for r in others), min(r["crps"] for r in others)
        far = lambda r: (r.get("rmse_by_distance") or {}).get(">12", {}).get("rmse")  # noqa: E731
        ratio = f"{far(ours) / far(lin):.2f}" if all(math.isfinite(far(r) or math.nan) for r in (ours, lin)) else "–"
        cover = " / ".join(f"{v:.2f}" if v is not None and math.isfinite(v) else "–"
                           for v in (ours.get("coverage_90_by_distance") or {}).values())
        lines.append(f"| {res['source'].split(':')[0]} | {ours['model']} @{ours['fit_steps']} | "
                     f"{ours['rmse'] / lin['rmse']:.2f} | {ours['rmse'] / best_rmse:.2f} | "
                     f"{ours['crps'] / best_crps:.2f} | {ratio} | {cover or '–'} |")
    return (f"Goals (issue: history and the large scale), for {what}: RMSE <= 0.8x linear and <= 0.9x the best "
            "of kriging and dineof, CRPS below both, >12 cells RMSE <= linear's, 90% coverage 0.85-0.95 in "
            "every distance bin (1, 2-3, 4-6, 7-12, >12 cells).\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
