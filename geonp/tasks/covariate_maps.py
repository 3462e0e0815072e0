"""How covariate maps reach a model: flat maps where nothing is known, and the covariates that are
shares (the scene's ``nugget``), which a window hands over as they are and which the model must
take as its nugget. Light on purpose: the fill plan and the training loop import it without
:mod:`geonp.tasks.history`'s DINEOF and analog machinery."""

from __future__ import annotations

import numpy as np

#: The history covariates (geonp.tasks.history.HISTORY_COVARIATES) that are not in the field's units
#: but shares (0 to 1): a window gives them to a model as they are instead of standardised like its
#: values (:func:`unscaled_count`).
UNSCALED_COVARIATES = ("nugget",)
#: A ``nugget`` share below 0 tells te-pt-tnp's kriging head to keep its network's own nugget (the
#: one it was trained with) instead of taking a scene's: where nothing is known of the scene's
#: variogram, and where infill chose the network's on the input's own cells (:mod:`geonp.fill.nugget`).
#: Cells (time x rows x cols) of a field above which no history covariate is computed
#: (:func:`geonp.tasks.history.history_covariates`): DINEOF holds the whole stack in memory
#: (float64). Infill's own limit is ``FillOptions.max_history_cells``, by default this.
MAX_HISTORY_CELLS = 50_000_000
OWN_NUGGET = -1.0


def flat_covariates(count: int, shape: tuple[int, ...], value: float | list[float]) -> np.ndarray:
    """``count`` flat maps of ``shape`` holding ``value`` (one number, or one per map:
    :func:`flat_values`), as a read-only view of those numbers: a field too large for its history
    costs no memory for it."""
    per_map = np.broadcast_to(np.asarray(value, np.float32), (count,))
    return np.broadcast_to(per_map.reshape(count, *(1,) * len(shape)), (count, *shape))


def flat_values(names: list[str] | tuple[str, ...], mean: float) -> list[float]:
    """What each covariate holds where nothing is known: the field's ``mean`` (the drift is then the
    ordinary-kriging constant), :data:`OWN_NUGGET` (``nugget``: the network's own, as the head learned
    without one)."""
    return [OWN_NUGGET if name in UNSCALED_COVARIATES else mean for name in names]


def unscaled_count(names: list[str] | tuple[str, ...]) -> int:
    """How many of the covariates ``names`` are shares a window gives a model as they are
    (:data:`UNSCALED_COVARIATES`); they must be the last ones (ValueError otherwise)."""
    count = sum(name in UNSCALED_COVARIATES for name in names)
    if count and any(name not in UNSCALED_COVARIATES for name in names[len(names) - count:]):
        raise ValueError(f"covariates {list(names)}: {', '.join(UNSCALED_COVARIATES)} must come last")
    return count


def check_nugget_input(names: list[str] | tuple[str, ...], takes_nugget: bool, where: str) -> None:
    """ValueError (one line, naming ``where``) unless the covariates ``names`` end with ``nugget``
    exactly when the model takes its last covariate as the head's nugget (``kriging.nugget_input``):
    a share read as a drift, or a drift read as a share, would fill without a word of warning."""
    has = unscaled_count(names) > 0
    if has != bool(takes_nugget):
        raise ValueError(f"{where}: covariates {list(names)} " + (
            "end with the nugget share, which needs model_args kriging: {nugget_input: true}" if has else
            "lack the nugget share the model takes (kriging nugget_input); add nugget as the last covariate"))


def is_flat(maps: np.ndarray) -> bool:
    """Whether ``maps`` (``[P, T, R, C]`` or one ``[T, R, C]`` map) is :func:`flat_covariates`'
    view of one number per map (no history in it)."""
    return all(step == 0 for step in maps.strides[-3:])
