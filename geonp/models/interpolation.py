"""Classical spatial interpolators as geonp models: the shared base and ``linear``.

``kriging`` (:mod:`geonp.models.kriging`) builds on the same base.

Neither has weights: each task is interpolated from scratch. They are the baselines
the NP models are compared against, so they follow the same calling convention and,
like them, fill a predictive ``scale``.

Inputs are split into *time* and *space* (``time_input``, ``space_inputs``; by default
``x = [time, row, col]`` when ``Dx >= 3``). Targets are interpolated per time slice: a
target uses the context points with exactly its time value when there are enough of
them, otherwise all context points with time ignored. Other inputs (elevation, say) are
ignored. Context points sharing a location (possible once time is ignored) are merged
into one with their mean, and the spread of the values merged adds to the variance of the
targets interpolated with time ignored.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import nnls
from scipy.spatial import Delaunay, QhullError, cKDTree
from torch.distributions import Normal

from geonp.models.base import NeuralProcess
from geonp.models.catalog import register
from geonp.threads import one_blas_thread

_REL_FLOOR = 1e-3  # smallest sigma, as a fraction of the context's spread: never a zero scale
_ABS_FLOOR = 1e-12  # and never below this, so a float32 cast cannot round it to zero
_MIN_HOLDOUT = 3  # held-out points needed to fit linear's sigma(d)
_ON_EDGE = 1e-9  # a barycentric weight below this: the point may be on a face other simplices share
_ON_FACE = 1e-12  # a simplex holds a point whose barycentric weights are all above minus this


def check_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def spread(y: np.ndarray) -> np.ndarray:
    """Per-output sample std of ``y [N, Dy]``; 1.0 where zero or undefined (geonp's data are normalised)."""
    if len(y) < 2:
        return np.ones(y.shape[1])
    sd = y.std(0, ddof=1)
    return np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)


def sigma_floor(y: np.ndarray) -> np.ndarray:
    """Smallest sigma allowed for context values ``y [N, Dy]``, per output ``[Dy]``."""
    return np.maximum(_REL_FLOOR * spread(y), _ABS_FLOOR)


def _spans(xs: np.ndarray) -> bool:
    """Whether points ``xs [N, Ds]`` are affinely independent enough to triangulate (``>= Ds + 1``)."""
    n, d = xs.shape
    return n > d and np.linalg.matrix_rank(xs - xs.mean(0)) == d


def _merge_duplicates(xs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique locations of ``xs [N, Ds]`` (lexicographically sorted), the mean ``y`` at each, and
    the pooled variance ``[Dy]`` of the values about their location's mean (0 without repeats).

    Repeated locations make triangulations and kriging systems singular. The sort also puts
    the context in a canonical order, so results cannot depend on the order it came in.
    """
    uniq, inv = np.unique(xs, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    count = np.bincount(inv, minlength=len(uniq)).astype(np.float64)
    total = np.zeros((len(uniq), y.shape[1]))
    np.add.at(total, inv, y)
    mean = total / count[:, None]
    repeats = len(xs) - len(uniq)
    within = ((y - mean[inv]) ** 2).sum(0) / repeats if repeats else np.zeros(y.shape[1])
    return uniq, mean, within


def time_groups(tc: np.ndarray, tt: np.ndarray, enough: Callable[[np.ndarray], bool]) -> list[tuple]:
    """Split a task with context times ``tc [Nc]`` and target times ``tt [Nt]`` into time slices.

    Returns ``(context indices, target indices, pooled)`` triples covering every target once:
    one per target time whose same-time context indices are ``enough`` (``pooled`` False),
    plus one using all context points, time ignored, for the targets whose slice is not
    (``pooled`` True).
    """
    groups, pooled = [], []
    for t in np.unique(tt):
        ctx, tgt = np.flatnonzero(tc == t), np.flatnonzero(tt == t)
        if enough(ctx):
            groups.append((ctx, tgt, False))
        else:
            pooled.append(tgt)
    if pooled:
        groups.append((np.arange(len(tc)), np.concatenate(pooled), True))
    return groups


class SpatialInterpolator(NeuralProcess):
    """Shared machinery: input roles, per-task and per-time-slice loops, tensor plumbing.

    Subclasses implement :meth:`interpolate` on one slice's merged context and say via
    :meth:`enough` when a time slice has sufficient context of its own.
    """

    trainable = False  # nothing is learned across tasks: everything is fitted per task
    # Distances and equality of times are unchanged by shifting every input.
    translation_equivariant = True

    def __init__(self, dim_x: int, dim_y: int, time_input: int | None = None,
                 space_inputs: tuple[int, ...] | list[int] | None = None) -> None:
        super().__init__(dim_x, dim_y)
        if time_input is None and space_inputs is None:  # the engine's [time, row, col(, elevation)]
            time_input = 0 if dim_x >= 3 else None
        space = tuple(space_inputs) if space_inputs is not None else (1, 2) if dim_x >= 3 else tuple(range(dim_x))

        def index(i: object) -> bool:
            return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < dim_x

        if time_input is not None and not index(time_input):
            raise ValueError(f"time_input must be None or an input index in 0..{dim_x - 1}, got {time_input!r}")
        if not space or not all(index(i) for i in space):
            raise ValueError(f"space_inputs must be a non-empty tuple of input indices in 0..{dim_x - 1}, got {space}")
        if len(set(space)) != len(space) or time_input in space:
            raise ValueError(f"space_inputs {space} must be distinct and must not contain time_input {time_input}")
        self.time_input = time_input
        self.space_inputs = space

    def enough(self, xs: np.ndarray) -> bool:  # pragma: no cover - abstract
        """Whether one time slice's unique context locations ``xs [N, Ds]`` suffice on their own."""
        raise NotImplementedError

    def interpolate(self, xs: np.ndarray, y: np.ndarray, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, sigma > 0)``, each ``[M, Dy]``, at ``xq [M, Ds]`` from unique ``xs [N, Ds]``, ``y [N, Dy]``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def predict(
        self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor, mask_t: torch.Tensor
    ) -> Normal:
        """Interpolate task by task in float64 numpy; ``loc``/``scale`` ``[B, Nt, Dy]`` in ``xt``'s dtype."""
        b, nt, _ = xt.shape
        loc, scale = np.zeros((b, nt, self.dim_y)), np.ones((b, nt, self.dim_y))
        xc_, yc_, xt_ = (t.detach().to("cpu", torch.float64).numpy() for t in (xc, yc, xt))
        mc_, mt_ = mask_c.cpu().numpy(), mask_t.cpu().numpy()
        # The linear systems here are small (<= max_points), where BLAS threads gain little, and
        # with the cores busy elsewhere they made one infill run of kriging 20x slower (20 s).
        with one_blas_thread():
            for i in range(b):
                if mt_[i].any():
                    loc[i, mt_[i]], scale[i, mt_[i]] = self._task(xc_[i, mc_[i]], yc_[i, mc_[i]], xt_[i, mt_[i]])
        as_out = {"dtype": xt.dtype, "device": xt.device}
        return Normal(torch.as_tensor(loc, **as_out), torch.as_tensor(scale, **as_out))

    def _task(self, xc: np.ndarray, yc: np.ndarray, xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One task: ``xc [Nc, Dx]``, ``yc [Nc, Dy]``, ``xt [Nt, Dx]`` -> mean, sigma ``[Nt, Dy]``."""
        space = list(self.space_inputs)
        if self.time_input is None:
            tc, tt = np.zeros(len(xc)), np.zeros(len(xt))
        else:
            tc, tt = xc[:, self.time_input], xt[:, self.time_input]
        mean, sigma = np.empty((2, len(xt), self.dim_y))
        for ctx, tgt, pooled in time_groups(tc, tt, lambda idx: self.enough(np.unique(xc[idx][:, space], axis=0))):
            xs, y, within = _merge_duplicates(xc[ctx][:, space], yc[ctx])
            mean[tgt], sigma[tgt] = self.interpolate(xs, y, xt[tgt][:, space])
            if pooled:
                # The pooled field is a time average, exact at the merged locations: a target at
                # another time also differs from it by the field's change over time, estimated
                # from locations seen at several times. Without this, kriging's sigma at a
                # fully clouded slice was 2e-4 K for errors of 1 K (Alboran SST, NLL 2e4).
                sigma[tgt] = np.sqrt(sigma[tgt] ** 2 + within)
        return mean, sigma


def _triangulation(xs: np.ndarray) -> Delaunay:
    """Delaunay triangulation of ``xs [N, Ds]`` with its barycentric transforms precomputed.

    scipy computes them lazily with one LAPACK call per simplex, through its own OpenBLAS:
    with other processes keeping the CPUs busy that took up to 11 s for 700 points, where
    one batched numpy inverse takes under a millisecond.
    """
    tri = Delaunay(xs)
    corners = xs[tri.simplices]  # [S, Ds + 1, Ds]
    try:
        inv = np.linalg.inv(np.swapaxes(corners[:, :-1] - corners[:, -1:], 1, 2))
        tri._transform = np.concatenate([inv, corners[:, -1:]], 1)  # scipy's layout and cache
    except (np.linalg.LinAlgError, AttributeError):
        pass  # a flat simplex, or a scipy without that cache: let scipy compute them
    return tri


def _barycentric(tri: Delaunay, y: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """Linear interpolation of ``y [N, Dy]`` at ``xq [M, Ds]`` on ``tri``'s simplices; NaN outside the hull.

    A target's value depends on that target alone, so a window filled in two output blocks
    gives its shared cells the same bits. scipy's walk starts each search where the previous
    target's ended, and a target on a shared face (lattice cells often are) lands in either
    simplex, whose weights round differently. Such targets take instead the lowest-numbered
    simplex holding them.
    """
    simplex = tri.find_simplex(xq)
    inside = simplex >= 0
    weights = _weights(tri, simplex[inside], xq[inside])
    edge = (weights < _ON_EDGE).any(1)
    if edge.any():
        at = np.flatnonzero(inside)[edge]
        if xq.shape[1] == 2:
            # Plane triangulations are conforming: every triangle holding a point on an edge or
            # corner holds that edge or corner, so the heaviest corner's triangles are the candidates.
            heaviest = tri.simplices[simplex[at], weights[edge].argmax(1)]  # [E]
            candidates = _stars(tri)[heaviest]  # [E, K]
            w = _weights(tri, np.maximum(candidates, 0).ravel(), np.repeat(xq[at], candidates.shape[1], 0))
            holds = (w.reshape(*candidates.shape, -1) >= -_ON_FACE).all(-1) & (candidates >= 0)
            best = np.where(holds, candidates, np.iinfo(candidates.dtype).max).min(1)
            best[~holds.any(1)] = -1  # none within rounding: keep the simplex the walk found
        else:
            # Qhull's triangulation of cospherical points in 3-D and up need not be (flat simplices
            # fill the seams), so search every simplex; scipy's brute force takes the lowest holding one.
            best = tri.find_simplex(xq[at], bruteforce=True)
        simplex[at] = np.where(best >= 0, best, simplex[at])
        weights[edge] = _weights(tri, simplex[at], xq[at])
    corners = y[tri.simplices[simplex[inside]]]  # [M', Ds + 1, Dy]
    out = np.full((len(xq), y.shape[1]), np.nan)
    # Term by term, not a matmul, whose rounding may depend on how many rows share the call.
    total = weights[:, 0, None] * corners[:, 0]
    for j in range(1, weights.shape[1]):
        total = total + weights[:, j, None] * corners[:, j]
    out[inside] = total
    return out


def _stars(tri: Delaunay) -> np.ndarray:
    """``[N, K]``: the simplices having each point as a corner, ascending, padded with -1."""
    corner = tri.simplices.ravel()
    owner = np.repeat(np.arange(len(tri.simplices)), tri.simplices.shape[1])
    order = np.lexsort((owner, corner))
    corner, owner = corner[order], owner[order]
    first = np.searchsorted(corner, corner)  # where each point's run starts
    star = np.full((len(tri.points), int(np.bincount(corner).max())), -1, dtype=np.int64)
    star[corner, np.arange(len(corner)) - first] = owner
    return star


def _weights(tri: Delaunay, simplex: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """Barycentric weights ``[M, Ds + 1]`` of ``xq [M, Ds]`` in simplices ``simplex [M]``, term by term."""
    transform = tri.transform[simplex]  # [M, Ds + 1, Ds]: inverse then the last corner
    d = xq - transform[:, -1]  # [M, Ds]
    ds = xq.shape[1]
    first = []
    for i in range(ds):
        c = transform[:, i, 0] * d[:, 0]
        for j in range(1, ds):
            c = c + transform[:, i, j] * d[:, j]
        first.append(c)
    last = 1.0 - first[0]
    for c in first[1:]:
        last = last - c
    return np.stack([*first, last], 1)


def _linear(xs: np.ndarray, y: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation of ``y [N, Dy]`` at ``xq [M, Ds]``; nearest value outside the hull."""
    if xs.shape[1] == 1:
        # xs is sorted and unique (see _merge_duplicates), as np.interp needs; it holds
        # the end values outside the range, which are the nearest points' values.
        return np.stack([np.interp(xq[:, 0], xs[:, 0], y[:, j]) for j in range(y.shape[1])], 1)
    out = np.full((len(xq), y.shape[1]), np.nan)
    if _spans(xs):
        try:
            out = _barycentric(_triangulation(xs), y, xq)
        except QhullError:  # nearly degenerate (almost colinear) points: use the nearest value everywhere
            pass
    miss = np.isnan(out).any(1)
    if miss.any():
        out[miss] = y[cKDTree(xs).query(xq[miss])[1]]
    return out


@register("linear", presets={"small": {}, "tiny": {}})
class LinearInterpolation(SpatialInterpolator):
    """Piecewise-linear interpolation over the space inputs, per time slice.

    Args:
        dim_x, dim_y: input and output dimensions; each output is interpolated independently.
        time_input: index of the time input, or None. When both it and ``space_inputs`` are
            None: 0 if ``Dx >= 3``, else no time input.
        space_inputs: indices of the space inputs; None: ``(1, 2)`` if ``Dx >= 3``, else every
            input. Other inputs (elevation) are ignored.
        holdout_every: every how many-th context point is held out to fit sigma (default 5).

    A time slice's own context is used when it has ``>= Ds + 1`` affinely independent points,
    else all context points. Inside their convex hull: the Delaunay (``np.interp`` for
    ``Ds == 1``) interpolant; outside: the nearest context point's value.

    Sigma: linear interpolation has no variance of its own, but a baseline must still fill
    ``v_std`` for comparisons with NP models (CRPS, coverage) to be like for like, so it is
    learnt from the task: every ``holdout_every``-th context point (in sorted order of
    location) is interpolated from the others and ``sigma(d)^2 = a + b d``, ``a, b >= 0``, is
    fitted to the squared errors by non-negative least squares, ``d`` being the distance to
    the nearest remaining point (variance growing linearly, as under an exponential
    variogram). A target gets ``sigma(distance to its nearest context point)``. With < 3
    points to hold out: the context's std (1.0 if zero or undefined). Floor: 1e-3 of the spread.

    ``dist = model(xc [B, Nc, Dx], yc [B, Nc, Dy], xt [B, Nt, Dx], mask_c, mask_t)``:
    ``Normal`` with ``loc``/``scale`` ``[B, Nt, Dy]``; padded targets get ``loc 0``, ``scale 1``.
    """

    def __init__(self, dim_x: int, dim_y: int, time_input: int | None = None,
                 space_inputs: tuple[int, ...] | list[int] | None = None, holdout_every: int = 5) -> None:
        super().__init__(dim_x, dim_y, time_input, space_inputs)
        check_int("holdout_every", holdout_every, 2)
        self.holdout_every = holdout_every

    def enough(self, xs: np.ndarray) -> bool:
        return _spans(xs)

    def interpolate(self, xs: np.ndarray, y: np.ndarray, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _linear(xs, y, xq), self._sigma(xs, y, xq)

    def _sigma(self, xs: np.ndarray, y: np.ndarray, xq: np.ndarray) -> np.ndarray:
        """Hold-out estimate of the interpolation error at ``xq [M, Ds]``, ``[M, Dy]``."""
        hold = np.zeros(len(xs), dtype=bool)
        hold[:: self.holdout_every] = True
        rest = ~hold
        if hold.sum() < _MIN_HOLDOUT or rest.sum() < 2:  # too few to learn from: the data's spread
            return np.broadcast_to(spread(y), (len(xq), y.shape[1])).copy()
        r2 = (_linear(xs[rest], y[rest], xs[hold]) - y[hold]) ** 2  # [H, Dy]
        design = np.stack([np.ones(hold.sum()), cKDTree(xs[rest]).query(xs[hold])[0]], 1)
        coef = np.stack([nnls(design, r2[:, j])[0] for j in range(y.shape[1])], 1)  # [2, Dy]
        var = coef[0] + coef[1] * cKDTree(xs).query(xq)[0][:, None]
        return np.maximum(np.sqrt(var), sigma_floor(y))
