"""Self-supervised windows: hide observed cells under synthetic clouds and learn to fill them.

``--fit-steps N`` fine-tunes the chosen model on the input cube itself before predicting: each
step draws windows of the same geometry infill uses, hides a cloud-shaped part of the observed
cells in the prediction region, and minimises the Gaussian negative log-likelihood of the hidden
values given the rest. The bundled weights are trained with the same windows
(``pipelines/release/pretrain.py``), so pretraining and fine-tuning see one task distribution, and
with one optimizer step (:func:`geonp.train_step.optimizer_step`), so they optimise one loss; the
resumable-run machinery of :mod:`geonp.train` (state files, logs, several processes) stays out of
a fill, which keeps its fine-tuned weights itself (:mod:`geonp.fill.prepare`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import dask
import numpy as np
import torch

from geonp.fill.field import Field
from geonp.fill.options import FitOptions
from geonp.models.base import NeuralProcess
from geonp.tasks.batch import Batch
from geonp.tasks.history import HistoryFold
from geonp.tasks.training import training_window
from geonp.tasks.windows import WindowSpec, WindowTask, collate_windows
from geonp.train_step import PlainAdamW, optimizer_step

#: The modules after the encoder, by attribute name, that ``FitOptions(scope="head")`` fine-tunes:
#: the local kriging head and what carries its mean and variance to sigma (te-pt-tnp), the decoder
#: and the likelihood (every transformer NP). Frozen, the encoder needs no gradient, so a step skips
#: the backward pass through its attention, the most costly part of a step on the CPU.
HEAD_MODULES = ("kriging", "kriging_in", "decoder", "head")


def head_parameters(model: NeuralProcess) -> list[torch.nn.Parameter]:
    """The parameters of ``model``'s :data:`HEAD_MODULES`; ValueError when it has none."""
    params = [p for name, p in model.named_parameters() if name.split(".")[0] in HEAD_MODULES]
    if not params:
        raise ValueError(f"fit scope 'head': {type(model).__name__} has no head to fine-tune alone "
                         f"(none of {', '.join(HEAD_MODULES)}); use scope 'all'")
    return params


def upper_parameters(model: NeuralProcess) -> list[torch.nn.Parameter]:
    """``model``'s parameters but those of its token embedding, what the first layer reads beside it
    (te-pt-tnp's pseudo-tokens and their initial locations) and the first entry of each of its
    top-level layer lists (the transformer NPs' encoder layers): ValueError for a model without
    such lists. Frozen, they need no gradient, so a step's backward pass stops at the second layer."""
    layer_lists = [name for name, module in model.named_children() if isinstance(module, torch.nn.ModuleList)]
    if not layer_lists:
        raise ValueError(f"fit scope 'upper': {type(model).__name__} has no list of encoder layers; "
                         "use scope 'all'")
    lower = {*LOWER_MODULES, *(f"{name}.0" for name in layer_lists)}
    return [p for name, p in model.named_parameters()
            if name.split(".")[0] not in lower and ".".join(name.split(".")[:2]) not in lower]


#: What the first layer reads, by attribute name, that ``FitOptions(scope="upper")`` keeps frozen
#: with it: the token embedding, te-pt-tnp's pseudo-tokens, their initial locations and Eq. 11's maps.
LOWER_MODULES = ("embed", "pseudo", "pseudo_offset", "init_q", "init_k")


#: :class:`FieldWindows` reads fields into memory whole, once, while their cells add up to at
#: most this many (128 MB as float64); the others a window's slab at a time. Each read of a lazy
#: array costs about 2 ms of dask's bookkeeping: the demo's 311 slab reads were 0.6 s of its 16 s fill.
IN_MEMORY_CELLS = 2**24


class FieldWindows:
    """Task source of fine-tuning: self-supervised windows cut from the cube's own fields.

    Its random stream is its own (seeded from the run's seed), not the trainer's: fine-tuning is
    short, its result is saved whole, and a given seed must give the same windows however the
    trainer's generator is used. ``own_gaps``: share of windows whose hidden cells copy the gap
    pattern of another place (any time step) of the same field, laid over the whole view, so that
    fine-tuning practises on gaps of the sizes the cube really has rather than on small synthetic
    clouds inside a clear halo.
    """

    def __init__(self, fields: list[Field], spec: WindowSpec, seed: int, dim_x: int,
                 elevation: np.ndarray | None = None, wide_clouds: float = FitOptions.wide_clouds,
                 own_gaps: float = FitOptions.own_gaps) -> None:
        self.fields, self.spec, self.elevation, self.wide_clouds = fields, spec, elevation, wide_clouds
        self.own_gaps = own_gaps
        self.dim_x, self.dim_y = dim_x, 1
        self.rng = np.random.default_rng([seed, 7919])
        # ``spec`` is fitted to the largest field; a smaller one (no time axis beside a cube that
        # has one) gets it clipped to its shape, as infill gives it (geonp.fill.plan.Plan.spec_for).
        self.largest = tuple(max(n) for n in zip(*(f.shape for f in fields))) if fields else None
        self._in_memory: dict[int, np.ndarray] = {}  # id(field) -> its values, for small fields

    def _values(self, f: Field) -> np.ndarray | None:
        """Field ``f``'s values in memory, ``[T, R, C]`` float64 (read on first use), or None
        once the fields held would exceed :data:`IN_MEMORY_CELLS` cells in all."""
        if id(f) not in self._in_memory:
            if f.data.size + sum(v.size for v in self._in_memory.values()) > IN_MEMORY_CELLS:
                return None
            with dask.config.set(scheduler="synchronous"):
                self._in_memory[id(f)] = np.asarray(f.data.values, np.float64)
        return self._in_memory[id(f)]

    def sample(self, batch_size: int, rng: torch.Generator | None = None) -> Batch:
        tasks: list[WindowTask] = []
        for _ in range(50 * batch_size):
            f = self.fields[int(self.rng.integers(len(self.fields)))]
            spec = self.spec if f.shape == self.largest else self.spec.fitted_to(f.shape)
            task = _draw(f, spec, self.rng, self.elevation, self.wide_clouds, self.own_gaps, self._values(f))
            if task is not None:
                tasks.append(task)
            if len(tasks) == batch_size:
                break
        if not tasks:
            raise ValueError("--fit-steps: the input has too few observed cells to draw fine-tuning windows")
        return collate_windows(tasks)

    def validation(self, num_tasks: int, batch_size: int, seed: int) -> list[Batch]:
        return []  # the fine-tuned model is judged by the evaluation, not by a held-out loss here


def finetune(model: NeuralProcess, fields: list[Field], spec: WindowSpec, device: torch.device,
             options: FitOptions | None = None, seed: int = 0, elevation: np.ndarray | None = None,
             say: Callable[[str], None] | None = None,
             on_step: Callable[[int, NeuralProcess, float], None] | None = None) -> NeuralProcess:
    """A fine-tuned copy of ``model`` after ``options.steps`` optimizer steps on windows of ``fields``.

    Adam (:class:`~geonp.train_step.PlainAdamW` without weight decay) at ``options.lr``, gradients clipped at norm 1, as
    training steps are (:func:`geonp.train_step.optimizer_step`). ``options.wide_clouds``: share of
    windows whose clouds span the whole view (see :func:`~geonp.tasks.training.training_window`);
    ``options.own_gaps``: share of windows hidden under the input's own gaps from elsewhere (see
    :class:`FieldWindows`); ``options.scope``: every weight, all but the first layer and what it
    reads (:func:`upper_parameters`), or the head's alone (:data:`HEAD_MODULES`). Windows come from
    fields held in memory up to :data:`IN_MEMORY_CELLS` cells in all, from a larger cube a slab at
    a time, so memory does not grow with the cube. Deterministic for a given seed: the first ``n``
    steps of a longer run are an ``n``-step run, so ``on_step(step, model, loss)`` (called after
    every step, ``model`` in training mode) can take snapshots for a fine-tuning curve in one run.
    ``model`` is unchanged.
    """
    options = FitOptions() if options is None else options
    every = max(1, options.steps // 5)
    losses: list[float] = []
    torch.manual_seed(seed)  # as a training run seeds before it starts: whatever draws from torch follows the seed
    tuned = copy.deepcopy(model).to(device).for_training()  # training mode, blocks sized for the device
    if options.scope != "all":  # frozen weights get no gradient, and Adam leaves them be
        chosen = head_parameters(tuned) if options.scope == "head" else upper_parameters(tuned)
        fitted = {id(p) for p in chosen}
        for p in tuned.parameters():
            p.requires_grad_(id(p) in fitted)
    opt = PlainAdamW(tuned.parameters(), options.lr)  # Adam, without torch.optim's import of torch._dynamo
    source = FieldWindows(fields, spec, seed, model.dim_x, elevation, options.wide_clouds, options.own_gaps)
    for step in range(1, options.steps + 1):
        losses.append(optimizer_step(tuned, opt, source.sample(options.batch_size), device, options.lr, 1.0))
        if on_step is not None:
            on_step(step, tuned, losses[-1])
        if say and step % every == 0:
            say(f"fine-tuning: step {step}/{options.steps}, NLL {np.mean(losses[-every:]):.3f}")
    for p in tuned.parameters():
        p.requires_grad_(True)
    return tuned.for_prediction()


def _draw(f: Field, spec: WindowSpec, rng: np.random.Generator, elevation: np.ndarray | None,
          wide_clouds: float = 0.0, own_gaps: float = 0.0, whole: np.ndarray | None = None) -> WindowTask | None:
    """One training window at a random place of field ``f``: cut from ``whole``, the field's
    values in memory, or (None) reading just the slab it needs."""

    def read(key: tuple[slice, ...]) -> np.ndarray:
        return whole[key].copy() if whole is not None else np.asarray(f.data[key].values, np.float64)

    size = [min(v, n) for v, n in zip(spec.view, f.shape)]

    def place() -> tuple[slice, ...]:
        return tuple(slice(s, s + z) for s, z in ((int(rng.integers(0, n - z + 1)), z) for n, z in zip(f.shape, size)))

    key = place()
    elev = None if elevation is None else elevation[key[1], key[2]]
    with dask.config.set(scheduler="synchronous"):
        values = read(key)
        if f.folds:  # hide the cells the covariates of the fold at the window's step were computed without
            folds = [HistoryFold(fold.hidden[key], fold.covariates[(slice(None), *key)]) for fold in f.folds]
            return training_window(values, f.valid_slab(key), spec, rng, f.spread, elev, folds=folds)
        donor = None
        if own_gaps > 0 and rng.random() < own_gaps:  # drawn only when asked: the stream stays as it was
            other = place()
            step = (slice(other[0].start, other[0].start + 1), *other[1:])  # one day's gaps
            donor = ~np.isfinite(read(step)[0]) & f.valid_slab(step)[0]
    return training_window(values, f.valid_slab(key), spec, rng, f.spread, elev, wide_clouds=wide_clouds,
                           gap_donor=donor, history=None if f.history is None else f.history[(slice(None), *key)])
