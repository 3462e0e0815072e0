"""Region transfer on infill windows: train in one region and period, fill gaps in others.

    python -m pipelines.benchmarks.region_transfer_windows pipelines/configs/region_transfer/era5_uk_hourly_windows.yaml
    python -m pipelines.benchmarks.region_transfer_windows CONFIG --models te-pt-tnp linear kriging   # some rows

The TE-TNP paper's environmental experiment (train on one region, test on others, elevation as
an input) in the one task encoding infill uses (:mod:`geonp.tasks.windows`: grid-unit offsets,
per-window standardisation), so every model trained here is a checkpoint ``geonp infill
--checkpoint`` takes. A config (``pipelines/configs/region_transfer/*_windows.yaml``) names the
cube (``data``: path, variable, units, elevation), the ``train`` split and the ``test`` splits
(a region and a ``time: [first, last]`` period each), the training settings (``training``:
steps, batch, learning rate and the window source's ``synthetic``, ``wide_clouds``, ``window``)
and the ``models`` (preset, ``args``; ``weights:`` a committed checkpoint trained by this
protocol elsewhere, scored instead of trained; ``model:`` the ``--model`` a row of another name
fills with, ``elevation: true`` to give it the DEM, e.g. ``kriging-elevation: {model: kriging,
elevation: true}``, kriging with elevation as an external drift). Trainable models train on windows of the
training split (:class:`geonp.tasks.window_source.WindowSource`, runs in ``runs`` (default
``runs/region_transfer/<name>``) ``/<model>``, resumed), validated on the first test split.

Every split is then scored as a user would score it, with :func:`geonp.evaluate.evaluate`
(``geonp evaluate``): 30% of each step's cells hidden under random clouds (ERA5 has no gaps to
borrow), the same cells for every model (one seed), filled without fine-tuning, RMSE / CRPS /
90% coverage and NLL per cell in the variable's units. Models without weights (``linear``,
``kriging``, ``gp``) are fitted per scene or window. When the ``figures`` model (default
``te-pt-tnp``) is scored, its fill of each split's middle step is drawn beside the table
(``<out>_<region>.png``: observed, truth, mean, sigma, flags and the error at the hidden cells).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
import yaml

from geonp.data.cube import open_cube
from geonp.data.readers import data_folder
from geonp.data.regions import crop_to_region, get_region, select_time
from geonp.evaluate import evaluate
from geonp.fill.engine import infill
from geonp.fill.predictor import STACK_METHODS, takes_elevation
from geonp.maps import plot_infill
from geonp.models import build
from geonp.train import TrainConfig, train
from pipelines.provenance import REPO, git_commit, header

KEYS = {"name", "description", "data", "train", "test", "training", "models", "evaluation", "out", "runs",
        "figures"}
#: Window-source settings a config's ``training`` may give (the rest are TrainConfig's).
SOURCE_KEYS = ("synthetic", "wide_clouds", "window")


def load_config(path: str | Path) -> dict[str, Any]:
    """The protocol as a dict; unknown top-level keys are an error naming them."""
    cfg = yaml.safe_load(Path(path).read_text())
    unknown = sorted(set(cfg) - KEYS)
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {', '.join(unknown)}")
    return cfg


def _box(split: dict[str, Any]) -> list[float]:
    r = get_region(split["region"])
    return [r.lat[0], r.lat[1], r.lon[0], r.lon[1]]


def field_entry(cfg: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
    """A :class:`~geonp.tasks.window_source.WindowSource` field entry for one split."""
    entry = {"path": cfg["data"]["path"], "variable": cfg["data"]["variable"], "region": _box(split)}
    if split.get("time"):
        entry["time"] = list(split["time"])
    return entry


def train_config(cfg: dict[str, Any], name: str, steps: int | None) -> TrainConfig:
    """The training run of model ``name``: windows of the training split, validated on the first test split."""
    tr, spec = cfg["training"], cfg["models"][name] or {}
    source = {"name": "windows", "elevation": cfg["data"].get("elevation"),
              "files": [field_entry(cfg, cfg["train"])], "val_files": [field_entry(cfg, cfg["test"][0])],
              **{k: tr[k] for k in SOURCE_KEYS if k in tr}}
    runs = Path(cfg.get("runs", REPO / "runs" / "region_transfer" / cfg["name"]))
    return TrainConfig(model=name, out_dir=str(runs / name),
                       preset=spec.get("preset", "tiny"), model_args=spec.get("args", {}), data=source,
                       steps=steps or tr["steps"], batch_size=tr.get("batch_size", 16), lr=tr.get("lr", 5e-4),
                       checkpoint_every=tr.get("checkpoint_every", 100), val_every=tr.get("val_every", 500),
                       log_every=50, val_tasks=tr.get("val_tasks", 128), seed=tr.get("seed", 0), device="auto")


def checkpoint_of(cfg: dict[str, Any], name: str, steps: int | None) -> str | None:
    """The model's weights: its committed ``weights``, else its training run (trained or resumed
    first); None for a model without weights."""
    spec = cfg["models"][name] or {}
    if spec.get("weights"):
        return str(REPO / spec["weights"])
    dim_x = 4 if cfg["data"].get("elevation") else 3
    if spec.get("model", name) in STACK_METHODS:
        return None
    model = build(spec.get("model", name), dim_x, 1, preset=spec.get("preset", "tiny"), **spec.get("args", {}))
    if not model.trainable:
        return None
    config = train_config(cfg, name, steps)
    run = Path(config.out_dir)
    summary = run / "summary.json"
    if not summary.exists() or json.loads(summary.read_text())["step"] < config.steps:
        started = time.perf_counter()
        train(config, resume=(run / "state.safetensors").exists(), progress=False)
        print(f"{name}: trained to step {config.steps} ({time.perf_counter() - started:.0f} s)", flush=True)
    return str(run / "model.safetensors")


def split_cube(cfg: dict[str, Any], split: dict[str, Any]):
    """The split's part of the cube: its region and period."""
    data = cfg["data"]
    ds = crop_to_region(open_cube(data_folder() / data["path"], [data["variable"]]), get_region(split["region"]))
    return select_time(ds, split.get("time"), data["path"]).compute()


def score(cfg: dict[str, Any], name: str, checkpoint: str | None, seed: int,
          figures: Path | None = None) -> dict[str, dict]:
    """``{region name: evaluate row}`` of one model on every split; with ``figures`` (the table's
    path), its fill of each split is also drawn to ``<figures stem>_<region>.png``."""
    data, out = cfg["data"], {}
    spec = cfg["models"][name] or {}
    model = spec.get("model", name)
    dem = str(data_folder() / data["elevation"]) if data.get("elevation") else None
    for split in [cfg["train"], *cfg["test"]]:
        elevation = dem if dem and (spec.get("elevation") or takes_elevation(model, checkpoint)) else None
        cube, kept = split_cube(cfg, split), {}
        res = evaluate(cube, data["variable"], [model], checkpoints={model: checkpoint} if checkpoint else None,
                       seed=seed, options={"device": "cpu"}, elevation=elevation, infill_fn=_keeping(kept))
        if figures is not None:
            draw(cfg, split, name, cube[data["variable"]], kept["masked"], kept["out"], figures)
        row = res["rows"][0]
        out[get_region(split["region"]).name] = {k: row[k] for k in ("rmse", "crps", "coverage_90", "nll", "wall_s")} \
            | {"hidden_cells": res["hidden_cells"]}
        print(f"{name} {get_region(split['region']).name}: RMSE {row['rmse']:.4g} CRPS {row['crps']:.4g} "
              f"cov90 {row['coverage_90']:.3f} NLL {row['nll']:.3f} ({row['wall_s']:.0f} s)", flush=True)
    return out


def _keeping(kept: dict[str, Any]):
    """``geonp infill``, keeping the masked input and the output it was given and gave in ``kept``."""

    def fill(masked: xr.Dataset, variable: str, model: str, **options: Any) -> xr.Dataset:
        kept["masked"], kept["out"] = masked[variable], infill(masked, variable, model, **options)
        return kept["out"]

    return fill


def draw(cfg: dict[str, Any], split: dict[str, Any], model: str, truth: xr.DataArray, masked: xr.DataArray,
         filled: xr.Dataset, table: Path) -> Path:
    """Map panels of ``model``'s fill of one split at its middle step, beside the table."""
    region = get_region(split["region"]).name
    step = truth.sizes.get("time", 1) // 2
    hidden = np.isfinite(truth) & ~np.isfinite(masked)
    when = f", {str(truth['time'].values[step])[:16]}" if "time" in truth.dims else ""
    title = (f"{model} trained on {get_region(cfg['train']['region']).name}, filling {region}{when}: "
             "30% hidden under random clouds")
    path = table.with_name(f"{table.stem}_{region}.png")
    return plot_infill(filled, cfg["data"]["variable"], path, time=step, truth=truth, hidden=hidden, title=title)


def write_table(cfg: dict[str, Any], rows: dict[str, dict], text: str, path: Path) -> None:
    """The markdown table (RMSE / CRPS / coverage, then NLL) and the JSON beside it."""
    splits = [cfg["train"], *cfg["test"]]
    names = [get_region(s["region"]).name for s in splits]
    head = "| model | " + " | ".join(f"{n}{' (train)' if i == 0 else ''}" for i, n in enumerate(names)) + " | commit |"
    sep = "|---|" + "---:|" * len(names) + "---|"
    skill, nll = [head, sep], [head, sep]
    for model, by_region in rows.items():
        cells = [by_region.get(n) for n in names]
        commit = next((c["commit"] for c in cells if c), "–")
        skill.append(f"| {model} | " + " | ".join(f"{c['rmse']:.3g} / {c['crps']:.3g} / {c['coverage_90']:.2f}"
                                                  if c else "–" for c in cells) + f" | {commit} |")
        nll.append(f"| {model} | " + " | ".join(f"{c['nll']:.3f}" if c else "–" for c in cells) + f" | {commit} |")
    periods = "; ".join(f"{n} (lat {_box(s)[0]:g}-{_box(s)[1]:g}, lon {_box(s)[2]:g}-{_box(s)[3]:g}"
                        + (f", {s['time'][0]} to {s['time'][1]})" if s.get("time") else ")")
                        for n, s in zip(names, splits))
    hidden = next(iter(rows.values()))
    units = cfg["data"].get("units", "units of the variable")
    body = [text, "", cfg.get("description", "").strip(), "", f"Splits: {periods}.", "",
            "Hidden cells per split: " + ", ".join(f"{n} {hidden[n]['hidden_cells']}" for n in names if n in hidden)
            + " (30% of each step under random clouds, one seed: the same cells for every model).", "",
            f"RMSE / CRPS ({units}) / 90% coverage at the hidden cells (lower, lower, 0.90):", "", *skill, "",
            f"NLL per hidden cell (nats, in {units}; lower is better):", "", *nll, ""]
    path.write_text("\n".join(body))
    path.with_suffix(".json").write_text(json.dumps({"header": text, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--models", nargs="*", help="a subset of the config's models (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the config's)")
    parser.add_argument("--train-only", action="store_true", help="train (or resume) and stop")
    parser.add_argument("--out", default=None, help="results file (default: the config's out)")
    args = parser.parse_args()
    cfg = load_config(args.config)
    names = args.models or list(cfg["models"])
    unknown = [m for m in names if m not in cfg["models"]]
    if unknown:
        raise SystemExit(f"--models: not in {args.config}: {', '.join(unknown)}")
    torch.set_num_threads(1)
    checkpoints = {name: checkpoint_of(cfg, name, args.steps) for name in names}
    if args.train_only:
        return
    out = Path(args.out or REPO / cfg["out"])
    earlier = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else {}
    rows = {m: earlier[m] for m in cfg["models"] if m in earlier}
    seed, commit = cfg.get("evaluation", {}).get("seed", 7), git_commit()
    drawn = cfg.get("figures", "te-pt-tnp")
    for name in names:
        rows[name] = {region: {**r, "commit": commit} for region, r in
                      score(cfg, name, checkpoints[name], seed, out if name == drawn else None).items()}
    rows = {m: rows[m] for m in cfg["models"] if m in rows}
    tr = cfg["training"]
    trained = ", ".join(f"{m}: {cfg['models'][m]['weights']}" for m in rows if (cfg["models"][m] or {}).get("weights"))
    text = header(f"Region transfer on infill windows: {cfg['name']}", torch.device("cpu"),
                  f"{args.steps or tr['steps']} steps x {tr.get('batch_size', 16)} windows per trained model"
                  + (f" (committed weights: {trained})" if trained else "") + f"; no fine-tuning; seed {seed}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_table(cfg, rows, text, out)
    print(out.read_text())


if __name__ == "__main__":
    main()
