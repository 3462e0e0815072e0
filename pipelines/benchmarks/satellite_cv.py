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
import json
import re
from pathlib import Path

import torch

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.skill_table import write_table
from pipelines.provenance import REPO, git_commit, header
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
    earlier = _earlier(Path(args.out).with_suffix(".json")) if args.reuse else {}
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
                _same_cells(res, part, name)
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
        for source, res in _earlier(path).items():
            if source in merged:
                keep_earlier(res, merged[source], source)
            merged[source] = res
        said = {key: _header_field(path, key) for key in ("command", "device", "commit")}
        runs.append(f"{path.name}: {said['command']} at {said['commit']} on {said['device']}")
    _write(list(merged.values()), out, "; merged from " + "; ".join(runs))


def _earlier(path: Path) -> dict[str, dict]:
    """Results of an earlier run by source; rows that predate the commit column get the table's commit."""
    if not path.exists():
        raise SystemExit(f"{path}: no earlier table to take rows from")
    commit = _header_field(path, "commit", "unknown")
    out = {}
    for res in json.loads(path.read_text())["results"]:
        for row in res["rows"]:
            row.setdefault("commit", commit)
        out[res["source"]] = res
    return out


def _header_field(path: Path, key: str, missing: str = "unrecorded") -> str:
    """The value of the ``- key: value`` line of a results table's provenance header, else ``missing``."""
    found = re.search(rf"^- {key}: (.+)$", json.loads(path.read_text()).get("header", ""), re.MULTILINE)
    return found.group(1).strip() if found else missing


def keep_earlier(res: dict, old: dict, name: str) -> None:
    """Add to ``res`` the rows of ``old`` (same scene) for (model, fit steps) not run now.

    Rows from tables older than the diagnostics lack them and print "–" there; the hidden cells'
    counts by distance are the same for both (same cells), so ``res`` takes ``old``'s if it has none.
    """
    _same_cells(res, old, name)
    ran = {(r["model"], r["fit_steps"]) for r in res["rows"]}
    res["rows"] += [r for r in old["rows"] if (r["model"], r["fit_steps"]) not in ran]
    if "hidden_by_distance" in old:
        res.setdefault("hidden_by_distance", old["hidden_by_distance"])


def _same_cells(a: dict, b: dict, name: str) -> None:
    if (a["seed"], a["donors"], a["hidden_cells"]) != (b["seed"], b["donors"], b["hidden_cells"]):
        raise SystemExit(f"{name}: rows to combine hid different cells (seed, donors or count differ); "
                         "rerun every model without --reuse")


def _crop_text(crop: dict) -> str:
    return ", ".join(f"{k} {s.start}:{s.stop}" for k, s in crop.items())


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
