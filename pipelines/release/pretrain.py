"""Train the weights bundled with geonp and export them into the package.

    python -m pipelines.release.pretrain                      # every config in pipelines/configs/bundled/
    python -m pipelines.release.pretrain --models te-pt-tnp   # one of them
    python -m pipelines.release.pretrain --export-only        # re-export finished runs

Each config is a ``geonp train`` configuration with ``data: {name: windows}`` (infill-shaped
windows from synthetic random fields and real reanalysis fields, validation on ERA5 over another
region). A run that stopped (killed, or its time budget spent) is resumed, then its
``model.safetensors`` (which carries the window scaling in its ``infill`` header) is copied to
``geonp/weights/<model>.safetensors`` (with the inference-only choices of ``AT_INFERENCE`` and
``COVARIATES_AT_INFERENCE`` in its header) and a row goes into ``pipelines/results/pretrain_<device>.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import yaml

from geonp.checkpoint import read_checkpoint, write_checkpoint
from geonp.device import resolve_device
from geonp.models import build
from geonp.models.registry import same_model
from geonp.train import TrainConfig, train
from pipelines.checkpoint_variants import variant_checkpoint
from pipelines.provenance import REPO, git_commit, header

CONFIGS = REPO / "pipelines" / "configs" / "bundled"
WEIGHTS = REPO / "geonp" / "weights"
#: Architecture arguments that hold no weights, set in the exported header (same trained
#: tensors), chosen on issue #13's validation crops (pipelines/results/accuracy_ablation.md):
#: the local kriging's 64 neighbours taken 16 per quadrant around the target (flagship-q64). The
#: predicted mean is the local kriging mean alone, the decoder setting sigma, in the model itself
#: (flagship-q64-kriging-mean: validation RMSE 0.2094 / 1.297 / 1.708 against the learned gate's
#: 0.2189 / 1.310 / 1.747; the gate was removed after commit 3ab7466). The drift slopes' prior
#: is empirical Bayes (chosen on history_cv's validation split: geometric mean CRPS over the five
#: products 1.5% below each target's own slopes with the default 30 fit steps, RMSE 1.6%).
#: Its kriging head takes the scene's nugget share as its last covariate (``kriging.nugget_input``),
#: used where infill's ``--nugget auto`` finds it better on the input's own cells (geonp.fill.nugget).
AT_INFERENCE = {"te-pt-tnp": {"kriging": {"quadrant_dims": [1, 2], "slope_prior": "empirical", "nugget_input": True}}}
#: History covariates the exported header asks infill for, in the kriging drift (which holds no
#: weight): te-pt-tnp trained with ``dineof`` takes ``spread`` beside it, chosen on history_cv's
#: validation split (``dineof-spread``: geometric mean CRPS over the five products 0.8% below
#: ``dineof`` alone with the default 30 fit steps, RMSE 1.6%, Sentinel-2 NDVI RMSE 6.8%); and the
#: step's ``nugget`` share last, for the head (``small-auto``: geometric mean CRPS 1.8% below the
#: weights without it, RMSE 1.4%, with ``--nugget auto``).
COVARIATES_AT_INFERENCE = {"te-pt-tnp": ["dineof", "spread", "nugget"]}


def shipped_header(path: Path) -> None:
    """Give an exported checkpoint the header ``build(name, dim_x, dim_y)`` gives, when it is that
    model (:func:`geonp.models.registry.same_model`): the bundled te-pt-tnp is then its class's
    default, ``preset: shipped``, rather than the training preset with the shipped arguments spelt out."""
    tensors, meta = read_checkpoint(path)
    cfg = meta["model"]
    try:
        default = build(cfg["name"], cfg["dim_x"], cfg["dim_y"]).config
    except ValueError:  # the default model does not take these inputs: not the shipped one
        return
    if same_model(cfg, default) and cfg != default:
        write_checkpoint(path, tensors, {**meta, "model": default})


def _configs(models: list[str] | None) -> list[Path]:
    paths = sorted(CONFIGS.glob("*.yaml"))
    chosen = [p for p in paths if models is None or yaml.safe_load(p.read_text())["model"] in models]
    if not chosen:
        raise SystemExit(f"no bundled config for {models} in {CONFIGS}")
    return chosen


def _run(path: Path, export_only: bool, trained_at: str | None) -> dict:
    """Train (unless finished or ``export_only``) and export one config; returns its table row.

    ``trained_at``: the commit an earlier row recorded for this run, kept when nothing is trained now.
    """
    cfg = TrainConfig.from_yaml(path)
    out = REPO / cfg.out_dir
    summary = out / "summary.json"
    if not export_only:
        finished = summary.exists() and json.loads(summary.read_text())["step"] >= cfg.steps
        if not finished:
            trained_at = git_commit()
            train(cfg, resume=(out / "train_state.safetensors").exists() or (out / "state.safetensors").exists(),
                  progress=False)
    model = out / "model.safetensors"
    if not model.exists():
        raise SystemExit(f"{model}: no trained model to export (run without --export-only)")
    tensors, meta = read_checkpoint(model)
    if "infill" not in meta:
        raise SystemExit(f"{model}: no infill header; train it with data: {{name: windows}}")
    WEIGHTS.mkdir(exist_ok=True)
    if cfg.model in AT_INFERENCE or cfg.model in COVARIATES_AT_INFERENCE:
        variant_checkpoint(model, WEIGHTS / f"{cfg.model}.safetensors", model_args=AT_INFERENCE.get(cfg.model),
                           covariates=COVARIATES_AT_INFERENCE.get(cfg.model))
    else:
        shutil.copyfile(model, WEIGHTS / f"{cfg.model}.safetensors")
    shipped_header(WEIGHTS / f"{cfg.model}.safetensors")
    done = json.loads(summary.read_text())
    return {"model": cfg.model, "preset": cfg.preset, "parameters": sum(t.numel() for t in tensors.values()),
            "steps": done["step"], "tasks": done["step"] * cfg.batch_size, "elapsed_s": round(done["elapsed_s"]),
            "val_nll": round(meta["val_nll"], 4), "device": done["device"], "config": str(path.relative_to(REPO)),
            "size_kb": round((WEIGHTS / f"{cfg.model}.safetensors").stat().st_size / 1024),
            "commit": trained_at or "–"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=None, help="model names (default: every bundled config)")
    parser.add_argument("--export-only", action="store_true", help="export finished runs without training")
    parser.add_argument("--trained-at", default=None, metavar="COMMIT",
                        help="with --export-only: the commit a run copied from elsewhere was trained at")
    args = parser.parse_args()
    device = resolve_device("auto")
    results = REPO / "pipelines" / "results" / f"pretrain_{device.type}.json"
    old = {r["model"]: r for r in (json.loads(results.read_text())["rows"] if results.exists() else [])}
    rows = []
    for path in _configs(args.models):
        name = yaml.safe_load(path.read_text())["model"]
        rows.append(_run(path, args.export_only, args.trained_at or old.get(name, {}).get("commit")))
    merged = old | {r["model"]: r for r in rows}
    budget = "per config: its steps and time_budget_s (see the config files)"
    text = header("Bundled weights (geonp/weights)", device, budget,
                  {"data": "infill windows: synthetic random fields + ERA5/ERA5-Land/ERSST/WFDE5 (training), "
                           "ERA5 USA + synthetic of another seed (validation)"})
    cols = ["model", "preset", "parameters", "steps", "tasks", "elapsed_s", "val_nll", "size_kb", "device", "config",
            "commit"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "–")) for c in cols) + " |" for r in merged.values()]
    note = ("\nval_nll: mean negative log-likelihood per hidden cell of the validation windows, in units of the "
            "window's standardised values (a model that ignores the context scores about 1.42). commit: where "
            "the run was trained.\n")
    md = text + "\n" + "\n".join(lines) + "\n" + note
    results.with_suffix(".md").write_text(md)
    results.write_text(json.dumps({"header": text, "rows": list(merged.values())}, indent=2))
    print(md)


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
