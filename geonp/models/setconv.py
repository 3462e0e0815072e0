"""Set convolutions between scattered points and a regular grid, truncated to local windows.

Everything here works in *grid units*: a location ``x`` (input units) along gridded dimension
``d`` becomes ``u_d = x_d * points_per_unit_d``, so grid cell ``k`` sits at ``u = k`` (integer),
anchored at the origin. The RBF weight between a point ``u`` and a cell ``g`` is separable:

    w(u, g) = prod_d exp(-0.5 * ((u_d - g_d) / ell_d)^2),   ell_d in grid cells.

Truncation: a point only reaches the cells within ``radius_d = ceil(cutoff * ell_d)`` cells of
its *nearest* cell ``n_d = floor(u_d + 0.5)`` along each dimension (a box of
``prod_d (2 radius_d + 1)`` cells). A dropped cell lies at least ``radius_d + 1/2 >= cutoff *
ell_d`` away along some dimension, so every dropped term weighs less than
``exp(-cutoff^2 / 2)`` times the peak (3.4e-4 at cutoff 4); for context on a regular grid the
dropped share of the density is about ``erfc(cutoff / sqrt(2))`` per dimension (6.3e-5 at 4).
Because the window is chosen by integer cell offsets around the nearest cell, a point lying
exactly on a cell reaches exactly the cells a separable grid convolution with a
``2 radius + 1`` tap kernel reaches: that is what lets :func:`smooth_grid` (the gridded fast
path) reproduce :func:`points_to_grid` / :func:`grid_to_points` to rounding.

Cost is ``O(N * window)`` in time and memory, never ``O(N * grid)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: Guard for the normalised data channel ``sum(w y) / (density + DENSITY_EPS)``.
DENSITY_EPS = 1e-8


def window_radius(lengthscale: torch.Tensor, cutoff: float) -> list[int]:
    """Cells reached either side of the nearest cell: ``ceil(cutoff * ell_d)`` per dimension."""
    return [max(0, math.ceil(cutoff * float(ell))) for ell in lengthscale.detach().cpu()]


def task_grids(points: list[tuple[torch.Tensor, torch.Tensor]], margin: list[int], multiple: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Each task's own grid: its origin cell, its size, and the batch's common (largest) shape.

    ``points``: pairs ``(u [B, N, D], mask [B, N])`` in grid units (context and targets).
    The grid of task ``b`` starts ``margin_d`` cells below its lowest nearest cell and covers
    its highest one plus ``margin_d``, its size rounded up to a multiple of ``multiple_d`` (the
    UNet's total down-sampling). It is anchored to the data, not to the batch: shifting a
    task by whole cells shifts its grid by the same cells, and a task padded into a batch gets
    the grid it would get alone. Returns ``origin [B, D]`` and ``size [B, D]`` (long) and the
    common shape (python ints).
    """
    lo = hi = None
    for u, mask in points:
        if u.shape[1] == 0:
            continue
        n = torch.floor(u + 0.5)  # nearest cell [B, N, D]
        big = torch.finfo(u.dtype).max
        lo_i = torch.where(mask[..., None], n, big).amin(1)  # [B, D]
        hi_i = torch.where(mask[..., None], n, -big).amax(1)
        lo = lo_i if lo is None else torch.minimum(lo, lo_i)
        hi = hi_i if hi is None else torch.maximum(hi, hi_i)
    m = torch.tensor(margin, device=lo.device, dtype=torch.long)
    s = torch.tensor(multiple, device=lo.device, dtype=torch.long)
    origin = lo.long() - m
    size = (hi.long() - lo.long() + 1 + 2 * m + s - 1) // s * s
    return origin, size, [int(v) for v in size.amax(0).tolist()]


def valid_cells(size: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """``[B, 1, *shape]`` float mask: 1 on cells inside each task's own grid (``size [B, D]``)."""
    valid = size.new_ones(size.shape[0], *shape, dtype=torch.bool)
    for d, n in enumerate(shape):
        idx = torch.arange(n, device=size.device).view(*([1] * (d + 1)), n, *([1] * (len(shape) - d - 1)))
        valid = valid & (idx < size[:, d].view(-1, *([1] * len(shape))))
    return valid[:, None].float()


def _window(u: torch.Tensor, mask: torch.Tensor, origin: torch.Tensor, shape: list[int], lengthscale: torch.Tensor,
            radius: list[int], normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat cell indices and RBF weights of each point's window: both ``[B, N, P]``.

    ``u [B, N, D]`` grid units, ``mask [B, N]``, ``origin [B, D]`` long, ``lengthscale [D]``
    (cells). ``P = prod_d (2 radius_d + 1)``. Absent points get weight 0 and index 0. With
    ``normalise`` the weights of each point sum to one (per dimension, hence overall).
    """
    b, n, _ = u.shape
    nearest = torch.floor(u + 0.5)  # [B, N, D]
    frac = u - nearest  # in [-1/2, 1/2)
    rel = nearest.long() - origin[:, None, :]  # cell of the nearest point inside the task grid
    index = u.new_zeros(b, n, 1, dtype=torch.long)
    weight = u.new_ones(b, n, 1)
    for d, r in enumerate(radius):
        offsets = torch.arange(-r, r + 1, device=u.device)  # [W_d]
        w_d = torch.exp(-0.5 * ((offsets.to(u.dtype) - frac[..., d:d + 1]) / lengthscale[d]) ** 2)  # [B, N, W_d]
        if normalise:
            w_d = w_d / w_d.sum(-1, keepdim=True)
        cell = rel[..., d:d + 1] + offsets  # [B, N, W_d]
        index = (index[..., :, None] * shape[d] + cell[..., None, :]).flatten(2)  # row-major flat index
        weight = (weight[..., :, None] * w_d[..., None, :]).flatten(2)
    weight = weight * mask[..., None].to(weight.dtype)
    index = torch.where(mask[..., None], index, 0)
    return index, weight


def points_to_grid(u: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, origin: torch.Tensor, shape: list[int],
                   lengthscale: torch.Tensor, radius: list[int], chunk: int) -> torch.Tensor:
    """Encoder SetConv: ``[density, data]`` channels on each task's grid, ``[B, 1 + C, *shape]``.

    ``u [B, N, D]`` grid units, ``values [B, N, C]``, ``mask [B, N]``. ``density = sum_i w_i``
    and ``data = sum_i w_i v_i / (density + DENSITY_EPS)`` (a weighted mean, 0 where no point
    reaches). Points are processed ``chunk`` at a time; memory ``B * chunk * P * (1 + C)``.
    """
    b, n, c = values.shape
    total = math.prod(shape)
    feats = torch.cat([values.new_ones(b, n, 1), values], -1)  # [B, N, 1 + C]
    grid = values.new_zeros(b, total, 1 + c)
    for s in range(0, n, chunk):
        index, weight = _window(u[:, s:s + chunk], mask[:, s:s + chunk], origin, shape, lengthscale, radius, False)
        contrib = weight[..., None] * feats[:, s:s + chunk, None, :]  # [B, n, P, 1 + C]
        grid = grid.scatter_add(1, index.flatten(1)[..., None].expand(-1, -1, 1 + c), contrib.flatten(1, 2))
    grid = grid.transpose(1, 2).reshape(b, 1 + c, *shape)
    return density_channels(grid)


def density_channels(sums: torch.Tensor) -> torch.Tensor:
    """``[B, 1 + C, *G]`` weighted sums ``[sum w, sum w v]`` -> ``[density, normalised data]``."""
    density = sums[:, :1]
    return torch.cat([density, sums[:, 1:] / (density + DENSITY_EPS)], 1)


def grid_to_points(features: torch.Tensor, u: torch.Tensor, mask: torch.Tensor, origin: torch.Tensor,
                   shape: list[int], lengthscale: torch.Tensor, radius: list[int]) -> torch.Tensor:
    """Decoder SetConv: RBF-weighted mean of grid features around each point, ``[B, N, C]``.

    ``features [B, prod(shape), C]`` (cells row-major), ``u [B, N, D]`` grid units. Weights are
    normalised to sum to one over the window. Memory ``B * N * P * C``: call it on chunks.
    """
    b, n = u.shape[:2]
    index, weight = _window(u, mask, origin, shape, lengthscale, radius, True)  # [B, n, P]
    cells = features.gather(1, index.flatten(1)[..., None].expand(-1, -1, features.shape[-1]))
    return torch.einsum("bnp,bnpc->bnc", weight, cells.view(b, n, index.shape[-1], -1))


def rbf_taps(lengthscale: torch.Tensor, radius: list[int], normalise: bool) -> list[torch.Tensor]:
    """1-D kernels ``exp(-0.5 (j / ell_d)^2)`` for ``j = -radius_d .. radius_d``, one per dimension."""
    taps = []
    for d, r in enumerate(radius):
        j = torch.arange(-r, r + 1, device=lengthscale.device, dtype=lengthscale.dtype)
        k = torch.exp(-0.5 * (j / lengthscale[d]) ** 2)
        taps.append(k / k.sum() if normalise else k)
    return taps


def smooth_grid(grid: torch.Tensor, taps: list[torch.Tensor]) -> torch.Tensor:
    """Separable convolution of ``grid [B, C, *G]`` with ``taps`` (one 1-D kernel per grid dim).

    Zero padding, same size out. With points on cells this equals the windowed SetConv.
    """
    for d, k in enumerate(taps):
        moved = grid.movedim(2 + d, -1)
        flat = moved.reshape(-1, 1, moved.shape[-1])
        out = F.conv1d(flat, k.to(grid.dtype).view(1, 1, -1), padding=(k.numel() - 1) // 2)
        grid = out.view(moved.shape).movedim(-1, 2 + d)
    return grid
