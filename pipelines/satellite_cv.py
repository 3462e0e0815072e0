"""Artificial-gap cross-validation on the real satellite scenes in ../shared/data.

    python -m pipelines.satellite_cv                          # all scenes, default models
    python -m pipelines.satellite_cv --models linear kriging  # a subset
    python -m pipelines.satellite_cv --scenes alboran --fit-steps 30
    python -m pipelines.satellite_cv --fine-tune te-pt-tnp --fine-tune-steps 200  # extra rows

Each scene's observed cells are hidden under the real cloud pattern of another day (one scene:
synthetic clouds), every model fills the same hidden cells, and ``geonp.evaluate`` scores them
(RMSE, MAE, NLL, CRPS, 90/95% coverage, interval score, wall time). The scenes are cropped so
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
from geonp.data.window_source import data_folder
from geonp.evaluate import evaluate, write_table
from geonp.train import resolve_device
from pipelines.provenance import REPO, header

#: name -> (file under the data folder, variable, open_satellite keywords, crop as isel keywords)
SCENES = {
    "alboran": ("satellite/alboran_sst_avhrr_2017-05.nc", "SST", {"valid_mask": "mask"},
                {"time": slice(0, 6)}),
    "olci": ("satellite/olci_chl_north_sea_2017-01.zarr", "conc_chl", {},
             {"lat": slice(400, 600), "lon": slice(800, 1100)}),
    "modis": ("satellite/modis_lst_brazil_2019-11-01.nc", "LST_Day_1km", {},
              {"y": slice(800, 1000), "x": slice(0, 300)}),
}
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
    parser.add_argument("--out", default=str(REPO / "pipelines" / "results" / "satellite_cv.md"))
    args = parser.parse_args()
    folder = data_folder()
    results = []
    for name in args.scenes:
        path, variable, kwargs, crop = SCENES[name]
        ds = open_satellite(folder / path, variable, **kwargs).isel(crop)
        res = evaluate(ds, variable, args.models, fit_steps=args.fit_steps, seed=args.seed,
                       options={"device": "auto"})
        if args.fine_tune:  # the same seed hides the same cells
            tuned = evaluate(ds, variable, args.fine_tune, fit_steps=args.fine_tune_steps, seed=args.seed,
                             options={"device": "auto"})
            if tuned["donors"] != res["donors"] or tuned["hidden_cells"] != res["hidden_cells"]:
                raise RuntimeError(f"{name}: the fine-tuned rows hid other cells than the first run")
            res["rows"] += tuned["rows"]
        res["source"] = f"{path} {variable}, crop {_crop_text(crop)}"
        results.append(res)
        print(f"{name}: done", flush=True)
    budget = "crops as stated per table; bundled weights, fine-tuned on the scene for a row's fit steps"
    text = header("Satellite artificial-gap cross-validation", resolve_device("auto"), budget)
    write_table(results, args.out, header=text)
    print(Path(args.out).read_text())


def _crop_text(crop: dict) -> str:
    return ", ".join(f"{k} {s.start}:{s.stop}" for k, s in crop.items())


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
