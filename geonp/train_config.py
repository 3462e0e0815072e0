"""A training run's configuration: :class:`TrainConfig`, read from YAML and checked field by field.

``geonp train CONFIG.yaml`` reads one with :meth:`TrainConfig.from_yaml`: unknown keys, missing
ones, wrong types and impossible values are each refused with one line naming the file and the
key, before anything is read or written (the paths it names are checked by
:mod:`geonp.train_paths`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class TrainConfig:
    """Everything that defines a training run (YAML keys have the same names).

    Attributes:
        model: a registry name (``geonp models``), e.g. ``"te-pt-tnp"``.
        out_dir: the run's folder (checkpoints, log, final model); None: an in-memory run
            (fine-tuning) that writes nothing and cannot be resumed.
        preset: the architecture preset (``"paper"``, ``"small"``, ``"tiny"``).
        model_args: constructor arguments over the preset's (e.g. ``local_attention: {neighbours: 16}``).
        data: the task source, a mapping with a ``name``: a synthetic generator (``gp``,
            ``sawtooth``, with its options) or ``windows`` (infill-shaped windows of synthetic
            and real fields: ``files``, ``synthetic``, ``real_clouds``, ``wide_clouds``, ``window``,
            ``covariates``, ``elevation``, ...).
        steps: optimizer steps in all (a resumed run continues up to this number).
        batch_size: tasks per step and per process.
        lr: AdamW learning rate, whatever the number of processes.
        lr_decay_steps: the last this many of ``steps`` lower the learning rate linearly from
            ``lr`` towards zero (the final step takes ``lr / lr_decay_steps``); 0: ``lr``
            throughout. A run at a constant rate can so be extended, then settled: the rate is
            a function of the step alone, so a resumed run takes the same rates.
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
    lr_decay_steps: int = 0
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
        if not 0 <= int(self.lr_decay_steps) <= int(self.steps):
            raise ValueError(f"config: lr_decay_steps must be between 0 and steps ({self.steps}), "
                             f"got {self.lr_decay_steps}")
        if int(self.val_tasks) < 0:
            raise ValueError(f"config: val_tasks must be >= 0 (0: no validation), got {self.val_tasks}")
        if self.lr <= 0 or self.clip_grad_norm <= 0:
            raise ValueError("config: lr and clip_grad_norm must be > 0")
        if self.val_seed == self.seed:
            raise ValueError("config: val_seed must differ from seed (validation never reuses the training stream)")
        if "name" not in self.data:
            raise ValueError("config: data needs a 'name' (windows, or a synthetic generator such as gp or sawtooth)")

    def learning_rate(self, done: int) -> float:
        """The learning rate of one optimizer step.

        Args:
            done: optimizer steps already taken (0 for the first step).

        Returns:
            ``lr``, or less over the last ``lr_decay_steps`` steps (``lr / lr_decay_steps`` at the
            final one).
        """
        left = int(self.steps) - int(done)
        if self.lr_decay_steps and left <= self.lr_decay_steps:
            return self.lr * max(left, 1) / self.lr_decay_steps
        return self.lr

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
