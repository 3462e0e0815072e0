"""Where training tasks come from: a synthetic generator or infill windows, behind one small interface.

A task source has ``dim_x``, ``dim_y``, ``sample(batch_size, rng) -> Batch``,
``validation(num_tasks, batch_size, seed) -> list[Batch]`` and ``checkpoint_meta``, the record
of its inputs that training writes into the checkpoint (``inputs.kind``: ``synthetic`` or
``windows``). A source draws all its randomness from ``sample``'s generator, so the trainer's
saved random state is all an exact resume needs. ``geonp train`` builds one from the config's
``data:`` mapping with ``make_task_source``.
"""

from __future__ import annotations

from typing import Any

import torch

from geonp.tasks.batch import Batch
from geonp.tasks.synthetic import fixed_tasks, make_generator


class SyntheticSource:
    """A synthetic generator (``gp``, ``sawtooth``, ...); validation from its own seeded generator."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.generator = make_generator(name, **kwargs)
        self.dim_x, self.dim_y = self.generator.dim_x, self.generator.dim_y
        # The checkpoint's record of what its inputs were (read by geonp infill and evaluate).
        self.checkpoint_meta = {"inputs": {"kind": "synthetic", "generator": name}}

    def sample(self, batch_size: int, rng: torch.Generator) -> Batch:
        return self.generator.sample(batch_size, rng)

    def validation(self, num_tasks: int, batch_size: int, seed: int) -> list[Batch]:
        return fixed_tasks(self.generator, num_tasks, batch_size, seed)


def make_task_source(name: str, **kwargs: Any) -> Any:
    """The task source a config's ``data:`` mapping names.

    Args:
        name: ``windows`` for infill windows of synthetic and real fields (the task encoding
            ``geonp infill`` uses, :mod:`geonp.tasks.window_source`), else a synthetic
            generator's name (``gp-se``, ``sawtooth``, ...).
        **kwargs: the source's options (:class:`~geonp.tasks.window_source.WindowSource`'s, or
            the generator's).

    Returns:
        An object with ``dim_x``, ``dim_y``, ``sample``, ``validation`` and ``checkpoint_meta``.
    """
    if name == "windows":  # infill-shaped windows (see geonp.tasks.window_source)
        from geonp.tasks.window_source import WindowSource

        return WindowSource(**kwargs)
    if name == "cube":  # configs written before the one task encoding
        raise ValueError("data: name: cube (tasks in a cube's normalised lat/lon/time) is no longer a task "
                         "source; train on windows of the cube: data: {name: windows, files: [{path, variable, "
                         "region, time}], elevation: DEM} (README, Training)")
    return SyntheticSource(name, **kwargs)
