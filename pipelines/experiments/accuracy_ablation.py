"""Accuracy ablation (issue #13): variants of the gap-filling models at one training budget,
chosen on a validation split, scored once on satellite_cv's hidden cells.

    python -m pipelines.experiments.accuracy_ablation                       # every variant not yet in the table
    python -m pipelines.experiments.accuracy_ablation --variants knn16      # (re)run some variants
    python -m pipelines.experiments.accuracy_ablation --list                # what each variant changes

Variants live in ``pipelines/configs/accuracy/variants.yaml``: each is a ``geonp train``
configuration (the base config ``base.yaml`` with the variant's overrides merged in, usually
growing the bundled weights with ``init_from``) trained for the same number of steps (the
minutes each took on one CPU thread are in the table: the cost of the variant), or an existing
checkpoint (``checkpoint:``; ``model_args:`` changes arguments that hold no weights), or a
model without weights. A variant marked ``retired:`` needs a part the shipped model no longer
has (removed after the commit it names): its rows stay, and it runs only at the commit it names. Runs live in
``runs/accuracy/<variant>`` and resume where they stopped.

The split (stated in the README): *test* = the cells ``pipelines/benchmarks/satellite_cv.py`` hides (seed
0 on its three crops; the whole crops are excluded from training); *validation* = other crops of
the same products (``VALIDATION``, ``pipelines/scenes.yaml``, seed 1), also excluded from training; the MODIS LST
scene is never trained on. Variants are compared on the validation columns; the test columns
are reported once per variant, never used to choose.

Writes ``pipelines/results/accuracy_ablation.md`` and ``.json`` (rows of earlier runs are kept;
a variant run now replaces its row).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.device import resolve_device
from geonp.evaluate import evaluate
from geonp.tasks.windows import WindowSpec
from geonp.train import TrainConfig, train
from pipelines.checkpoint_variants import merged, variant_checkpoint
from pipelines.provenance import REPO, git_commit, header
from pipelines.scenes import TEST, VALIDATION

CONFIGS = REPO / "pipelines" / "configs" / "accuracy"
RESULTS = REPO / "pipelines" / "results" / "accuracy_ablation.md"
#: name -> (file, variable, open_satellite keywords, crop): parts of the satellite_cv products
#: that neither training nor the test crops touch.
SPLITS = {"val": (VALIDATION, 1), "test": (TEST, 0)}


def load_variants() -> dict[str, dict]:
    spec = yaml.safe_load((CONFIGS / "variants.yaml").read_text())
    base = yaml.safe_load((CONFIGS / spec.get("base", "base.yaml")).read_text())
    out = {}
    for name, v in spec["variants"].items():
        v = dict(v)
        if "checkpoint" not in v and v.get("train", True):
            # ``replace`` names base keys the overrides replace whole (e.g. another model's model_args).
            start = {k: x for k, x in base.items() if k not in v.get("replace", [])}
            cfg = merged(start, v.get("overrides", {}))
            cfg["out_dir"] = f"runs/accuracy/{name}"
            v["config"] = cfg
        out[name] = v
    return out


def checkpoint_of(name: str, v: dict) -> tuple[str | None, dict]:
    """Train a variant when it has a config (resuming), return ``(checkpoint or None, training facts)``."""
    if "checkpoint" in v and "model_args" in v:
        out = REPO / "runs" / "accuracy" / name / "model.safetensors"
        return str(variant_checkpoint(REPO / v["checkpoint"], out, model_args=v["model_args"])), {}
    if "checkpoint" in v:
        return str(REPO / v["checkpoint"]), {}
    if "config" not in v:
        return None, {}
    cfg = TrainConfig(**v["config"])
    out = REPO / cfg.out_dir
    cfg.out_dir = str(out)
    summary = out / "summary.json"
    done = json.loads(summary.read_text()) if summary.exists() else None
    budget = cfg.time_budget_s or float("inf")
    if done is None or (done["step"] < cfg.steps and done["elapsed_s"] < budget - 1):
        train(cfg, resume=(out / "state.safetensors").exists(), progress=False)
        done = json.loads(summary.read_text())
    return str(out / "model.safetensors"), {"steps": done["step"], "train_min": done["elapsed_s"] / 60,
                                              "val_nll": done["val_nll"]}


def score(name: str, v: dict, checkpoint: str | None) -> dict[str, dict]:
    """Scores of one variant on every scene of both splits: ``{"val/alboran": row, ...}``."""
    model = v.get("model", "te-pt-tnp")
    options: dict[str, Any] = {"device": "cpu"}
    if "window" in v:
        options["window"] = WindowSpec(**{k: tuple(x) if isinstance(x, list) else x for k, x in v["window"].items()})
    out = {}
    for split, (scenes, seed) in SPLITS.items():
        for scene, (path, variable, kwargs, crop) in scenes.items():
            ds = open_satellite(data_folder() / path, variable, **kwargs).isel(crop)
            res = evaluate(ds, variable, [model], checkpoints={model: checkpoint} if checkpoint else None,
                           fit_steps=v.get("fit_steps", 0), seed=seed, options=options)
            row = res["rows"][0]
            out[f"{split}/{scene}"] = {k: row.get(k) for k in ("rmse", "crps", "coverage_90", "nll", "wall_s")}
            out[f"{split}/{scene}"]["rmse_1"] = row["rmse_by_distance"]["1"]["rmse"]
            print(f"{name} {split}/{scene}: RMSE {row['rmse']:.4g} CRPS {row['crps']:.4g} "
                  f"cov90 {row['coverage_90']:.3f} ({row['wall_s']:.0f} s)", flush=True)
    return out


def _f(x: Any, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def write(rows: dict[str, dict], variants: dict[str, dict], path: Path) -> None:
    order = [n for n in variants if n in rows] + [n for n in rows if n not in variants]
    text = header("Accuracy ablation (issue #13)", resolve_device("cpu"),
                  "each trained variant: the same number of training steps (600 x 16 windows) from the same start "
                  "(see pipelines/configs/accuracy); rows keep the commit they ran at")
    lines = [text, "", "Validation split (other crops of the same products, seed 1): RMSE / CRPS / 90% coverage, "
             "RMSE at one cell from an observation. Choose variants here.", ""]
    scenes = list(VALIDATION)
    head = "| variant | what changes | steps | min | " + " | ".join(scenes) + " | RMSE@1 " + " / ".join(scenes) + " |"
    lines += [head, "|---|---|---:|---:|" + "---|" * (len(scenes) + 1)]
    for n in order:
        r = rows[n]
        cells = [f"{_f(r['scores'][f'val/{s}']['rmse'])} / {_f(r['scores'][f'val/{s}']['crps'])} / "
                 f"{_f(r['scores'][f'val/{s}']['coverage_90'], 3)}" for s in scenes]
        near = " / ".join(_f(r["scores"][f"val/{s}"]["rmse_1"]) for s in scenes)
        lines.append(f"| {n} | {r['description']} | {_f(r.get('steps'))} | {_f(r.get('train_min'), 3)} | "
                     + " | ".join(cells) + f" | {near} |")
    scenes = list(TEST)
    lines += ["", "Test split (satellite_cv's hidden cells, seed 0; reported once per variant): RMSE / CRPS / "
              "90% coverage, RMSE at one cell, and infill seconds per scene (1 thread).", ""]
    lines += ["| variant | " + " | ".join(scenes) + " | RMSE@1 | infill s | commit |",
              "|---|" + "---|" * (len(scenes) + 3)]
    for n in order:
        r = rows[n]
        cells = [f"{_f(r['scores'][f'test/{s}']['rmse'])} / {_f(r['scores'][f'test/{s}']['crps'])} / "
                 f"{_f(r['scores'][f'test/{s}']['coverage_90'], 3)}" for s in scenes]
        near = " / ".join(_f(r["scores"][f"test/{s}"]["rmse_1"]) for s in scenes)
        wall = " / ".join(_f(r["scores"][f"test/{s}"]["wall_s"], 3) for s in scenes)
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {near} | {wall} | {r['commit']} |")
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"header": text, "rows": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="*", help="variants to (re)run (default: those not in the table)")
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    variants = load_variants()
    if args.list:
        for n, v in variants.items():
            print(f"{n}: {v['description']}" + (f" [retired at {v['retired']}]" if "retired" in v else ""))
        return
    out = Path(args.out)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else {}
    todo = args.variants or [n for n in variants if n not in rows]
    unknown = [n for n in todo if n not in variants]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; see --list")
    retired = [f"{n} (retired at {variants[n]['retired']})" for n in todo if "retired" in variants[n]]
    if retired:
        raise SystemExit(f"variant(s) that need a part the shipped model no longer has: {'; '.join(retired)}; "
                         "check out that commit to run them")
    for name in todo:
        v = variants[name]
        start = time.perf_counter()
        checkpoint, facts = checkpoint_of(name, v)
        row = {"description": v["description"], **facts, "scores": score(name, v, checkpoint),
               "commit": git_commit(), "wall_min": (time.perf_counter() - start) / 60}
        # Re-read before writing: another process may have added rows for other variants meanwhile.
        rows = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else {}
        rows[name] = row
        write(rows, variants, out)
    print(out.read_text())


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
