"""What infill computes from a field's whole stack before its blocks: history covariates for a
model that takes them, and the fill of a stack method (``dineof``, ``kriging``).

Every model of :mod:`geonp.models` fills a window from the cells around it, so a cube streams
through infill block by block. What the field's other steps say about a cell is different: it
comes from the whole stack (:mod:`geonp.tasks.history`). It is computed once per field when the plan is
made and kept on the :class:`~geonp.fill.field.Field`; blocks then read their part, through the
same output, resume and layout machinery. The stack must fit in memory
(:data:`geonp.tasks.history.MAX_HISTORY_CELLS` for DINEOF: beyond it a model's covariates are flat and
``dineof`` is refused with one line, as is a field with fewer than three observed steps).
``kriging`` works scene by scene, a step in memory at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from geonp.fill.blocks import BlockResult, compose, read_block
from geonp.fill.field import Field
from geonp.fill.predictor import STACK_METHODS
from geonp.tasks.covariate_maps import MAX_HISTORY_CELLS

if TYPE_CHECKING:
    import torch


def add_history(field: Field, covariates: list[str], seed: int = 0, max_cells: int = MAX_HISTORY_CELLS,
                device: torch.device | str | None = None) -> str:
    """Keep on ``field`` the history covariates a model takes (:func:`geonp.tasks.history.history_covariates`),
    flat maps for a field of more than ``max_cells`` cells (``FillOptions.max_history_cells``);
    returns a few words on what they are (for provenance). ``device``: the fill's (DINEOF's
    iterations run on it when it is a GPU, :func:`dineof_device`)."""
    from geonp.tasks.covariate_maps import flat_covariates, flat_values
    from geonp.tasks.history import history_covariates, no_history_words

    cells = int(np.prod(field.shape))
    if cells > max_cells:  # decided before reading: the field is never loaded whole
        field.history = flat_covariates(len(covariates), field.shape, flat_values(covariates, field.mean))
        return f"{field.label}: {no_history_words(f'the field has {cells:,} cells, more than {max_cells:,}')}"
    field.history, what = history_covariates(field.whole(), field.valid, covariates, rng=_rng(seed),
                                             max_cells=max_cells, device=dineof_device(device))
    return f"{field.label}: {what}"


def add_history_folds(field: Field, covariates: list[str], folds: int, seed: int = 0,
                      max_cells: int = MAX_HISTORY_CELLS, device: torch.device | str | None = None) -> None:
    """Keep on ``field`` its :func:`geonp.tasks.history.history_folds` (for fine-tuning), when it has
    a history its covariates come from; ``folds`` DINEOF runs more (0: none, fine-tuning hides
    cells under clouds as for a model without covariates), on ``device`` as :func:`add_history`'s."""
    from geonp.tasks.covariate_maps import OWN_NUGGET, is_flat, unscaled_count
    from geonp.tasks.history import has_history, history_folds

    if folds == 0 or field.history is None or is_flat(field.history) or field.history_dropped:
        return  # no history (flat maps, or dropped): nothing a window could learn to overtrust
    values = field.whole()
    if not has_history(values, field.valid, max_cells):  # one scene whose only covariate is its own (coarse)
        return
    field.folds = history_folds(values, field.valid, covariates, folds, rng=np.random.default_rng([seed, 6151]),
                                device=dineof_device(device))
    if unscaled_count(covariates) and float(field.history[-1].flat[0]) == OWN_NUGGET:
        for fold in field.folds:  # the network's own nugget was chosen for the field (geonp.fill.nugget)
            fold.covariates[-1] = OWN_NUGGET


def reconstruct(field: Field, name: str, seed: int = 0, elevation: np.ndarray | None = None,
                max_cells: int = MAX_HISTORY_CELLS, device: torch.device | str | None = None) -> str:
    """Run stack method ``name`` on ``field`` and keep its mean and 1-sigma on the field; returns
    a few words on what it did (for provenance).

    ``dineof``: :func:`geonp.tasks.dineof.dineof` over the field's steps; ``kriging``:
    :func:`geonp.models.field_kriging.krige_stack`, each step a scene of its own, with
    ``elevation [R, C]`` (m, None: none) as an external drift where the scene's check prefers it;
    ``max_cells``: the largest stack DINEOF takes (``FillOptions.max_history_cells``); ``device``: the
    fill's, as :func:`add_history`'s.

    Raises:
        ValueError: one line naming the field: too large for memory, or (dineof) too short a history.
    """
    from geonp.models.field_kriging import krige_stack
    from geonp.tasks.dineof import dineof

    if name not in STACK_METHODS:
        raise ValueError(f"--model {name}: not a stack method ({', '.join(STACK_METHODS)})")
    if field.observed == 0:
        return f"{field.label}: nothing observed"
    if name == "dineof" and np.prod(field.shape) > max_cells:
        raise ValueError(f"--model {name}: {field.label} has {np.prod(field.shape):,} cells; DINEOF holds the "
                         f"whole stack in memory and takes at most {max_cells:,} (crop it, or use a window "
                         "model such as te-pt-tnp)")
    values, rng = field.whole(), _rng(seed)
    if name == "kriging":
        mean, std, what = krige_stack(values, field.valid, rng=rng,
                                      drift_maps=None if elevation is None else elevation[None])
        field.stack = (mean.astype(np.float32), std.astype(np.float32))
        return f"{field.label}: {what}"
    try:
        rec = dineof(values, field.valid, rng=rng, device=dineof_device(device))
    except ValueError as err:
        raise ValueError(f"--model {name}: {field.label}: {err}") from None
    field.stack = (rec.mean.astype(np.float32), rec.std.astype(np.float32))
    return f"{field.label}: DINEOF, {rec.modes} modes, cross-validation RMSE {rec.cv_rmse[rec.modes]:.4g}"


def dineof_device(device: torch.device | str | None) -> torch.device | None:
    """Where a fill on ``device`` runs DINEOF's iterations: on a GPU there (float64; its index
    pinned, so the history folds' threads use the same GPU), else None, NumPy on the host, whose fill
    the scene suite's tables were measured with. Torch's iterations on this CPU fill the same to 1e-7 K
    and are faster or slower by stack (``dineof_speed_cpu.md``: ERA5's hourly fold 17.1 against
    26.9 s with torch's two threads, WFDE5's 9.8 against 8.0 s)."""
    if device is None:
        return None
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def _rng(seed: int) -> np.random.Generator:
    """The whole-stack passes' randomness (cross-validation cells): the run's seed, its own stream."""
    return np.random.default_rng([seed, 4099])


def stack_block(field: Field, key: tuple[slice, slice, slice]) -> BlockResult:
    """The cells ``key`` of ``field``: observed as they are, gaps from its reconstruction."""
    values, valid, observed, missing = read_block(field, key)
    if field.stack is None:  # a field with nothing observed: left as it is
        none = np.zeros(values.shape)
        return compose(values, valid, observed, missing, none, none, none, field)
    mean, std = (np.asarray(a[key], np.float64) for a in field.stack)
    covered = np.isfinite(mean).astype(np.float64)
    mean, std = np.nan_to_num(mean), np.nan_to_num(std)
    return compose(values, valid, observed, missing, covered, covered * mean, covered * (std**2 + mean**2), field)
