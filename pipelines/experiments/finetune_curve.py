"""Self-supervised fine-tuning on the scene itself (``--fit-steps``): skill against fit steps and
learning rate, to choose the default.

    python -m pipelines.experiments.finetune_curve                                  # bundled te-pt-tnp
    python -m pipelines.experiments.finetune_curve --checkpoint runs/x/model.safetensors --steps 0 30 100
    python -m pipelines.experiments.finetune_curve --steps 30 --lrs 1e-4 --own-gaps 0 0.5 --scenes modis@400:0

Each scene of the accuracy ablation's validation split (``pipelines.experiments.accuracy_ablation.VALIDATION``:
crops neither training nor the satellite_cv test touches; ``--scenes`` may also name its further
crops, ``MORE_VALIDATION``) is masked as ``geonp evaluate`` masks it (same seed, same hidden
cells); the model is fine-tuned on the masked scene's observed cells with each learning rate (and
each share of windows under clouds spanning the whole view, ``--wide-clouds``, and of windows
under the scene's own gaps from elsewhere, ``--own-gaps``) once, up to the largest step count,
and snapshotted at every requested count (a run's first ``n`` steps are the ``n``-step run:
``finetune`` is deterministic), and each snapshot fills the hidden cells. Fit seconds are the
fine-tuning time up to that step (1 thread).
Writes ``pipelines/results/finetune_curve.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from geonp.checkpoint import read_checkpoint
from geonp.data import open_satellite
from geonp.data.readers import data_folder
from geonp.evaluate import evaluate, static_valid_area
from geonp.fill.finetune import finetune
from geonp.fill.options import FitOptions
from geonp.fill.plan import plan
from geonp.models import save
from geonp.tasks.hidden import hide_cells
from pipelines.provenance import REPO, git_commit, header, rows_json
from pipelines.scenes import MORE_VALIDATION, VALIDATION

SEED = 1  # the validation split's seed in the accuracy ablation
CROPS = {**VALIDATION, **MORE_VALIDATION}


def curve(scene: str, checkpoint: str, model: str, steps: list[int], lrs: list[float],
          wides: list[float], owns: list[float]) -> list[dict]:
    path, variable, kwargs, crop = CROPS[scene]
    ds = open_satellite(data_folder() / path, variable, **kwargs).isel(crop)
    da = ds[variable].compute()
    valid = static_valid_area(ds, da, None, scene)
    masked, _ = hide_cells(da, valid, np.random.default_rng(SEED))  # what evaluate() hides with this seed
    masked_ds = ds.assign({variable: masked})
    _, meta = read_checkpoint(checkpoint)
    extra = {k: v for k, v in meta.items() if k not in ("kind", "model")}
    rows = []

    def score(snapshot: torch.nn.Module, fit: int, lr: float | None, wide: float, own: float, fit_s: float) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            saved = Path(tmp) / "snapshot.safetensors"
            save(snapshot, saved, extra=extra)
            res = evaluate(ds, variable, [model], checkpoints={model: str(saved)}, seed=SEED,
                           options={"device": "cpu"})
        r = res["rows"][0]
        rows.append({"scene": scene, "fit_steps": fit, "lr": lr, "wide_clouds": wide, "own_gaps": own,
                     "rmse": r["rmse"], "crps": r["crps"],
                     "coverage_90": r["coverage_90"], "nll": r["nll"], "fit_s": fit_s, "infill_s": r["wall_s"]})
        print(f"{scene} steps {fit} lr {lr} wide {wide} own gaps {own}: RMSE {r['rmse']:.4g} CRPS {r['crps']:.4g} "
              f"cov90 {r['coverage_90']:.3f} (fit {fit_s:.0f} s)", flush=True)

    p = plan(masked_ds, variable, model, checkpoint=checkpoint, valid_mask=valid, device="cpu", seed=SEED)
    score(p.choice.model, 0, None, 0.0, 0.0, 0.0)
    for lr, wide, own in itertools.product(lrs, wides, owns):
        snaps: dict[int, tuple[torch.nn.Module, float]] = {}
        start = time.perf_counter()

        def keep(step: int, m: torch.nn.Module, loss: float, snaps: dict = snaps, start: float = start) -> None:
            if step in steps:
                snaps[step] = (copy.deepcopy(m).eval(), time.perf_counter() - start)

        fit = FitOptions(steps=max(steps), lr=lr, wide_clouds=wide, own_gaps=own)
        finetune(p.choice.model, p.fields, p.spec, torch.device("cpu"), fit, SEED, p.elevation, on_step=keep)
        for step in sorted(snaps):
            score(snaps[step][0], step, lr, wide, own, snaps[step][1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="te-pt-tnp")
    parser.add_argument("--checkpoint", default=str(REPO / "geonp" / "weights" / "te-pt-tnp.safetensors"))
    parser.add_argument("--scenes", nargs="*", default=list(VALIDATION), choices=list(CROPS))
    parser.add_argument("--steps", nargs="*", type=int, default=[30, 100, 300, 1000])
    parser.add_argument("--lrs", nargs="*", type=float, default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--wide-clouds", nargs="*", type=float, default=[0.0],
                        help="shares of fine-tuning windows under clouds spanning the whole view")
    parser.add_argument("--own-gaps", nargs="*", type=float, default=[0.0],
                        help="shares of fine-tuning windows under the scene's own gaps from another place")
    parser.add_argument("--out", default=str(REPO / "pipelines" / "results" / "finetune_curve.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = header("Fine-tuning on the scene: skill against fit steps and learning rate", torch.device("cpu"),
                  f"{args.model} from {Path(args.checkpoint).name}; validation crops of the accuracy ablation "
                  f"(seed {SEED}); batches of 8 windows; fit s: fine-tuning seconds up to that step")
    # Rows of scenes not run now are kept from the existing table (each row keeps the commit it ran at).
    earlier = Path(args.out).with_suffix(".json")
    kept = [r for r in json.loads(earlier.read_text())["rows"] if r["scene"] not in args.scenes] \
        if earlier.exists() else []
    rows: list[dict] = []
    for scene in args.scenes:  # the table is rewritten after each scene: a stopped run keeps its scenes
        rows += [{**r, "commit": git_commit()} for r in curve(scene, args.checkpoint, args.model,
                                                             sorted(args.steps), args.lrs, args.wide_clouds,
                                                             args.own_gaps)]
        write(sorted(kept + rows, key=lambda r: list(CROPS).index(r["scene"])), text, Path(args.out))
    print(Path(args.out).read_text())


def write(rows: list[dict], text: str, out: Path) -> None:
    lines = [text, "", "| scene | fit steps | lr | wide clouds | own gaps | RMSE | CRPS | cov90 | NLL | fit s "
             "| infill s | commit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['scene']} | {r['fit_steps']} | {r['lr'] if r['lr'] else '–'} | "
                     f"{r.get('wide_clouds', 0.0) if r['fit_steps'] else '–'} | "
                     f"{r.get('own_gaps', 0.0) if r['fit_steps'] else '–'} | {r['rmse']:.4g} | "
                     f"{r['crps']:.4g} | {r['coverage_90']:.3f} | {r['nll']:.3f} | {r['fit_s']:.0f} | "
                     f"{r['infill_s']:.0f} | {r.get('commit', '–')} |")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(rows_json({"header": text}, rows))


if __name__ == "__main__":
    main()
