"""Synthetic 1-D GP regression benchmark (TE-TNP paper, Table 5 layout).

Trains each model for a fixed number of steps (optionally also a wall-time limit) on GP tasks (SE / Matérn-5/2 /
periodic, Nc ~ U(1, 64), Nt = 128, xc ~ U(-2, 2), xt ~ U(-3, 3)), then reports
the mean test log-likelihood per target point ± standard error over test tasks
whose inputs are shifted by Δ ∈ {0, 0.2, ..., 1.0}.

Test tasks at every Δ are the same base tasks with all inputs shifted by Δ.
Because the generating GPs are stationary, a shifted task is an exact sample of
the shifted test distribution; reusing the base tasks makes the Δ columns a
paired comparison (differences between columns are not sampling noise).

    python -m pipelines.benchmarks.synthetic_gp --max-steps 2000 --preset small \
        --out pipelines/results/synthetic_gp_cpu.md

``--jobs N`` trains N models at once in subprocesses (useful on a GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from geonp.device import resolve_device
from geonp.metrics import mean_and_stderr, task_scores
from geonp.models import build
from geonp.tasks.synthetic import fixed_tasks, make_generator
from geonp.train import TrainConfig, train
from pipelines.provenance import git_commit, header

SHIFTS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TEST_SEED = 2_000_003  # distinct from training (0) and validation (1_000_003) streams
PAPER = {  # TE-TNP paper Table 5, full budget (500 epochs x 16,000 tasks), Δ = 0 and 1.0
    "te-pt-tnp": "-0.46 / -0.46 (M32)", "te-tnp": "-0.47 / -0.47", "tnp": "-0.48 / -0.57",
    "pt-tnp": "-0.48 / -0.63 (M32)", "cnp": "-0.69 / -1.08", "rcnp": "-0.58 / -0.58",
    "convcnp": "-0.46 / -0.46",
}


def evaluate(model, tasks, device: torch.device) -> dict[str, list[float]]:
    """Mean per-target log-likelihood ± s.e. over ``tasks`` at every shift in SHIFTS."""
    return {f"{s:.1f}": list(mean_and_stderr(task_scores(model, tasks, device, shift=s))) for s in SHIFTS}


def run_one(args: argparse.Namespace, name: str) -> dict:
    """Train (unless ``gp``) and evaluate one model; returns its JSON record."""
    device = resolve_device(args.device)
    tasks = fixed_tasks(make_generator("gp"), args.test_tasks, 16, seed=TEST_SEED)
    start = time.perf_counter()
    if name == "gp":
        # Per-task fits of small matrices: the CPU beats a GPU's launch overheads here.
        device = torch.device("cpu")
        tasks = tasks[: max(1, args.gp_tasks // 16)]
        model, steps, train_s = build("gp", 1, 1, fit_steps=args.gp_fit_steps).to(device), 0, 0.0
    else:
        cfg = TrainConfig(model=name, out_dir=str(Path(args.run_dir) / name), preset=args.preset,
                          data={"name": "gp"}, steps=args.max_steps, time_budget_s=args.budget_s,
                          checkpoint_every=1000, val_every=1000, log_every=100, val_tasks=128,
                          device=args.device, batch_size=args.batch_size)
        result = train(cfg, resume=Path(cfg.out_dir, "state.safetensors").exists(), progress=False)
        model, steps, train_s = result.model, result.step, result.wall_s
    ll = evaluate(model, tasks, device)
    return {"model": name, "preset": "paper" if name == "gp" else args.preset, "steps": steps,
            "train_s": round(train_s, 1), "eval_s": round(time.perf_counter() - start - train_s, 1),
            "num_test_tasks": sum(len(b) for b in tasks), "log_likelihood": ll, "commit": git_commit()}


def write_table(args: argparse.Namespace, records: list[dict]) -> str:
    device = resolve_device(args.device)
    limit = f" or {args.budget_s:.0f} s, whichever comes first" if args.budget_s else ""
    budget = (f"{args.max_steps} training steps per model{limit}, batch {args.batch_size} "
              f"({args.max_steps * args.batch_size} tasks), preset `{args.preset}`; "
              f"gp: {args.gp_fit_steps} Adam steps per task, fitted on CPU")
    lines = [header("Synthetic 1-D GP regression: test log-likelihood vs input shift Δ", device, budget), "",
             "Mean log-likelihood per target point (nats, higher is better) ± standard error over test tasks. "
             "The commit column says which run produced each row (`--reuse` keeps rows of earlier runs); "
             "train s was measured under that run's load.", "",
             "| model | steps | train s | tasks | " + " | ".join(f"Δ={s:.1f}" for s in SHIFTS)
             + " | paper Δ=0 / Δ=1 | commit |",
             "|---" * (6 + len(SHIFTS)) + "|"]
    for r in records:
        cells = [f"{m:.3f} ± {se:.3f}" for m, se in (r["log_likelihood"][f"{s:.1f}"] for s in SHIFTS)]
        lines.append(f"| {r['model']} | {r['steps']} | {r['train_s']:.0f} | {r['num_test_tasks']} | "
                     + " | ".join(cells) + f" | {PAPER.get(r['model'], '–')} | {r.get('commit', '–')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["te-pt-tnp", "te-tnp", "tnp", "pt-tnp", "cnp", "rcnp", "gp"])
    p.add_argument("--preset", default="small")
    p.add_argument("--budget-s", type=float, default=None, help="training wall-time limit per model")
    p.add_argument("--max-steps", type=int, default=2000, help="training steps per model")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--test-tasks", type=int, default=1024)
    p.add_argument("--gp-tasks", type=int, default=128, help="test tasks for the (slow) exact GP")
    p.add_argument("--gp-fit-steps", type=int, default=200)
    p.add_argument("--device", default="auto")
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (subprocesses)")
    p.add_argument("--run-dir", default="runs/synthetic_gp")
    p.add_argument("--out", default="pipelines/results/synthetic_gp_cpu.md")
    p.add_argument("--reuse", action="store_true",
                   help="keep the rows of models whose record already exists in --run-dir (no retraining)")
    p.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.json_only:  # worker mode: one model, record to JSON
        (name,) = args.models
        (run_dir / f"{name}.json").write_text(json.dumps(run_one(args, name), indent=2))
        return
    pending = [m for m in args.models if not (args.reuse and (run_dir / f"{m}.json").exists())]
    running: dict[subprocess.Popen, str] = {}
    failed = []
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            running[subprocess.Popen(_worker_command(args, name))] = name
        time.sleep(1.0)
        for proc in [p for p in running if p.poll() is not None]:
            name = running.pop(proc)
            if proc.returncode != 0:
                failed.append(name)
    records = [json.loads((run_dir / f"{m}.json").read_text()) for m in args.models
               if (run_dir / f"{m}.json").exists()]
    text = write_table(args, records)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(records, indent=2))
    print(text)
    if failed:
        sys.exit(f"models that failed: {', '.join(failed)}")


def _worker_command(args: argparse.Namespace, name: str) -> list[str]:
    """The subprocess that trains and scores one model with the parent's settings."""
    cmd = [sys.executable, "-m", "pipelines.benchmarks.synthetic_gp", "--json-only", "--models", name]
    for key, value in vars(args).items():
        if key not in ("models", "json_only", "jobs", "reuse") and value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


if __name__ == "__main__":
    main()
