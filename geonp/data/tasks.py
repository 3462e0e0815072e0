"""Context/target tasks drawn lazily from a cube, as a torch ``IterableDataset``.

A task is a window of ``[time, rows, cols]`` cells (``window``, e.g. ``(5, 15, 15)``: 5
time steps of 15 x 15 cells) inside a region. Its observed cells are split into context
and targets in one of two ways:

- random: ``Nc = floor(f * N_observed)`` with ``f ~ U(a, b)`` (the TE-TNP paper draws
  ``U(N/100, N/3)``, i.e. ``context_fraction=(0.01, 1/3)``), the rest are targets;
- gap-fill: the missing-cell pattern of another time step at the same place (or another
  place when there is one time step) is laid over the window as an artificial cloud, as
  DINCAE does; observed cells under it are targets, the others context.

NaN cells never become context or targets, and cells outside an optional validity mask
(land for SST, say) are never used at all.

I/O follows the cube's chunks: the region is cut into tiles of whole chunks (plus a
halo of ``window - 1`` cells so every window position belongs to exactly one tile), a tile
is read once and ``windows_per_tile`` windows are drawn from it with vectorised gathers.
Tiles are shared out between DataLoader workers and distributed ranks, and each
(rank, worker) pair has its own random stream, so no two produce the same tasks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import dask
import numpy as np
import torch
import xarray as xr
from torch.utils.data import IterableDataset, get_worker_info

from geonp.data.batch import Batch
from geonp.data.cube import horizontal_dims
from geonp.data.normalise import Normaliser, fit_normaliser
from geonp.data.regions import Region, crop_to_region, get_region

TILE_CELLS = 1 << 22  # ~4M cells per tile: 16 MB per variable or input channel in float32


def shard() -> tuple[int, int]:
    """``(index, count)`` of this (distributed rank, DataLoader worker) among all of them."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
    return rank * workers + worker, world * workers


class TaskSampler(IterableDataset):
    """Batches of tasks (``geonp.data.Batch``, normalised units) drawn from a cube forever.

    Args:
        cube: a Dataset from ``open_cube`` (add elevation with ``attach_elevation`` first
            to use it as an input).
        variables: the fields to predict (``Dy = len(variables)``); a cell counts as
            observed when every one of them is finite.
        window: ``(time steps, rows, cols)`` of a task; ``(rows, cols)`` for a cube without time.
        region: a registered region name, a ``Region`` or ``(south, north, west, east)``;
            None for the whole cube.
        inputs: the input channels, in order (``Dx = len(inputs)``): ``lat``, ``lon``,
            ``time`` or variables of the cube on the grid (``elevation``, ...).
        batch_size: tasks per batch.
        context_fraction: ``(a, b)`` of the random split.
        gap_fill: probability that a task uses the gap-fill split instead.
        valid_mask: name of a boolean variable, True where the field can exist.
        normaliser: statistics to apply; default: fitted over the region now.
        windows_per_tile: windows drawn from a tile before the next is read.
        seed: base seed; the stream also depends on the shard (rank, worker).
        min_observed: windows with fewer observed cells are redrawn.
        tile_cells: about how many cells a tile read holds (memory per tile is about
            ``tile_cells * (Dx + Dy + 1) * 4`` bytes).
    """

    def __init__(
        self,
        cube: xr.Dataset,
        variables: str | Sequence[str],
        window: Sequence[int] = (5, 15, 15),
        region: str | Region | Sequence[float] | None = None,
        inputs: Sequence[str] = ("lat", "lon", "time"),
        batch_size: int = 16,
        context_fraction: tuple[float, float] = (0.01, 1 / 3),
        gap_fill: float = 0.0,
        valid_mask: str | None = None,
        normaliser: Normaliser | None = None,
        windows_per_tile: int = 256,
        seed: int = 0,
        min_observed: int = 2,
        tile_cells: int = TILE_CELLS,
    ) -> None:
        super().__init__()
        self.variables = [variables] if isinstance(variables, str) else list(variables)
        self.inputs = list(inputs)
        self.region = get_region(region) if region is not None else None
        cube = crop_to_region(cube, self.region) if self.region is not None else cube
        source = cube.attrs.get("geonp_source", "the cube")
        for v in self.variables + ([valid_mask] if valid_mask else []):
            if v not in cube.data_vars:
                raise ValueError(f"{source}: unknown variable {v!r}")
        self.has_time = "time" in cube.dims
        self.space = horizontal_dims(cube)
        window = tuple(int(w) for w in window)
        if len(window) == 2:  # a spatial window: one time step (of a cube with or without a time axis)
            window = (1, *window)
        if len(window) != 3 or min(window) < 1:
            raise ValueError(f"window must be (time steps, rows, cols) of positive sizes, got {window}")
        if "time" in self.inputs and not self.has_time:
            raise ValueError(f"{source}: input 'time' asked for, but the cube has no time axis")
        unknown = [n for n in self.inputs if n not in cube.variables]
        if unknown:
            raise ValueError(f"{source}: unknown input {', '.join(map(repr, unknown))}; inputs are lat, lon, time "
                             "or variables on the grid (attach_elevation adds 'elevation')")
        sizes = (cube.sizes["time"] if self.has_time else 1, cube.sizes[self.space[0]], cube.sizes[self.space[1]])
        if any(w > n for w, n in zip(window, sizes)):
            raise ValueError(f"window {window} (time, rows, cols) is larger than the cube{' region' if region else ''} "
                             f"{sizes} of {source}")
        a, b = context_fraction
        if not 0.0 < a <= b < 1.0:
            raise ValueError(f"context_fraction must be (a, b) with 0 < a <= b < 1, got {context_fraction}")
        if not 0.0 <= gap_fill <= 1.0:
            raise ValueError(f"gap_fill is a probability, got {gap_fill}")
        self.cube, self.window, self.sizes = cube, window, sizes
        self.batch_size, self.context_fraction, self.gap_fill = int(batch_size), (a, b), float(gap_fill)
        self.valid_mask, self.windows_per_tile, self.seed = valid_mask, int(windows_per_tile), int(seed)
        self.min_observed = max(2, int(min_observed))
        self.tile_cells = int(tile_cells)
        if normaliser is None:  # fitted on the (already cropped) training region only
            normaliser = fit_normaliser(cube, self.variables, self.inputs)
            if self.region is not None:
                normaliser.region = {"lat": list(self.region.lat), "lon": list(self.region.lon)}
        self.normaliser = normaliser
        self.tiles = self._plan_tiles()

    # -- planning --------------------------------------------------------------------
    def _plan_tiles(self) -> list[tuple[slice, slice, slice]]:
        """Chunk-aligned tiles (time, rows, cols); each owns the window starts in its core."""
        chunksizes = self.cube[self.variables[0]].chunksizes
        chunks = [chunksizes[d][0] if d in chunksizes else n for d, n in zip(("time", *self.space), self.sizes)]
        lengths = [min(n, c * math.ceil(w / c)) for c, w, n in zip(chunks, self.window, self.sizes)]
        # Grow the tile (space first: neighbouring rows are more alike than far-apart times)
        # by whole chunks until it holds enough cells to amortise the read.
        order = (1, 2, 0)
        while math.prod(lengths) < self.tile_cells:
            grown = False
            for k in order:
                if lengths[k] < self.sizes[k] and math.prod(lengths) < self.tile_cells:
                    lengths[k] = min(self.sizes[k], lengths[k] + chunks[k])
                    grown = True
            if not grown:
                break
        starts = [range(0, n - w + 1, L) for n, w, L in zip(self.sizes, self.window, lengths)]
        tiles = []
        for t0 in starts[0]:
            for i0 in starts[1]:
                for j0 in starts[2]:
                    # Core of starts [s, s + L) clipped to the last valid start, plus the halo.
                    tiles.append(tuple(slice(s, min(s + L + w - 1, n)) for s, L, w, n
                                       in zip((t0, i0, j0), lengths, self.window, self.sizes)))
        return tiles

    # -- reading ---------------------------------------------------------------------
    def _read_tile(self, tile: tuple[slice, slice, slice]) -> dict[str, np.ndarray]:
        """Values ``[T, H, W, Dy]``, inputs ``[T, H, W, Dx]`` and masks of one tile, normalised."""
        sel = dict(zip(self.space, tile[1:]))
        if self.has_time:
            sel["time"] = tile[0]
        part = self.cube.isel(sel)
        # Inputs may be lazy too (an elevation coordinate read from Zarr): read them in the same pass.
        names = self.variables + [n for n in self.inputs if n in part.variables and n not in self.variables]
        names += [self.valid_mask] if self.valid_mask else []
        # One thread per sampler: DataLoader workers are the parallelism, and a forked worker
        # cannot use the parent's dask thread pool.
        (arrays,) = dask.compute({n: part[n].data for n in names}, scheduler="synchronous")
        shape = tuple(s.stop - s.start for s in tile)
        dims3 = ("time", *self.space)

        def full(name: str, values: np.ndarray, dims: tuple[str, ...]) -> np.ndarray:
            """Broadcast a variable or coordinate on some of (time, y, x) to the tile."""
            keep = [d for d in dims3 if d in dims]
            values = np.asarray(values)
            if len(keep) != values.ndim:
                raise ValueError(f"input {name!r} has dimensions {dims}; expected a subset of {dims3}")
            perm = [dims.index(d) for d in keep]
            expand = tuple(slice(None) if d in keep else None for d in dims3)
            return np.broadcast_to(np.transpose(values, perm)[expand], shape)

        # Normalise before broadcasting: a coordinate is converted once per value, not per cell.
        y = np.stack([full(v, self.normaliser.normalise_values(v, arrays[v]).astype(np.float32), part[v].dims)
                      for v in self.variables], axis=-1)
        x_cols = []
        for name in self.inputs:
            raw = arrays[name]
            x_cols.append(full(name, self.normaliser.normalise_input(name, raw).astype(np.float32), part[name].dims))
        finite = np.isfinite(y).all(axis=-1)
        valid = np.ones(shape, bool) if not self.valid_mask else \
            full(self.valid_mask, arrays[self.valid_mask], part[self.valid_mask].dims).astype(bool)
        observed = finite & valid
        return {"y": np.where(observed[..., None], y, 0.0).astype(np.float32), "x": np.stack(x_cols, axis=-1),
                "observed": observed, "gap": ~finite & valid}

    # -- sampling --------------------------------------------------------------------
    def _window_index(self, origins: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        """Flat tile indices ``[B, N]`` of the cells of windows starting at ``origins [B, 3]``."""
        wt, wh, ww = self.window
        t = origins[:, 0, None, None, None] + np.arange(wt)[None, :, None, None]
        i = origins[:, 1, None, None, None] + np.arange(wh)[None, None, :, None]
        j = origins[:, 2, None, None, None] + np.arange(ww)[None, None, None, :]
        return ((t * shape[1] + i) * shape[2] + j).reshape(len(origins), -1)

    def _draw_origins(self, tile: dict[str, np.ndarray], rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` window origins in the tile with at least ``min_observed`` observed cells."""
        shape = tile["observed"].shape
        span = [s - w + 1 for s, w in zip(shape, self.window)]
        found: list[np.ndarray] = []
        for _ in range(64):
            cand = np.stack([rng.integers(0, s, size=2 * n) for s in span], axis=1)
            counts = tile["observed"].reshape(-1)[self._window_index(cand, shape)].sum(axis=1)
            found.append(cand[counts >= self.min_observed])
            if sum(len(f) for f in found) >= n:
                return np.concatenate(found)[:n]
        return np.concatenate(found)[:n]

    def _borrowed_gaps(self, tile: dict[str, np.ndarray], origins: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Gap masks ``[B, N]`` copied from another time step at the same place (or, with a
        single time step, from another place)."""
        shape = tile["gap"].shape
        donors = origins.copy()
        if shape[0] > self.window[0]:
            shift = rng.integers(1, shape[0] - self.window[0] + 1, size=len(origins))
            donors[:, 0] = (origins[:, 0] + shift) % (shape[0] - self.window[0] + 1)
        else:
            for k in (1, 2):
                donors[:, k] = rng.integers(0, shape[k] - self.window[k] + 1, size=len(origins))
        return tile["gap"].reshape(-1)[self._window_index(donors, shape)]

    def _batch(self, tile: dict[str, np.ndarray], origins: np.ndarray, rng: np.random.Generator) -> Batch:
        """Split each window into context and targets and pad them into a ``Batch``."""
        b = len(origins)
        index = self._window_index(origins, tile["observed"].shape)
        observed = tile["observed"].reshape(-1)[index]                    # [B, N]
        n_obs = observed.sum(axis=1)
        u = rng.random(observed.shape, dtype=np.float32)
        frac = rng.uniform(*self.context_fraction, size=b)
        n_ctx = np.clip(np.floor(frac * n_obs).astype(np.int64), 1, n_obs - 1)
        key = np.where(observed, u, 3.0)                                   # observed first, random order
        use_gaps = rng.random(b) < self.gap_fill
        if use_gaps.any():
            cloud = np.zeros_like(observed)
            pending = use_gaps.copy()
            for _ in range(4):
                # A borrowed mask that hides nothing or everything cannot make a task: try another donor.
                trial = self._borrowed_gaps(tile, origins, rng) & observed
                n_trial = trial.sum(axis=1)
                took = pending & (n_trial > 0) & (n_trial < n_obs)
                cloud[took] = trial[took]
                pending &= ~took
                if not pending.any():
                    break
            use_gaps &= ~pending  # the rest fall back to the random split
            n_cloud = cloud.sum(axis=1)
            key = np.where(use_gaps[:, None], np.where(cloud, 1.0 + u, key), key)
            n_ctx = np.where(use_gaps, n_obs - n_cloud, n_ctx)
        order = np.argsort(key, axis=1, kind="stable")
        n_tgt = n_obs - n_ctx
        nc_max, nt_max = int(n_ctx.max()), int(n_tgt.max())
        ctx = order[:, :nc_max]
        tgt = np.take_along_axis(order, np.minimum(n_ctx[:, None] + np.arange(nt_max), order.shape[1] - 1), axis=1)
        mask_c = np.arange(nc_max)[None] < n_ctx[:, None]
        mask_t = np.arange(nt_max)[None] < n_tgt[:, None]
        x = tile["x"].reshape(-1, tile["x"].shape[-1])
        y = tile["y"].reshape(-1, tile["y"].shape[-1])

        def gather(cells: np.ndarray, mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            """Inputs and values of ``cells`` (window positions), zero where ``mask`` marks padding."""
            flat = np.take_along_axis(index, cells, axis=1)
            return tuple(torch.from_numpy(np.where(mask[..., None], values[flat], 0.0).astype(np.float32))
                         for values in (x, y))

        (xc, yc), (xt, yt) = gather(ctx, mask_c), gather(tgt, mask_t)
        return Batch(xc=xc, yc=yc, xt=xt, yt=yt, mask_c=torch.from_numpy(mask_c), mask_t=torch.from_numpy(mask_t))

    def _tile_weights(self, tiles: list[tuple[slice, slice, slice]]) -> np.ndarray:
        """Draw tiles in proportion to the window starts they own, so windows are uniform."""
        starts = [math.prod(max(1, s.stop - s.start - w + 1) for s, w in zip(t, self.window)) for t in tiles]
        return np.asarray(starts, float) / sum(starts)

    def __iter__(self) -> TaskStream:
        return TaskStream(self, *shard())


class TaskStream:
    """One shard's endless stream of batches from a ``TaskSampler``, with a resumable state.

    ``state_dict()`` is plain JSON (random generator state, the tile held, windows drawn from
    it, tiles found empty), so a training run can checkpoint it and continue the same stream.
    """

    def __init__(self, sampler: TaskSampler, index: int = 0, count: int = 1) -> None:
        self.sampler = sampler
        self.rng = np.random.default_rng([sampler.seed, index, count])
        self.tiles = sampler.tiles[index::count] if len(sampler.tiles) >= count else sampler.tiles
        self.weights = sampler._tile_weights(self.tiles)
        self.held, self.drawn, self.tile = -1, 0, {}
        self.empty: set[int] = set()

    def __iter__(self) -> TaskStream:
        return self

    def __next__(self) -> Batch:
        s = self.sampler
        while len(self.empty) < len(self.tiles):
            if self.held < 0 or self.drawn >= s.windows_per_tile:
                k = int(self.rng.choice(len(self.tiles), p=self.weights))
                if k != self.held or not self.tile:  # the tile held (always, when there is one) is kept
                    self.tile = s._read_tile(self.tiles[k])
                self.held, self.drawn = k, 0
            origins = s._draw_origins(self.tile, self.rng, s.batch_size)
            if len(origins) < s.batch_size:
                self.empty.add(self.held)
                self.weights[self.held] = 0.0
                if self.weights.sum() > 0:
                    self.weights = self.weights / self.weights.sum()
                self.held = -1
                continue
            self.drawn += len(origins)
            return s._batch(self.tile, origins, self.rng)
        raise ValueError(f"no window {s.window} in {s.cube.attrs.get('geonp_source', 'the cube')} "
                         f"has {s.min_observed} or more observed cells")

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "held": self.held, "drawn": self.drawn,
                "empty": sorted(self.empty), "weights": self.weights.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.held, self.drawn = int(state["held"]), int(state["drawn"])
        self.empty, self.weights = set(state["empty"]), np.asarray(state["weights"], float)
        self.tile = self.sampler._read_tile(self.tiles[self.held]) if self.held >= 0 else {}


def sample_tasks(sampler: TaskSampler, num_batches: int) -> list[Batch]:
    """The first batches of ``sampler``'s stream, as a fixed evaluation set.

    Args:
        sampler: the task sampler; its seed decides the batches.
        num_batches: how many batches to draw.

    Returns:
        ``num_batches`` ``Batch`` objects of ``sampler.batch_size`` tasks each.
    """
    stream = iter(sampler)
    return [next(stream) for _ in range(num_batches)]
