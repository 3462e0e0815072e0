"""Self-supervised windows: hide observed cells under synthetic clouds and learn to fill them.

``--fit-steps N`` fine-tunes the chosen model on the input cube itself before predicting: each
step draws windows of the same geometry infill uses, hides a cloud-shaped part of the observed
cells in the prediction region, and minimises the Gaussian negative log-likelihood of the hidden
values given the rest. The bundled weights are trained with the same windows
(``pipelines/pretrain.py``), so pretraining and fine-tuning see one task distribution.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import dask
import numpy as np
import torch

from geonp.data.windows import WindowSpec, WindowTask, collate_windows, training_window
from geonp.fill import FIT_LR
from geonp.fill.field import Field
from geonp.fill.predictor import PREDICT_BLOCK_ELEMS, TRAIN_BLOCK_ELEMS
from geonp.models.base import NeuralProcess
from geonp.models.te_attention import set_block_elems


def batch_loss(model: NeuralProcess, tasks: list[WindowTask], device: torch.device | str) -> torch.Tensor:
    """Mean negative log-likelihood per target point of a batch of training windows."""
    b = collate_windows(tasks, device)
    nll = -model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t).log_prob(b.yt)[..., 0]  # [B, Nt]
    return (nll * b.mask_t).sum() / b.mask_t.sum()


def finetune(model: NeuralProcess, fields: list[Field], spec: WindowSpec, steps: int, device: torch.device,
             seed: int = 0, elevation: np.ndarray | None = None, say: Callable[[str], None] | None = None,
             batch_size: int = 8, lr: float = FIT_LR,
             on_step: Callable[[int, NeuralProcess], None] | None = None) -> NeuralProcess:
    """A fine-tuned copy of ``model`` after ``steps`` Adam steps on windows of ``fields``.

    Each window reads only its own slab of the cube, so memory does not grow with the cube.
    Deterministic for a given seed: the first ``n`` steps of a longer run are an ``n``-step run,
    so ``on_step(step, model)`` (called after every step, ``model`` in training mode) can take
    snapshots for a fine-tuning curve in one run.
    """
    rng = np.random.default_rng([seed, 7919])
    torch.manual_seed(seed)
    tuned = set_block_elems(copy.deepcopy(model).to(device).train(), TRAIN_BLOCK_ELEMS)
    opt = torch.optim.Adam(tuned.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        tasks: list[WindowTask] = []
        for _ in range(50 * batch_size):
            task = _draw(fields[int(rng.integers(len(fields)))], spec, rng, elevation)
            if task is not None:
                tasks.append(task)
            if len(tasks) == batch_size:
                break
        if not tasks:
            raise ValueError("--fit-steps: the input has too few observed cells to draw fine-tuning windows")
        opt.zero_grad()
        loss = batch_loss(tuned, tasks, device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step + 1, tuned)
        if say and (step + 1) % max(1, steps // 5) == 0:
            say(f"fine-tuning: step {step + 1}/{steps}, NLL {np.mean(losses[-max(1, steps // 5):]):.3f}")
    return set_block_elems(tuned.eval(), PREDICT_BLOCK_ELEMS)


def _draw(f: Field, spec: WindowSpec, rng: np.random.Generator, elevation: np.ndarray | None) -> WindowTask | None:
    """One training window at a random place of field ``f``, reading just the slab it needs."""
    size = [min(v, n) for v, n in zip(spec.view, f.shape)]
    key = tuple(slice(s, s + z) for s, z in ((int(rng.integers(0, n - z + 1)), z) for n, z in zip(f.shape, size)))
    with dask.config.set(scheduler="synchronous"):
        values = np.asarray(f.data[key].values, np.float64)
    elev = None if elevation is None else elevation[key[1], key[2]]
    return training_window(values, f.valid_slab(key), spec, rng, f.spread, elev)
