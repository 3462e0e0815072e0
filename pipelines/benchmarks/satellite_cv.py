"""Artificial-gap cross-validation on the real satellite scenes in ../shared/data.

    python -m pipelines.benchmarks.satellite_cv                          # all scenes, default models
    python -m pipelines.benchmarks.satellite_cv --models linear kriging  # a subset
    python -m pipelines.benchmarks.satellite_cv --scenes alboran --fit-steps 30
    python -m pipelines.benchmarks.satellite_cv --fine-tune te-pt-tnp --fine-tune-steps 200  # extra rows
    python -m pipelines.benchmarks.satellite_cv --reuse --models te-pt-tnp  # rerun one model, keep the rest
    python -m pipelines.benchmarks.satellite_cv --merge a.json b.json       # combine runs (e.g. CPU and GPU)

Each scene's observed cells are hidden under the real cloud pattern of another day (one scene:
synthetic clouds), every model fills the same hidden cells, and ``geonp.evaluate`` scores them
(RMSE, MAE, NLL, CRPS, 50/90/95% coverage, interval score, wall time), with RMSE by distance to
the nearest observed cell and PIT histograms below each scene's table. The scenes are cropped so
the whole table runs in minutes on 2 CPU cores; the crops are stated in the table.
``--fine-tune`` adds rows for models fine-tuned on each scene's own observed cells first
(``geonp infill --fit-steps``), at the same hidden cells.
Writes ``pipelines/results/satellite_cv.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.skill_table import write_table
from pipelines.provenance import REPO, git_commit, header
from pipelines.scene_tables import earlier_results, header_field, keep_earlier, same_cells
from pipelines.scenes import TEST as SCENES

#: name -> (file under the data folder, variable, open_satellite keywords, crop as isel keywords)
MODELS = ["te-pt-tnp", "te-tnp", "convcnp", "tnp-kr", "tnp-kr-fast", "tnp", "pt-tnp", "cnp", "rcnp", "gp",
          "linear", "kriging"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenes", nargs="*", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--fit-steps", type=int, default=0, help="fine-tuning steps for trainable models")
    parser.add_argument("--fine-tune", nargs="*", default=[], metavar="MODEL",
                        help="also score these models after --fine-tune-steps of fine-tuning")
    parser.add_argument("--fine-tune-steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true",
                        help="keep the rows of models not run now from the existing table (same hidden cells)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: combine these tables (same hidden cells; later files win) into --out")
    parser.add_argument("--out", default=str(REPO / "pipelines" / "results" / "satellite_cv.md"))
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    runs = [(m, n) for m, n in ((args.models, args.fit_steps), (args.fine_tune, args.fine_tune_steps)) if m]
    if not runs:
        raise SystemExit("satellite_cv: nothing to run; give --models or --fine-tune")
    earlier = earlier_results(Path(args.out).with_suffix(".json")) if args.reuse else {}
    folder, commit = data_folder(), git_commit()
    results = []
    for name in args.scenes:
        path, variable, kwargs, crop = SCENES[name]
        ds = open_satellite(folder / path, variable, **kwargs).isel(crop)
        res = None
        for models, steps in runs:  # the same seed hides the same cells in every call
            part = evaluate(ds, variable, models, fit_steps=steps, seed=args.seed, options={"device": "auto"})
            for row in part["rows"]:
                row["commit"] = commit
            if res is None:
                res = part
            else:
                same_cells(res, part, name)
                res["rows"] += part["rows"]
        res["source"] = f"{path} {variable}, crop {_crop_text(crop)}"
        if res["source"] in earlier:
            keep_earlier(res, earlier[res["source"]], name)
        results.append(res)
        print(f"{name}: done", flush=True)
    ran = {r["source"] for r in results}
    results += [res for source, res in earlier.items() if source not in ran]  # scenes not run now stay
    _write(results, args.out)


BUDGET = ("crops as stated per table; bundled weights, fine-tuned on the scene for a row's fit steps; "
          "a row's commit is the run that produced it (`--reuse` and `--merge` keep rows of earlier runs)")


def _write(results: list[dict], out: str, note: str = "") -> None:
    order = {m: i for i, m in enumerate(MODELS)}
    for res in results:
        res["rows"].sort(key=lambda r: (order.get(r["model"], len(order)), r["fit_steps"]))
    text = header("Satellite artificial-gap cross-validation", resolve_device("auto"), BUDGET + note)
    write_table(results, out, header=text)
    print(Path(out).read_text())


def merge(files: list[str], out: str) -> None:
    """Combine the JSON tables of several runs scene by scene; a later file's row replaces an earlier one."""
    merged: dict[str, dict] = {}
    runs = []
    for f in files:
        path = Path(f)
        for source, res in earlier_results(path).items():
            if source in merged:
                keep_earlier(res, merged[source], source)
            merged[source] = res
        said = {key: header_field(path, key) for key in ("command", "device", "commit")}
        runs.append(f"{path.name}: {said['command']} at {said['commit']} on {said['device']}")
    _write(list(merged.values()), out, "; merged from " + "; ".join(runs))


def _crop_text(crop: dict) -> str:
    return ", ".join(f"{k} {s.start}:{s.stop}" for k, s in crop.items())


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
