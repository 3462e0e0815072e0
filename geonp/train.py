"""Training: AdamW, gradient clipping, bf16 autocast on CUDA, safe checkpoints, resume.

``train(config)`` (or ``geonp train CONFIG.yaml``) trains one registry model on
tasks from a synthetic generator or from a cube (``data: {name: cube, path: ...,
variables: [...], window: ..., region: ...}``, see ``geonp.data.sources``). A run lives
in ``out_dir``:

* ``state.safetensors`` - weights, optimizer state, step, RNG states (written
  atomically every ``checkpoint_every`` steps and at the end),
* ``model.safetensors`` - the final model, loadable with ``geonp.models.load``,
* ``model.normalisation.json`` - for a cube, the units the model works in,
* ``log.csv`` - step, training loss, validation NLL, tasks/s, elapsed seconds,
* ``config.yaml`` - the configuration that produced it.

``resume=True`` continues the same run exactly: the same batches, the same
optimizer moments, so a run stopped and resumed ends with the weights an
uninterrupted run would have. Validation tasks come from their own generator
seeded with ``val_seed``, never from the training stream.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from geonp.checkpoint import read_checkpoint, write_checkpoint
from geonp.data.sources import make_task_source
from geonp.metrics import task_log_likelihood, task_scores
from geonp.models import build, save
from geonp.models.base import NeuralProcess
from geonp.models.registry import same_model


@dataclass
class TrainConfig:
    """Everything that defines a training run (YAML keys have the same names)."""

    model: str
    out_dir: str
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
        for name in ("steps", "batch_size", "checkpoint_every", "log_every", "val_every", "val_tasks"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"config: {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.clip_grad_norm <= 0:
            raise ValueError("config: lr and clip_grad_norm must be > 0")
        if self.val_seed == self.seed:
            raise ValueError("config: val_seed must differ from seed (validation never reuses the training stream)")
        if "name" not in self.data:
            raise ValueError("config: data needs a 'name' (a synthetic generator, e.g. gp or sawtooth, or cube)")

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Read a YAML file; unknown keys are an error naming the key and the file."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config {path}: no such file")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"config {path}: not valid YAML ({err})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"config {path}: expected a mapping of settings")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"config {path}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in ("model", "out_dir") if k not in raw]
        if missing:
            raise ValueError(f"config {path}: missing key(s) {', '.join(missing)}")
        return cls(**raw)


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA when present else CPU; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but no CUDA GPU is available (use --device cpu or auto)")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    return torch.device(device)


@dataclass
class TrainResult:
    model: NeuralProcess
    step: int
    val_nll: float
    out_dir: Path
    wall_s: float


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    # Flatten optimizer state into named tensors plus JSON, so no pickle is needed.
    state = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


class _Run:
    """State of one training run and its files (kept small: the loop is in :func:`train`)."""

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.out = Path(cfg.out_dir)
        self.state_path = self.out / "state.safetensors"
        torch.manual_seed(cfg.seed)  # before building: the initial weights follow the seed
        data_args = {k: v for k, v in cfg.data.items() if k != "name"}
        data_args.setdefault("seed", cfg.seed)
        self.generator = make_task_source(cfg.data["name"], batch_size=cfg.batch_size, **data_args)
        self.model = build(cfg.model, self.generator.dim_x, self.generator.dim_y, preset=cfg.preset, **cfg.model_args)
        if not self.model.trainable:
            raise ValueError(f"model {cfg.model!r} has no trainable weights (its hyper-parameters are fitted per task)")
        if cfg.init_from is not None:
            self.initialised = initialise_from(self.model, cfg.init_from)
        self.model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.step, self.elapsed = 0, 0.0

    def save_state(self) -> None:
        opt_tensors, opt_meta = _optimizer_tensors(self.opt)
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        tensors.update(opt_tensors)
        tensors["rng.data"] = self.rng.get_state()
        tensors["rng.torch"] = torch.get_rng_state()
        if self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        meta = {"kind": "train-state", "model": self.model.config, "step": self.step, "elapsed_s": self.elapsed,
                "optimizer": opt_meta, "train_config": dataclasses.asdict(self.cfg)}
        if hasattr(self.generator, "state_dict"):  # a cube stream: where it is, to continue it exactly
            meta["data_state"] = self.generator.state_dict()
        write_checkpoint(self.state_path, tensors, meta)

    def load_state(self) -> None:
        tensors, meta = read_checkpoint(self.state_path)
        if meta.get("kind") != "train-state":
            raise ValueError(f"checkpoint {self.state_path}: not a training state")
        if not same_model(meta["model"], self.model.config):
            raise ValueError(f"checkpoint {self.state_path}: was written for a different model configuration")
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        _restore_optimizer(self.opt, tensors, meta["optimizer"])
        self.rng.set_state(tensors["rng.data"])
        torch.set_rng_state(tensors["rng.torch"])
        if "rng.cuda" in tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(tensors["rng.cuda"], self.device)
        self.step, self.elapsed = int(meta["step"]), float(meta["elapsed_s"])
        if "data_state" in meta and hasattr(self.generator, "load_state_dict"):
            self.generator.load_state_dict(meta["data_state"])


def initialise_from(model: NeuralProcess, path: str | Path) -> list[str]:
    """Copy into ``model`` every weight of checkpoint ``path`` with the same name and shape.

    For growing a trained model (e.g. adding local attention blocks, which start as the
    identity): the weights the checkpoint lacks keep their fresh initialisation. Returns the
    names of the weights copied. Raises ValueError (one line) for a missing file, another model
    or nothing in common.
    """
    from geonp.models.registry import load_with_meta

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config init_from: {path}: no such file")
    source, meta = load_with_meta(path)
    held = meta["model"]["name"]
    if held != model.registry_name:
        raise ValueError(f"config init_from: {path} holds model {held!r}, not {model.registry_name!r}")
    own = model.state_dict()
    copied = {k: v for k, v in source.state_dict().items() if k in own and own[k].shape == v.shape}
    if not copied:
        raise ValueError(f"config init_from: {path} shares no weight with the configured model")
    model.load_state_dict(copied, strict=False)
    return sorted(copied)


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


def train(config: TrainConfig | dict | str | Path, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train the configured model; see the module docstring for the files written."""
    from tqdm.auto import tqdm

    if isinstance(config, (str, Path)):
        cfg = TrainConfig.from_yaml(config)
    elif isinstance(config, dict):
        cfg = TrainConfig(**config)
    else:
        cfg = config
    run = _Run(cfg, resolve_device(cfg.device))
    if run.state_path.exists():
        if not resume:
            raise ValueError(f"{run.out} already holds a run: pass --resume to continue it or choose another out_dir")
        run.load_state()
    elif resume:
        raise ValueError(f"--resume given but {run.state_path} does not exist")
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    val = run.generator.validation(cfg.val_tasks, cfg.batch_size, seed=cfg.val_seed)
    log_path = run.out / "log.csv"
    # Keep only log rows up to the checkpoint being resumed: rows written after it
    # belong to steps that are about to be run again.
    kept = _log_rows_up_to(log_path, run.step) if run.step > 0 else []
    log = open(log_path, "w", newline="")
    writer = csv.writer(log)
    writer.writerow(_LOG_COLUMNS)
    writer.writerows(kept)
    bar = tqdm(total=cfg.steps, initial=run.step, disable=not progress, desc=cfg.model, dynamic_ncols=True)
    val_nll, window_loss, window_steps, window_start = float("nan"), 0.0, 0, time.perf_counter()
    start = time.perf_counter() - run.elapsed
    run.model.train()
    try:
        while run.step < cfg.steps:
            if cfg.time_budget_s is not None and time.perf_counter() - start >= cfg.time_budget_s:
                break
            loss = _loss(run.model, run.generator.sample(cfg.batch_size, run.rng), run.device)
            run.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_grad_norm)
            run.opt.step()
            run.step += 1
            run.elapsed = time.perf_counter() - start
            window_loss += loss.item()
            window_steps += 1
            bar.update(1)
            is_val = run.step % cfg.val_every == 0 or run.step == cfg.steps
            if is_val:
                val_nll = evaluate_nll(run.model, val, run.device)
            if run.step % cfg.log_every == 0 or is_val:
                rate = window_steps * cfg.batch_size / max(time.perf_counter() - window_start, 1e-9)
                writer.writerow([run.step, f"{window_loss / window_steps:.5f}",
                                 f"{val_nll:.5f}" if is_val else "", f"{rate:.1f}", f"{run.elapsed:.2f}"])
                log.flush()
                bar.set_postfix(loss=f"{loss.item():.3f}", tasks_s=f"{rate:.0f}")
                window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
            if run.step % cfg.checkpoint_every == 0:
                run.save_state()
    finally:
        bar.close()
        log.close()
    val_nll = evaluate_nll(run.model, val, run.device)
    run.save_state()
    # A source may describe how its inputs were scaled (infill windows do); it travels with the weights.
    extra = {"step": run.step, "val_nll": val_nll, **getattr(run.generator, "checkpoint_meta", {})}
    save(run.model, run.out / "model.safetensors", extra=extra)
    if hasattr(run.generator, "normaliser"):  # cube units <-> model units, beside the weights
        run.generator.normaliser.save(run.out / "model.safetensors")
    (run.out / "summary.json").write_text(json.dumps(
        {"step": run.step, "val_nll": val_nll, "elapsed_s": run.elapsed, "device": str(run.device)}, indent=2))
    return TrainResult(run.model, run.step, val_nll, run.out, run.elapsed)
