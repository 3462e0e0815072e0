"""``geonp demo``: the embedded default job, offline, about a minute on 2 CPU cores.

Until gridded infill lands this is a synthetic round trip that exercises the
whole stack: train the translation-equivariant ``te-pt-tnp`` and the plain
``cnp`` on 1-D GP tasks, save both as safetensors, load them back, and score
them on held-out tasks at their training location and shifted by Δ = 1 (the
TE-TNP paper's test). The TE model's score does not move with Δ; the CNP's does.
Writes ``summary.json`` and a ``predictions.csv`` (one task: x, mean, 1-sigma).
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import torch

from geonp.data.synthetic import fixed_tasks, make_generator
from geonp.metrics import mean_and_stderr, task_scores
from geonp.models import load
from geonp.train import TrainConfig, resolve_device, train

DEMO_MODELS = ("te-pt-tnp", "cnp")
SHIFT = 1.0


def run_demo(out: str | Path = "geonp-demo", steps: int = 600, device: str = "auto", overwrite: bool = False,
             verbose: bool = True) -> dict:
    """Run the demo into folder ``out``; returns (and writes) the summary."""
    out = Path(out)
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if out.exists():
        if not overwrite:
            raise ValueError(f"output folder {out} exists: pass --overwrite or choose another -o")
        shutil.rmtree(out)
    dev = resolve_device(device)
    say = print if verbose else (lambda *a, **k: None)
    test = fixed_tasks(make_generator("gp"), 128, 32, seed=7)
    summary: dict = {"steps": steps, "device": str(dev), "models": {}}
    start = time.perf_counter()
    for name in DEMO_MODELS:
        say(f"training {name} ({steps} steps on GP tasks)...")
        cfg = TrainConfig(model=name, out_dir=str(out / name), preset="tiny", steps=steps, val_every=steps,
                          checkpoint_every=steps, log_every=max(1, steps // 10), val_tasks=64, device=str(dev))
        train(cfg, progress=verbose)
        model = load(out / name / "model.safetensors", device=dev)  # what a user would ship and reload
        ll = {f"{s:.1f}": mean_and_stderr(task_scores(model, test, dev, shift=s)) for s in (0.0, SHIFT)}
        summary["models"][name] = {"log_likelihood": ll}
    _write_predictions(out, load(out / DEMO_MODELS[0] / "model.safetensors", device=dev), test[0], dev)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    say(f"\nheld-out log-likelihood per target point (128 tasks; higher is better), {summary['wall_s']} s:")
    say(f"{'model':12s} {'Δ=0':>16s} {'Δ=' + str(SHIFT):>16s}")
    for name, rec in summary["models"].items():
        cells = [f"{m:7.3f} ± {se:.3f}" for m, se in rec["log_likelihood"].values()]
        say(f"{name:12s} {cells[0]:>16s} {cells[1]:>16s}")
    say(f"written: {out}/summary.json, {out}/predictions.csv, {out}/<model>/model.safetensors")
    return summary


@torch.no_grad()
def _write_predictions(out: Path, model, batch, device: torch.device) -> None:
    task = batch.task(0).to(device)
    xt = torch.linspace(-3, 3, 121, device=device)[None, :, None]
    dist = model.eval()(task.xc, task.yc, xt)
    with open(out / "predictions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["x", "mean", "std"])
        for x, m, s in zip(xt[0, :, 0].tolist(), dist.loc[0, :, 0].tolist(), dist.scale[0, :, 0].tolist()):
            writer.writerow([f"{x:.3f}", f"{m:.5f}", f"{s:.5f}"])
