"""Where training tasks come from: a synthetic generator or a cube, behind one small interface.

A task source has ``dim_x``, ``dim_y``, ``sample(batch_size, rng) -> Batch`` and
``validation(num_tasks, batch_size, seed) -> list[Batch]`` and ``checkpoint_meta``, the record
of its inputs that training writes into the checkpoint (``inputs.kind``: ``synthetic``,
``cube`` with the normalisation, or ``windows``); a cube source also has
``state_dict``/``load_state_dict`` (its stream position, for exact resume). ``geonp train`` builds one from the config's
``data:`` mapping with ``make_task_source``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from geonp.data.batch import Batch
from geonp.data.regions import select_time
from geonp.data.synthetic import fixed_tasks, make_generator


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


class CubeSource:
    """Tasks from a gridded cube (``data: {name: cube, path: ..., variables: [...], ...}``).

    Args:
        path: anything ``open_cube`` reads.
        variables: the fields to predict.
        elevation: a DEM to attach as the ``elevation`` input (optional).
        val_region: where validation windows come from (default: the training region);
            validation always uses its own sampler and seed, never the training stream.
        time: ``[first, last]`` (dates, inclusive) of the steps to train on; None: all.
        **sampler_args: ``TaskSampler`` arguments (``window``, ``region``, ``inputs``,
            ``gap_fill``, ``context_fraction``, ``valid_mask``, ``windows_per_tile``, ...).
    """

    def __init__(self, path: str, variables: str | Sequence[str], elevation: str | None = None,
                 val_region: Any = None, seed: int = 0, time: Sequence[str] | None = None,
                 **sampler_args: Any) -> None:
        from geonp.data.cube import open_cube
        from geonp.data.elevation import attach_elevation
        from geonp.data.tasks import TaskSampler

        cube = select_time(open_cube(path, variables), time, path)
        if elevation is not None:
            cube = attach_elevation(cube, elevation)
        self._make = lambda **kw: TaskSampler(cube, variables, **{**sampler_args, **kw})
        self.sampler = self._make(seed=seed)
        self.normaliser = self.sampler.normaliser
        self.val_region = val_region
        self.dim_x, self.dim_y = len(self.sampler.inputs), len(self.sampler.variables)
        self._stream = iter(self.sampler)
        # The checkpoint's record of how inputs and values were scaled: the normalisation fitted on
        # the training region, the input channels in order, the predicted variables.
        self.checkpoint_meta = {"inputs": {"kind": "cube", "channels": list(self.sampler.inputs),
                                           "variables": list(self.sampler.variables),
                                           "window": list(self.sampler.window),
                                           "normalisation": dataclasses.asdict(self.normaliser)}}

    def sample(self, batch_size: int, rng: torch.Generator) -> Batch:
        """The next batch of the stream (its own random state: see ``state_dict``)."""
        if batch_size != self.sampler.batch_size:
            raise ValueError(f"data: batch_size {batch_size} differs from the sampler's {self.sampler.batch_size}")
        return next(self._stream)

    def validation(self, num_tasks: int, batch_size: int, seed: int) -> list[Batch]:
        region = self.val_region if self.val_region is not None else self.sampler.region
        sampler = self._make(seed=seed, batch_size=batch_size, region=region, normaliser=self.normaliser)
        stream = iter(sampler)
        return [next(stream) for _ in range(max(1, num_tasks // batch_size))]

    def state_dict(self) -> dict:
        return self._stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._stream.load_state_dict(state)


def make_task_source(name: str, batch_size: int = 16, seed: int = 0, **kwargs: Any) -> Any:
    """``name: cube`` for a cube (see ``CubeSource``), ``windows`` for infill windows, else a generator name.

    ``batch_size`` and ``seed`` (the training run's) only matter to a cube source: a synthetic
    generator draws from the trainer's random generator.
    """
    if name == "windows":  # infill-shaped windows (see geonp.data.window_source)
        from geonp.data.window_source import WindowSource

        return WindowSource(**kwargs)
    if name == "cube":
        if "path" not in kwargs or "variables" not in kwargs:
            raise ValueError("data: a cube source needs 'path' and 'variables'")
        return CubeSource(**{"batch_size": batch_size, "seed": seed, **kwargs})
    return SyntheticSource(name, **kwargs)
