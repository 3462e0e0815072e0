"""Training: AdamW, gradient clipping, bf16 autocast on CUDA, safe checkpoints, resume.

``train(config)`` (or ``geonp train CONFIG.yaml``) trains one registry model on
tasks from a synthetic generator or on infill windows of real and synthetic fields
(``data: {name: windows, files: [{path, variable, region, time}, ...], ...}``, see
``geonp.tasks.sources``), the task encoding ``geonp infill`` uses. A run lives in ``out_dir``:

* ``state.safetensors`` - weights, optimizer state, step, RNG states (written
  atomically every ``checkpoint_every`` steps and at the end),
* ``model.safetensors`` - the final model, loadable with ``geonp.models.load``; its header
  records how the inputs were made (``inputs``: synthetic tasks, or infill windows in grid units
  with what ``geonp infill`` must feed them),
* ``log.csv`` - step, training loss, validation NLL, tasks/s, elapsed seconds,
* ``config.yaml`` - the configuration that produced it.

``resume=True`` continues the same run exactly: the same batches, the same
optimizer moments, so a run stopped and resumed ends with the weights an
uninterrupted run would have. Validation tasks come from their own generator
seeded with ``val_seed``, never from the training stream.

Several processes (``torchrun --nproc-per-node=G -m geonp.train CONFIG``, or ``geonp train
--ddp G``): each draws its own tasks and DistributedDataParallel averages the gradients, so a
step sees ``G * batch_size`` tasks; only rank 0 writes the files above, and the state holds
every rank's random streams, so a distributed run resumes exactly too (with the same ``G``).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from geonp.atomic import write_text_atomic
from geonp.device import resolve_device
from geonp.metrics import task_scores
from geonp.models import build, save
from geonp.models.base import NeuralProcess
from geonp.parallel import Group, setup, shutdown
from geonp.tasks.covariate_maps import check_nugget_input
from geonp.tasks.sources import make_task_source
from geonp.train_config import TrainConfig
from geonp.train_paths import check_paths
from geonp.train_state import initialise_from, load_state, rank_state, restore_rank, save_state
from geonp.train_step import optimizer, optimizer_step


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (unwrapped from DistributedDataParallel).
        step: the last optimizer step.
        val_nll: the last validation NLL, nats per target (NaN without validation).
        out_dir: the run folder, or None for an in-memory run.
        wall_s: seconds the call took.
        is_main: this process is rank 0 (the one that writes and reports), or trained alone.
    """

    model: NeuralProcess
    step: int
    val_nll: float
    out_dir: Path | None
    wall_s: float
    is_main: bool = True


class _Run:
    """State of one training run (kept small: the loop is in :func:`train`)."""

    def __init__(self, cfg: TrainConfig, group: Group, model: NeuralProcess | None, source: Any) -> None:
        self.cfg, self.group, self.device = cfg, group, group.device
        self.out = Path(cfg.out_dir) if cfg.out_dir is not None else None
        self.state_path = self.out / "state.safetensors" if self.out is not None else None
        torch.manual_seed(cfg.seed)  # before building: the initial weights follow the seed
        if source is None:
            source = make_task_source(**cfg.data)
        self.generator = source
        if model is None:
            model = build(cfg.model, source.dim_x, source.dim_y, preset=cfg.preset, **cfg.model_args)
        else:  # continue training a given model: a copy, the caller's stays as it was
            model = copy.deepcopy(model)
        self.model = model
        covariates = getattr(source, "covariates", [])
        if covariates and model.covariate_inputs != len(covariates):
            raise ValueError(f"config: data covariates {covariates} need model_args kriging: {{covariates: "
                             f"{len(covariates)}}} (the model takes {model.covariate_inputs})")
        if covariates:  # a fine-tuning source has none of its own: the infill checkpoint was checked
            check_nugget_input(covariates, getattr(model, "kriging_nugget_input", False), "config")
        if not self.model.trainable:
            raise ValueError(f"model {cfg.model!r} has no trainable weights (its hyper-parameters are fitted per task)")
        if cfg.init_from is not None:
            self.initialised = initialise_from(self.model, cfg.init_from)
        self.model.to(self.device)
        self.net = group.wrap(self.model)  # what the loop calls: gradients averaged over ranks
        self.opt = optimizer(self.model, cfg.lr, cfg.weight_decay)
        self.rng = torch.Generator().manual_seed(group.seed(cfg.seed))
        self.step, self.elapsed = 0, 0.0

    def save_state(self) -> None:
        """Every rank hands its random state to rank 0, which writes the file."""
        ranks = self.group.gather(rank_state(self.rng, self.device))
        if self.group.is_main and self.state_path is not None:
            save_state(self.state_path, self.model, self.opt, self.step, self.elapsed,
                       dataclasses.asdict(self.cfg), ranks)
        self.group.barrier()

    def load_state(self) -> None:
        self.step, self.elapsed, mine = load_state(self.state_path, self.model, self.opt, self.group.rank,
                                                   self.group.world)
        restore_rank(mine, self.rng, self.device)


_LOG_COLUMNS = ["step", "train_loss", "val_nll", "tasks_per_s", "elapsed_s"]


def _log_rows_up_to(path: Path, step: int) -> list[list[str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [r for r in rows if r and int(r[0]) <= step]


def evaluate_nll(model: NeuralProcess, batches: list, device: torch.device) -> float:
    """Mean negative log-likelihood per target point over a fixed list of batches."""
    return -task_scores(model, batches, device).mean().item()


def train(config: TrainConfig | dict | str | Path, resume: bool = False, progress: bool = True, *,
          model: NeuralProcess | None = None, source: Any = None,
          on_step: Callable[[int, NeuralProcess, float], None] | None = None) -> TrainResult:
    """Train the configured model; see the module docstring for the files written.

    ``geonp train`` runs it; ``--fit-steps`` fine-tuning takes the same optimizer step
    (:mod:`geonp.train_step`) without this loop's files and process group. Under torchrun each
    process trains on its own tasks with DistributedDataParallel (see :mod:`geonp.parallel`).

    Args:
        config: a :class:`TrainConfig`, a dict of its fields, or a YAML file.
        resume: continue the run in ``config.out_dir`` exactly (refused when there is none).
        progress: show a progress bar with loss and tasks/s.
        model: train a copy of this model instead of building ``config.model``.
        source: draw tasks from this task source instead of ``config.data``.
        on_step: called as ``on_step(step, model, loss)`` after every optimizer step (``model``
            in training mode).

    Returns:
        A :class:`TrainResult`: the trained model, the last step, the validation NLL (nats per
        target; NaN with ``val_tasks`` 0), the run folder (None when ``out_dir`` is None:
        nothing written) and the wall time in seconds.

    Raises:
        ValueError: one line: a bad config, a missing input, ``resume`` without a run or a new
            run over an existing one, CUDA asked for but absent.
    """
    if isinstance(config, (str, Path)):
        cfg = TrainConfig.from_yaml(config)
    elif isinstance(config, dict):
        cfg = TrainConfig(**config)
    else:
        cfg = config
    # Before anything is loaded or written; a given task source replaces the config's data.
    check_paths(cfg.out_dir, cfg.init_from, cfg.data if source is None else {})
    group = setup(resolve_device(cfg.device))
    try:
        return _train(_Run(cfg, group, model, source), resume, progress and group.is_main, on_step)
    finally:
        shutdown(group)


def _train(run: _Run, resume: bool, progress: bool,
           on_step: Callable[[int, NeuralProcess, float], None] | None) -> TrainResult:
    from tqdm.auto import tqdm

    cfg, group, writes = run.cfg, run.group, run.out is not None and run.group.is_main
    if run.state_path is not None and run.state_path.exists():
        if not resume:
            raise ValueError(f"{run.out} already holds a run: pass --resume to continue it or choose another out_dir")
        run.load_state()
    elif resume:
        raise ValueError(f"--resume given but {run.state_path} does not exist")
    val = run.generator.validation(cfg.val_tasks, cfg.batch_size, seed=cfg.val_seed) if cfg.val_tasks else []
    log = writer = None
    if writes:
        run.out.mkdir(parents=True, exist_ok=True)
        (run.out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        log_path = run.out / "log.csv"
        # Keep only log rows up to the checkpoint being resumed: rows written after it
        # belong to steps that are about to be run again.
        kept = _log_rows_up_to(log_path, run.step) if run.step > 0 else []
        # Rewritten whole-or-none, so a run killed as it resumes keeps its earlier rows.
        text = io.StringIO(newline="")
        csv.writer(text).writerows([_LOG_COLUMNS, *kept])
        write_text_atomic(log_path, text.getvalue())
        log = open(log_path, "a", newline="")
        writer = csv.writer(log)
    bar = tqdm(total=cfg.steps, initial=run.step, disable=not progress, desc=cfg.model, dynamic_ncols=True,
               file=sys.stderr)
    val_nll, window_loss, window_steps, window_start = float("nan"), 0.0, 0, time.perf_counter()
    start = time.perf_counter() - run.elapsed
    run.model.train()
    try:
        while run.step < cfg.steps:
            if cfg.time_budget_s is not None and group.any(time.perf_counter() - start >= cfg.time_budget_s):
                break
            loss = optimizer_step(run.model, run.opt, run.generator.sample(cfg.batch_size, run.rng), run.device,
                                  cfg.learning_rate(run.step), cfg.clip_grad_norm, net=run.net)
            run.step += 1
            run.elapsed = time.perf_counter() - start
            window_loss += loss
            window_steps += 1
            bar.update(1)
            if on_step is not None:
                on_step(run.step, run.model, loss)
            is_val = bool(val) and (run.step % cfg.val_every == 0 or run.step == cfg.steps)
            if is_val:
                val_nll = evaluate_nll(run.model, val, run.device)
            if run.step % cfg.log_every == 0 or is_val:
                mean_loss = group.mean(window_loss / window_steps)  # over every rank's batches
                rate = group.world * window_steps * cfg.batch_size / max(time.perf_counter() - window_start, 1e-9)
                if writer is not None:
                    writer.writerow([run.step, f"{mean_loss:.5f}", f"{val_nll:.5f}" if is_val else "",
                                     f"{rate:.1f}", f"{run.elapsed:.2f}"])
                    log.flush()
                bar.set_postfix(loss=f"{mean_loss:.3f}", tasks_s=f"{rate:.0f}")
                window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
            if run.out is not None and run.step % cfg.checkpoint_every == 0:
                run.save_state()
    finally:
        bar.close()
        if log is not None:
            log.close()
    val_nll = evaluate_nll(run.model, val, run.device) if val else float("nan")
    if run.out is not None:
        run.save_state()
    if writes:
        # How the inputs and values were scaled travels inside the checkpoint (``inputs``), so
        # infill and evaluate use it with what it was trained on, or refuse it.
        extra = {"step": run.step, "val_nll": val_nll, **getattr(run.generator, "checkpoint_meta", {})}
        save(run.model, run.out / "model.safetensors", extra=extra)
        (run.out / "summary.json").write_text(json.dumps(
            {"step": run.step, "val_nll": val_nll, "elapsed_s": run.elapsed, "device": str(run.device),
             "processes": group.world}, indent=2))
    group.barrier()  # the other ranks return once the files are in place
    return TrainResult(run.model, run.step, val_nll, run.out, run.elapsed, group.is_main)


def train_file(path: str | Path, *, device: str | None = None, steps: int | None = None, resume: bool = False,
               progress: bool = True) -> str | None:
    """Train from a YAML config with the command line's overrides (``geonp train`` and
    ``python -m geonp.train`` both run this).

    Args:
        path: the YAML configuration (see :class:`TrainConfig`).
        device: overrides the config's device.
        steps: overrides the config's total steps.
        resume: continue the run in the config's ``out_dir``.
        progress: show a progress bar.

    Returns:
        The line to print (model, steps, validation NLL, where the model was written), or None
        when no model was written (an in-memory run) or on a torchrun rank other than 0 (one
        line per run, not one per process).
    """
    cfg = TrainConfig.from_yaml(path)
    overrides = {"device": device, "steps": steps}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})  # checked again
    result = train(cfg, resume=resume, progress=progress)
    if not result.is_main or result.out_dir is None or not (result.out_dir / "model.safetensors").exists():
        return None
    return (f"trained {cfg.model} for {result.step} steps: validation NLL {result.val_nll:.4f}; "
            f"model written to {result.out_dir / 'model.safetensors'}")


def main(argv: list[str] | None = None) -> int:
    """``python -m geonp.train CONFIG [--resume]``: what torchrun starts in each process."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m geonp.train", description="train one model from a YAML "
                                     "config; under torchrun, data-parallel over its processes")
    parser.add_argument("config")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        line = train_file(args.config, device=args.device, steps=args.steps, resume=args.resume,
                          progress=not args.no_progress)
    except ValueError as err:
        print(f"geonp train: error: {err}", file=sys.stderr)
        return 2
    if line:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
