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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from geonp.atomic import write_text_atomic
from geonp.device import resolve_device
from geonp.metrics import task_log_likelihood, task_scores
from geonp.models import build, save
from geonp.models.base import NeuralProcess
from geonp.parallel import Group, setup, shutdown
from geonp.tasks.sources import make_task_source
from geonp.train_paths import check_paths
from geonp.train_state import initialise_from, load_state, rank_state, restore_rank, save_state


@dataclass
class TrainConfig:
    """Everything that defines a training run (YAML keys have the same names).

    Attributes:
        model: a registry name (``geonp models``), e.g. ``"te-pt-tnp"``.
        out_dir: the run's folder (checkpoints, log, final model); None: an in-memory run
            (fine-tuning) that writes nothing and cannot be resumed.
        preset: the architecture preset (``"paper"``, ``"small"``, ``"tiny"``).
        model_args: constructor arguments over the preset's (e.g. ``num_neighbours: 16``).
        data: the task source, a mapping with a ``name``: a synthetic generator (``gp``,
            ``sawtooth``, with its options) or ``windows`` (infill-shaped windows of synthetic
            and real fields: ``files``, ``synthetic``, ``real_clouds``, ``wide_clouds``, ``window``,
            ``covariates``, ``elevation``, ...).
        steps: optimizer steps in all (a resumed run continues up to this number).
        batch_size: tasks per step and per process.
        lr: AdamW learning rate, whatever the number of processes.
        weight_decay: AdamW weight decay.
        clip_grad_norm: gradients are clipped to this global norm.
        checkpoint_every: steps between resumable checkpoints (``state.safetensors``).
        log_every: steps between rows of ``log.csv``.
        val_every: steps between validations.
        val_tasks: validation tasks, from their own generator (0: no validation).
        seed: seeds the weights and the training stream.
        val_seed: seeds the validation tasks; must differ from ``seed``.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        time_budget_s: stop (with a checkpoint) after this many seconds; None: no limit.
        init_from: a checkpoint whose weights start the run: the weights it shares with the
            configured model are copied, new blocks keep their initialisation.
    """

    model: str
    out_dir: str | None  # None: an in-memory run (fine-tuning) that writes nothing
    preset: str = "small"
    model_args: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=lambda: {"name": "gp"})
    steps: int = 1000
    batch_size: int = 16
    lr: float = 5e-4
    weight_decay: float = 0.01
    clip_grad_norm: float = 0.5
    checkpoint_every: int = 500
    log_every: int = 50
    val_every: int = 500
    val_tasks: int = 256
    seed: int = 0
    val_seed: int = 1_000_003
    device: str = "auto"
    time_budget_s: float | None = None
    init_from: str | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "checkpoint_every", "log_every", "val_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"config: {name} must be >= 1, got {getattr(self, name)}")
        if int(self.val_tasks) < 0:
            raise ValueError(f"config: val_tasks must be >= 0 (0: no validation), got {self.val_tasks}")
        if self.lr <= 0 or self.clip_grad_norm <= 0:
            raise ValueError("config: lr and clip_grad_norm must be > 0")
        if self.val_seed == self.seed:
            raise ValueError("config: val_seed must differ from seed (validation never reuses the training stream)")
        if "name" not in self.data:
            raise ValueError("config: data needs a 'name' (windows, or a synthetic generator such as gp or sawtooth)")

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Read a training configuration from a YAML file.

        Args:
            path: the YAML file; its keys are the attribute names (``model`` and ``out_dir``
                are required).

        Returns:
            The validated configuration.

        Raises:
            ValueError: one line naming the file and the problem: missing file, bad YAML,
                unknown or missing keys, wrong types or values.
        """
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config {path}: no such file")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            problem = getattr(err, "problem", None) or "syntax"
            raise ValueError(f"config {path}: not valid YAML{at} ({problem})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"config {path}: expected a mapping of settings")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"config {path}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in ("model", "out_dir") if k not in raw]
        if missing:
            raise ValueError(f"config {path}: missing key(s) {', '.join(missing)}")
        for f in dataclasses.fields(cls):
            if f.name in raw and raw[f.name] is not None and not _of_type(raw[f.name], f.type):
                raise ValueError(f"config {path}: {f.name} must be {_TYPE_WORDS.get(f.type, f.type)}, "
                                 f"got {raw[f.name]!r}")
        try:
            return cls(**raw)
        except ValueError as err:
            raise ValueError(f"config {path}: {str(err).removeprefix('config: ')}") from None


#: The YAML types of TrainConfig's fields (annotations are strings under ``from __future__``).
_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "str | None": (str,), "float | None": (int, float),
          "dict[str, Any]": (dict,)}
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "str | None": "a string",
               "float | None": "a number", "dict[str, Any]": "a mapping"}


def _of_type(value: Any, annotation: str) -> bool:
    kinds = _TYPES.get(str(annotation))
    return kinds is None or (isinstance(value, kinds) and not isinstance(value, bool))


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (unwrapped from DistributedDataParallel).
        step: the last optimizer step.
        val_nll: the last validation NLL, nats per target (NaN without validation).
        out_dir: the run folder, or None for an in-memory run.
        wall_s: seconds the call took.
    """

    model: NeuralProcess
    step: int
    val_nll: float
    out_dir: Path | None
    wall_s: float


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
        else:  # continue training a given model (fine-tuning): a copy, the caller's stays as it was
            model = copy.deepcopy(model)
        self.model = model
        covariates = getattr(source, "covariates", [])
        if covariates and getattr(model, "kriging_covariates", 0) != len(covariates):
            raise ValueError(f"config: data covariates {covariates} need model_args kriging_covariates: "
                             f"{len(covariates)} (the model takes {getattr(model, 'kriging_covariates', 0)})")
        if not self.model.trainable:
            raise ValueError(f"model {cfg.model!r} has no trainable weights (its hyper-parameters are fitted per task)")
        if cfg.init_from is not None:
            self.initialised = initialise_from(self.model, cfg.init_from)
        self.model.to(self.device)
        self.net = group.wrap(self.model)  # what the loop calls: gradients averaged over ranks
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
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


def _loss(model: NeuralProcess, batch, device: torch.device) -> torch.Tensor:
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        dist = model(batch.xc, batch.yc, batch.xt, batch.mask_c, batch.mask_t)
    return -task_log_likelihood(dist, batch.yt, batch.mask_t).mean()


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

    The one training loop of geonp: ``geonp train`` and ``--fit-steps`` fine-tuning both run it.
    Under torchrun each process trains on its own tasks with DistributedDataParallel (see
    :mod:`geonp.parallel`).

    Args:
        config: a :class:`TrainConfig`, a dict of its fields, or a YAML file.
        resume: continue the run in ``config.out_dir`` exactly (refused when there is none).
        progress: show a progress bar with loss and tasks/s.
        model: train a copy of this model instead of building ``config.model`` (fine-tuning).
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
            loss = _loss(run.net, run.generator.sample(cfg.batch_size, run.rng), run.device)
            run.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_grad_norm)
            run.opt.step()
            run.step += 1
            run.elapsed = time.perf_counter() - start
            window_loss += loss.item()
            window_steps += 1
            bar.update(1)
            if on_step is not None:
                on_step(run.step, run.model, loss.item())
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
    return TrainResult(run.model, run.step, val_nll, run.out, run.elapsed)


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
        when no model was written (an in-memory run).
    """
    cfg = TrainConfig.from_yaml(path)
    if device is not None:
        cfg.device = device
    if steps is not None:
        cfg.steps = steps
    result = train(cfg, resume=resume, progress=progress)
    if result.out_dir is None or not (result.out_dir / "model.safetensors").exists():
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
