"""te-pt-tnp's kriging head as the source of the samples' error correlation (issue 55, item 2),
two samplers ``samples_check`` scores against geonp's rule (the scene's own variogram):

    python -m pipelines.experiments.samples_check --split validation --models te-pt-tnp \
        --samples 16 --variants scene 'scene~s1' 'scene~s2' head head-window \
        --out pipelines/results/samples_head_window_te_validation

The head predicts an exponential covariance for every target of every window (a lengthscale per
input, a sill and a nugget; :class:`~geonp.models.local_kriging.LocalKriging`), as kriging fits a
variogram per window. A recorder (:func:`recording_head_covariance`) keeps, while a fill runs, what
the head predicted for the real targets of the fill's own windows and where those targets lie.

* ``head``: geonp's conditional simulation of the whole scene at once with one correlation, the
  head's median over the fill's targets (:func:`head_sampler`).
* ``head-window``: each window's own correlation, conditioned across windows (:func:`draw_by_windows`):
  each window draws its gap cells jointly from an unconditional field with its own range and
  nugget share, conditioned by kriging on the observed cells (errors 0) and on the cells earlier
  windows drew (their errors), the nearest ones within a margin of its range (at most 64 cells);
  so a window continues its neighbours' draws at its border (no seams) and varies as its own
  covariance says inside. A gap cell belongs to the window whose targets' centre is nearest among
  the windows that predicted it. The windows are visited in the order the fill predicted them
  (batches sorted by size, not by place: a random path, as sequential simulation takes). Each
  cell's error is then scaled by its standard deviation given the observed cells within the margin
  alone (under its window's correlation), so that the sample's spread at every cell is the fill's
  sigma, as in geonp's rule (:mod:`geonp.fill.samples`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import numpy as np
import torch
import xarray as xr

from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED, SAMPLE_DIM
from geonp.fill.samples import NEIGHBOURS, conditioning_weights, draw_samples, kriged, unconditional, with_samples

#: The attributes under which a fill of ``samples_check.check_scene`` carries the head's covariance:
#: ``(range_cells, nugget_share)`` over the fill, and ``{"windows": per window (cells [m, 3],
#: range_cells, nugget_share), "axes": the working cube's row and column coordinates}``.
HEAD_ATTR = "samples_check_head_covariance"
WINDOWS_ATTR = "samples_check_head_windows"
#: Cells around a window's own gap cells within which earlier draws and observations condition it:
#: the window's range, at least ``MIN_MARGIN`` and at most ``MAX_MARGIN`` (a bound on the cost; at a
#: range of 90 cells the correlation 64 cells away is still 0.12, and a window farther than that from
#: every observation and earlier draw is drawn unconditioned, its divisor 1 to match).
MAX_MARGIN, MIN_MARGIN = 64, 4


@contextmanager
def recording_head_covariance() -> Iterator[dict[str, Any]]:
    """While a fill runs, the covariance (lengthscales per input, sill, nugget: ``[n, Dx + 2]``, as
    :meth:`~geonp.models.local_kriging.LocalKriging.kernel_parameters` gives them to the head) that te-pt-tnp's
    kriging head predicts for the real targets (not the padding) of the fill's own windows, not
    those of fine-tuning or of the checks that run before the fill (:func:`geonp.fill.prepare.prepare`):
    ``{"params": [tensor per call], "windows": [tensor per call], "cells": [array per window],
    "cells_per_unit": the plan's window scaling, "axes": the working cube's row and column
    coordinates}``; ``windows`` holds each window's medians over its real targets of the spatial
    lengthscale (geometric mean of rows and columns, input units) and of the nugget share,
    ``[windows with a real target, 2]`` per call; ``cells`` the same windows' real targets as
    ``[m, 3]`` (time, row, column) cells of the working cube, in the same order."""
    import geonp.fill.blocks as blocks
    import geonp.fill.engine as engine
    import geonp.fill.predictor as predictor
    from geonp.models.local_kriging import LocalKriging

    record: dict[str, Any] = {"params": [], "windows": [], "cells": [], "cells_per_unit": None, "axes": None}
    filling = [False]
    here = threading.local()  # a block's slab and the windows of the batch, in the thread filling it
    real_fill, real_forward = engine.fill_in_memory, LocalKriging.forward
    real_read, real_collate = blocks.read_block, predictor.collate_windows

    def fill_in_memory(p, *args, **kwargs):
        filling[0] = True
        record["cells_per_unit"] = p.spec.cells_per_unit
        cube = next(iter(p.cubes.values()))  # [*extra, time, rows, cols]
        record["axes"] = [np.asarray(cube[d].values) if d in cube.coords else None for d in cube.dims[-2:]]
        try:
            return real_fill(p, *args, **kwargs)
        finally:
            filling[0] = False

    def read_block(field, key):  # the block's last read is its slab: the windows' targets index it
        out = real_read(field, key)
        here.slab = (np.array([s.start for s in key]), out[0].shape)
        return out

    def collate_windows(tasks, *args, **kwargs):  # the windows of the next forward, in its rows' order
        here.tasks = list(tasks)
        return real_collate(tasks, *args, **kwargs)

    def forward(self, zt, xt, xc, yc, index, valid, drift_t=None, drift_c=None, mask_t=None, nugget_share=None):
        if filling[0]:
            ell, sill, nugget, _ = self.kernel_parameters(zt, nugget_share)  # as the head uses them
            real = torch.ones(sill.shape, dtype=torch.bool, device=sill.device) if mask_t is None else mask_t.bool()
            used = torch.cat([ell, sill[..., None], nugget[..., None]], -1)  # [B, Nt, Dx + 2]
            record["params"].append(used[real].detach().cpu())  # [n_real, Dx + 2]
            spatial, share = _spatial_and_share(ell, sill, nugget)  # [B, Nt] each
            rows = [b for b in range(len(real)) if real[b].any()]
            tasks = getattr(here, "tasks", None)  # the batch collated for this forward
            if tasks is None or len(tasks) != len(real) or any(
                    tasks[b].targets.size != int(real[b].sum()) for b in rows):
                raise RuntimeError("head recorder: a forward whose windows were not collated just before it")
            if rows:
                record["windows"].append(torch.stack([torch.stack([spatial[b][real[b]].median(),
                                                                   share[b][real[b]].median()])
                                                      for b in rows]).detach().double().cpu())  # [B', 2]
                origin, shape = here.slab
                record["cells"] += [np.stack(np.unravel_index(tasks[b].targets, shape), 1) + origin for b in rows]
        return real_forward(self, zt, xt, xc, yc, index, valid, drift_t, drift_c, mask_t, nugget_share)

    with patch.object(engine, "fill_in_memory", fill_in_memory), patch.object(LocalKriging, "forward", forward), \
            patch.object(blocks, "read_block", read_block), patch.object(predictor, "collate_windows", collate_windows):
        yield record


def head_correlation(record: dict[str, Any]) -> tuple[float, float] | None:
    """``(range_cells, nugget_share)`` of the exponential correlation the kriging head used over all its
    real targets (:func:`recording_head_covariance`): the practical range ``3 ell`` of the median spatial
    lengthscale in cells, and the median nugget share (:func:`_spatial_and_share`); None without a head."""
    if not record["params"]:
        return None
    p = torch.cat(record["params"]).double()
    spatial, share = _spatial_and_share(p[:, :-2], p[:, -2], p[:, -1])
    return 3.0 * spatial.median().item() * record["cells_per_unit"], share.median().item()


def head_windows(record: dict[str, Any]) -> list[tuple[np.ndarray, float, float]]:
    """Each window of the fill as ``(cells [m, 3], range_cells, nugget_share)``: its real targets'
    cells and the exponential correlation of its median target (practical range ``3 ell`` in cells)."""
    if not record["windows"]:
        return []
    w = torch.cat(record["windows"]).numpy()
    return [(cells, float(3.0 * ell * record["cells_per_unit"]), float(share))
            for cells, (ell, share) in zip(record["cells"], w)]


def _spatial_and_share(ell: torch.Tensor, sill: torch.Tensor, nugget: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per target: the spatial lengthscale (geometric mean of rows and columns, inputs 1 and 2 of
    ``ell [..., Dx]``, input units) and the nugget share ``nugget / (sill + nugget)``, each ``[...]``."""
    return ell[..., 1:3].log().mean(-1).exp(), nugget / (sill + nugget)


def head_window_spread(record: dict[str, Any]) -> dict[str, float | int]:
    """Quantiles (10th, 50th, 90th) over the fill's windows of each window's median practical range
    (``3 ell``, cells) and nugget share (:func:`recording_head_covariance`), and the windows counted,
    as row fields; empty without a head."""
    if not record["windows"]:
        return {}
    w = torch.cat(record["windows"]).numpy()
    ranges, shares = 3.0 * w[:, 0] * record["cells_per_unit"], w[:, 1]
    return {**{f"window_range_p{q}": float(np.percentile(ranges, q)) for q in (10, 50, 90)},
            **{f"window_share_p{q}": float(np.percentile(shares, q)) for q in (10, 50, 90)}, "windows": len(w)}


#: Windows a fill needs for :func:`head_lines` to count its spread.
MIN_WINDOWS = 10


def head_lines(rows: list[dict]) -> list[str]:
    """How much the kriging head's covariance varies between a scene's windows (``head`` rows with
    :func:`head_window_spread`, scenes of :data:`MIN_WINDOWS` windows or more): the 10th and 90th
    percentiles of the windows' range over their median, per scene, summarised over scenes."""
    every = [r for r in rows if r.get("variant") == "head" and "window_range_p50" in r]
    mine = [r for r in every if r["windows"] >= MIN_WINDOWS]  # percentiles of a few windows say little
    if not mine:
        return []
    low, high = ([r[f"window_range_p{q}"] / r["window_range_p50"] for r in mine] for q in (10, 90))
    worst = max(mine, key=lambda r: r["window_range_p90"] / max(r["window_range_p10"], 1e-12))
    share = np.array([r["window_share_p90"] for r in mine])
    return [f"- the head's practical range over a scene's windows (median over the {len(mine)} of {len(every)} "
            f"scenes with {MIN_WINDOWS} windows or more): 10th percentile x{np.median(low):.2f} of the scene's "
            f"median window, 90th x{np.median(high):.2f} (widest {worst['scene']}: "
            f"x{worst['window_range_p10'] / worst['window_range_p50']:.2f} to "
            f"x{worst['window_range_p90'] / worst['window_range_p50']:.2f}); the median window's range "
            f"x{np.median([r['window_range_p50'] / r['range_cells'] for r in mine]):.2f} the whole fill's median "
            f"target's; 90th percentile of the windows' nugget share {np.median(share):.2g} at the median "
            f"scene, {share.max():.2g} at most"]


def head_sampler(fill: xr.Dataset, data: xr.Dataset, name: str, model: str, n: int, seed: int,
                 kwargs: dict[str, Any]) -> xr.Dataset:
    """geonp's conditional simulation with the correlation of te-pt-tnp's kriging head (the same
    exponential family, its range and nugget share as the head predicted them over the fill)."""
    fit = fill.attrs.get(HEAD_ATTR)
    if fit is None:
        raise ValueError(f"--variants head: {model!r} has no kriging head")
    return with_samples(fill, [name], n, seed, lambda values: tuple(fit))


def draw_by_windows(values: np.ndarray, mean: np.ndarray, std: np.ndarray, gaps: np.ndarray,
                    windows: list[tuple[np.ndarray, float, float]], n: int, rng: np.random.Generator,
                    neighbours: int = NEIGHBOURS) -> np.ndarray:
    """``n`` samples ``[n, R, C]`` of one filled scene, each window with its own correlation (module docstring).

    Args:
        values: ``[R, C]`` the input, NaN where not observed.
        mean, std: ``[R, C]`` the fill's mean and 1-sigma (read at ``gaps`` only).
        gaps: ``[R, C]`` bool, the cells the fill filled.
        windows: ``(cells [m, 2] rows and columns, range_cells, nugget_share)`` per window, in the
            order they are drawn; a gap cell no window predicted joins the window of the nearest
            centre, and a scene no window predicted (every gap out of reach of an observation)
            is drawn by geonp's rule (:func:`~geonp.fill.samples.draw_samples`).
        n: samples.
        rng: the random stream.
        neighbours: conditioning cells per gap cell, the nearest.

    Returns:
        Samples equal to ``values`` at observed cells, draws at ``gaps``, NaN elsewhere.
    """
    if not windows:
        return draw_samples(values, mean, std, gaps, n, rng, neighbours)
    observed = np.isfinite(values)
    out = np.where(observed, values, np.nan)[None].repeat(n, 0)
    if not gaps.any():
        return out
    owner = _owners(gaps, [cells for cells, _, _ in windows])
    error = np.zeros((n, *values.shape))  # 0 at observed cells: the fill is exact there
    done, sd = observed.copy(), np.ones(values.shape)
    for w, (_, range_cells, share) in enumerate(windows):
        own = owner == w
        if not own.any():
            continue
        r, c = np.nonzero(own)
        margin = int(np.clip(np.ceil(range_cells), MIN_MARGIN, MAX_MARGIN))
        box = tuple(slice(max(a.min() - margin, 0), a.max() + margin + 1) for a in (r, c))
        target, given = own[box], done[box]
        u = unconditional(target.shape, n, range_cells, share, rng)  # [n, Rb, Cb]
        drawn = u[:, target]  # [n, m]
        if given.any():  # conditioning by kriging on what is known: observed (0) and drawn errors
            near, weights, _ = conditioning_weights(given, target, range_cells, share, neighbours)
            residual = error[:, box[0], box[1]][:, given] - u[:, given]  # [n, N]
            drawn = drawn + kriged(weights, near, residual)
        error[:, box[0], box[1]][:, target] = drawn
        done[box][target] = True
        # Scaled by the s.d. given the observed cells the draw could see (those in the box): beyond
        # the margin the draw is unconditioned, and so must its divisor be.
        sd[own] = conditioning_weights(observed[box], target, range_cells, share, neighbours)[2]
    out[:, gaps] = mean[gaps] + std[gaps] * error[:, gaps] / sd[gaps]
    return out


def _owners(gaps: np.ndarray, cells: list[np.ndarray]) -> np.ndarray:
    """``[R, C]`` the window each gap cell belongs to (-1 elsewhere): among the windows whose cells
    ``[m, 2]`` hold it, the one whose cells' bounding-box centre is nearest; a gap cell in none, the
    window of the nearest centre."""
    centres = np.array([(c.min(0) + c.max(0)) / 2.0 for c in cells])  # [W, 2]
    owner, best = np.full(gaps.shape, -1), np.full(gaps.shape, np.inf)
    for w, c in enumerate(cells):
        d = ((c - centres[w]) ** 2).sum(1)
        closer = d < best[c[:, 0], c[:, 1]]
        owner[c[closer, 0], c[closer, 1]], best[c[closer, 0], c[closer, 1]] = w, d[closer]
    owner[~gaps] = -1
    lost = gaps & (owner < 0)
    if lost.any():
        at = np.argwhere(lost)
        owner[lost] = ((at[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    return owner


def window_sampler(fill: xr.Dataset, data: xr.Dataset, name: str, model: str, n: int, seed: int,
                   kwargs: dict[str, Any]) -> xr.Dataset:
    """``fill`` with ``name_sample [sample, *dims]`` from :func:`draw_by_windows`, each step of the
    scene with the windows that predicted it (``fill.attrs[WINDOWS_ATTR]``: :func:`head_windows` and
    the working cube's ``axes``, whose rows or columns the output may hold reversed)."""
    recorded = fill.attrs.get(WINDOWS_ATTR)
    if not recorded or not recorded["windows"]:
        raise ValueError(f"--variants head-window: {model!r} has no kriging head")
    layer = fill[name]
    if layer.ndim != 3:
        raise ValueError(f"--variants head-window: {name!r} is not [time, rows, cols]")
    values, std, flag = (np.asarray(fill[v].values, np.float64) for v in (name, f"{name}_std", f"{name}_flag"))
    gaps = (flag == FLAG_INFILLED) & np.isfinite(values) & np.isfinite(std)
    windows = recorded["windows"]
    cells = _as_output_cells([c for c, _, _ in windows], recorded["axes"], layer, gaps)
    samples = np.empty((n, *values.shape), np.float32)
    for t in range(len(values)):
        mine = [(c[c[:, 0] == t, 1:], r, s) for c, (_, r, s) in zip(cells, windows) if (c[:, 0] == t).any()]
        seen = np.where(flag[t] == FLAG_OBSERVED, values[t], np.nan)
        rng = np.random.default_rng([seed, 15333, t])
        samples[:, t] = draw_by_windows(seen, values[t], std[t], gaps[t], mine, n, rng)
    return fill.assign({f"{name}_sample": ((SAMPLE_DIM, *layer.dims), samples)})


def _as_output_cells(cells: list[np.ndarray], axes: list[np.ndarray | None], layer: xr.DataArray,
                     gaps: np.ndarray) -> list[np.ndarray]:
    """``cells`` (``[m, 3]`` time, row, column of the working cube, whose row and column coordinates
    are ``axes``) as cells of ``layer [T, R, C]``: each of rows and columns as it is or reversed, as
    the coordinates match. Raises ValueError where they match neither way, or a cell lands off ``gaps``."""
    moved = [c.copy() for c in cells]
    for axis, (working, dim) in enumerate(zip(axes, layer.dims[-2:]), start=1):
        output = np.asarray(layer[dim].values) if dim in layer.coords else None
        if working is None or output is None or working.shape != output.shape:
            raise ValueError(f"--variants head-window: no coordinate to match the fill's {dim!r} with the "
                             "working cube's")
        if np.allclose(working[::-1], output) and not np.allclose(working, output):
            for c in moved:
                c[:, axis] = len(output) - 1 - c[:, axis]
        elif not np.allclose(working, output):
            raise ValueError(f"--variants head-window: the fill's {dim!r} is the working cube's neither as it is "
                             "nor reversed")
    every = np.concatenate(moved)
    if every[:, 0].max(initial=-1) >= len(gaps) or not gaps[tuple(every.T)].all():
        raise ValueError("--variants head-window: the windows' recorded cells do not lie on the fill's gaps")
    return moved
