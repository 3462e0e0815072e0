"""Ordinary kriging of a whole scene, set up as a geostatistician would: the ``kriging`` baseline.

Per scene (one time step of a field):

* the variogram is fitted once, to every pair of observed cells along the scene's rows, columns
  and diagonals up to ``max_lag`` cells apart (:func:`geonp.variogram.grid_semivariance`; PyKrige's variogram
  families, pair-count then Cressie-weighted least squares, :func:`geonp.variogram.fit_binned`),
  so a gap is filled with the scene's own spatial structure rather than one fitted to the few
  points around it;
* each gap cell is kriged from its ``neighbours // 4`` nearest observed cells in each quadrant
  around it, searched over the whole scene (:func:`quadrant_neighbours`): deep inside a wide
  cloud the nearest cells all lie on the near rim, and a quadrant search reaches the far rims too,
  so kriging interpolates across the gap rather than extrapolating from one side;
* with external drift maps (elevation: ``geonp infill --model kriging --elevation DEM``), kriging
  with an external drift: an unknown mean that is linear in the maps within each neighbourhood,
  the variogram fitted to what the scene's regression on the maps leaves; the same check as for
  the variogram family decides whether the drift predicts the scene's hidden cells better than
  none, as a geostatistician would test it;
* the ordinary-kriging system (a constant but unknown mean) is solved per cell in covariance form,
  ``C(h) = sill + nugget - gamma(h)``, and sigma is the kriging standard deviation of an
  observation at the cell (nugget included), scaled so that up to 1000 observed cells hidden under
  random clouds and kriged from the rest are off by one sigma in root mean square: the variogram
  family's shape near zero sets sigma's level, and a family that fits the scene poorly gets it wrong.

Distances are in grid cells. The variogram families are PyKrige's bounded ones (exponential,
spherical, gaussian); the window baseline ``window-kriging`` (:mod:`geonp.models.kriging`) fits a
variogram per neighbourhood of each infill window instead and was weaker than linear
interpolation inside wide clouds.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.spatial import cKDTree

from geonp.models.kriging import fit_variogram
from geonp.tasks.clouds import moved_randomly, random_clouds
from geonp.variogram import MIN_SCENE_POINTS, fit_grid_variogram

#: Variogram families with a sill (the covariance form needs one).
BOUNDED_MODELS = ("exponential", "spherical", "gaussian")
#: Observed cells hidden under random clouds to check the kriging s.d. against (see krige_scene).
CHECK_POINTS = 1000
_BATCH = 2048  # targets solved at once: [batch, K, K] float64, 64 MiB at K = 64


def quadrant_neighbours(points: np.ndarray, targets: np.ndarray, per_quadrant: int,
                        max_candidates: int = 4096, available: np.ndarray | None = None) -> np.ndarray:
    """The ``per_quadrant`` nearest ``points`` in each quadrant around each target.

    Args:
        points: ``[N, 2]`` (row, col) of the observed cells.
        targets: ``[M, 2]`` (row, col) of the cells to krige.
        per_quadrant: neighbours wanted per quadrant.
        max_candidates: the nearest points examined per target at most; a quadrant with no point
            among them stays short.
        available: ``[M, 4]`` how many points each quadrant of each target holds at all
            (:func:`quadrant_counts`), or None; with it the search stops widening for a quadrant
            that has given all it holds (at a coast or the scene's edge), which is most of the cost.

    Returns:
        ``int [M, 4 * per_quadrant]``: indices into ``points`` (quadrant by quadrant, nearest
        first), -1 where a quadrant has fewer points. Quadrants are half-open (``dr >= 0, dc > 0``
        and its rotations), so every point belongs to exactly one.
    """
    n = len(points)
    out = np.full((len(targets), 4, per_quadrant), -1, np.int64)
    if n == 0 or len(targets) == 0:
        return out.reshape(len(targets), -1)
    tree = cKDTree(points)
    todo = np.arange(len(targets))
    m = min(n, 8 * per_quadrant)
    while todo.size:
        _, cand = tree.query(targets[todo], k=m)
        cand = cand.reshape(len(todo), m)
        d = points[cand] - targets[todo][:, None, :]  # [T, m, 2]
        dr, dc = d[..., 0], d[..., 1]
        quadrant = np.select([(dr >= 0) & (dc > 0), (dr > 0) & (dc <= 0), (dr <= 0) & (dc < 0)], [0, 1, 2], 3)
        quadrant[(dr == 0) & (dc == 0)] = -1  # the target itself (never observed) would be no neighbour
        full = np.ones(len(todo), bool)
        for q in range(4):
            inside = quadrant == q
            rank = np.cumsum(inside, axis=1) - 1  # position among this quadrant's candidates, nearest first
            keep = inside & (rank < per_quadrant)
            rows, cols = np.nonzero(keep)
            out[todo[rows], q, rank[rows, cols]] = cand[rows, cols]
            enough = per_quadrant if available is None else np.minimum(per_quadrant, available[todo, q])
            full &= inside.sum(1) >= enough
        if m >= min(n, max_candidates):
            break
        todo = todo[~full]
        m = min(n, max_candidates, 4 * m)
    return out.reshape(len(targets), -1)


def quadrant_counts(observed: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """How many observed cells lie in each quadrant (as :func:`quadrant_neighbours` splits them)
    around each of ``cells [M, 2]`` (integer row, col) of the grid ``observed [R, C]``: ``[M, 4]``."""
    total = np.zeros((observed.shape[0] + 1, observed.shape[1] + 1), np.int64)
    total[1:, 1:] = observed.cumsum(0).cumsum(1)

    def box(r0, r1, c0, c1):  # observed cells in rows [r0, r1), cols [c0, c1)
        return total[r1, c1] - total[r0, c1] - total[r1, c0] + total[r0, c0]

    r, c = cells[:, 0].astype(np.int64), cells[:, 1].astype(np.int64)
    n_r, n_c = observed.shape
    return np.stack([box(r, n_r, c + 1, n_c),  # dr >= 0, dc > 0
                     box(r + 1, n_r, 0, c + 1),  # dr > 0, dc <= 0
                     box(0, r + 1, 0, c),  # dr <= 0, dc < 0
                     box(0, r, c, n_c)], axis=1)  # dr < 0, dc >= 0


def krige_scene(values: np.ndarray, valid: np.ndarray, *, neighbours: int = 64, variogram_model: str = "exponential",
                trend: bool | str = False, check: str = "clouds", fit_points: int = 2000, nlags: int = 20,
                max_lag: int = 64,
                rng: np.random.Generator | None = None, fallback: tuple[float, float] | None = None,
                drift_maps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict | None]:
    """Krige every gap of one scene.

    Args:
        values: ``[R, C]``, NaN at gaps.
        valid: ``[R, C]`` bool, True where a value can exist.
        neighbours: neighbours per gap cell, a quarter from each quadrant.
        variogram_model: one of :data:`BOUNDED_MODELS`, or ``"auto"``: each is fitted and the one
            whose kriging best predicts the scene's own cells hidden under random clouds is used.
        trend: ``False`` (ordinary kriging: a constant unknown mean in each neighbourhood),
            ``True`` (universal kriging with a linear drift in the row and column in each
            neighbourhood, the variogram fitted to what the scene's plane leaves), or ``"auto"``:
            whichever predicts the hidden cells better.
        check: the cells hidden to choose the family and drift and to scale sigma: ``"clouds"``,
            smooth random clouds of 15% cover, 2-8 cells across; ``"gaps"``, the scene's own gaps
            moved elsewhere (as many as fit in 15% of its observed cells, random clouds where it
            has none), so the check's cells lie as far from an observation as the gaps' do.
        max_lag: the experimental variogram's longest lag, in cells along each axis and diagonal
            (:func:`geonp.variogram.grid_semivariance`); the nearer neighbours of a kriging system lie well within it.
        fit_points, nlags: for a scene too sparse for pairs on the grid: the variogram of up to
            ``fit_points`` random observed cells in ``nlags`` distance bins.
        rng: draws the fitting and checking cells; default seed 0.
        fallback: ``(mean, spread)`` for a scene with fewer than :data:`MIN_SCENE_POINTS` observed
            cells (the whole field's, from :func:`krige_stack`); default the scene's own.
        drift_maps: ``[P, R, C]`` external drift covariates (e.g. elevation in m), finite at every
            valid cell, or None; with them kriging with and without the external drift are both
            checked and the better used.

    Returns:
        ``(mean, std, fit)``: ``[R, C]`` float64 at the gaps (valid and not observed), NaN
        elsewhere; ``fit`` is ``{"model", "trend", "external", "params"}``, the variogram family,
        whether a linear drift in row and column and whether the external drift were used, and the
        fitted ``[partial sill, range, nugget]`` in the scene's units
        (None when the scene had too few observed cells and got its mean and spread).
    """
    families = BOUNDED_MODELS if variogram_model == "auto" else (variogram_model,)
    if any(f not in BOUNDED_MODELS for f in families):
        raise ValueError(f"variogram_model must be one of {BOUNDED_MODELS} or 'auto', got {variogram_model!r}")
    if trend not in (False, True, "auto"):
        raise ValueError(f"trend must be False, True or 'auto', got {trend!r}")
    trends = (False, True) if trend == "auto" else (bool(trend),)
    externals = (False,) if drift_maps is None else (False, True)
    if drift_maps is not None:
        drift_maps = np.asarray(drift_maps, np.float64).reshape(-1, *values.shape)
        if not np.isfinite(drift_maps[:, valid]).all():
            raise ValueError("drift_maps must be finite at every valid cell")
    rng = np.random.default_rng(0) if rng is None else rng
    observed = np.isfinite(values) & valid
    gaps = valid & ~np.isfinite(values)
    mean, std = np.full(values.shape, np.nan), np.full(values.shape, np.nan)
    if not gaps.any():
        return mean, std, None
    pts = np.argwhere(observed).astype(np.float64)  # [N, 2] row, col
    z = values[observed].astype(np.float64)
    tgt = np.argwhere(gaps).astype(np.float64)
    if len(z) < MIN_SCENE_POINTS or z.std() == 0:
        if z.size and z.std() == 0 and len(z) >= MIN_SCENE_POINTS:  # a constant scene: it is that constant
            mean[gaps], std[gaps] = z[0], 1e-6 * max(abs(z[0]), 1.0)
        else:
            centre, spread = fallback if fallback is not None else (z.mean() if z.size else np.nan, z.std())
            mean[gaps], std[gaps] = centre, spread if spread > 0 else np.nan
        return mean, std, None
    centre, scale = z.mean(), z.std()
    zs = (z - centre) / scale
    # Kriging's sigma is as right as the variogram family's shape (an exponential one on a smooth
    # 1-degree SST scene doubled it), and which family and drift suit a scene is the scene's to
    # say. Observed cells hidden under random clouds, kriged from the rest, measure both: the
    # family and drift that predict them best are used, and sigma is scaled to make their
    # root-mean-square standardised error 1. Cloud-shaped, so the check has the distances to the
    # nearest observation that gaps have, which leaving single cells out does not.
    if check not in ("clouds", "gaps"):
        raise ValueError(f"check must be 'clouds' or 'gaps', got {check!r}")
    hide = random_clouds(values.shape, 0.15, rng, float(rng.uniform(2.0, 8.0))) & observed
    if check == "gaps" and gaps.sum() >= MIN_SCENE_POINTS:
        moved = moved_randomly(gaps, rng)
        if (moved & observed).sum() >= MIN_SCENE_POINTS and (observed & ~moved).sum() >= MIN_SCENE_POINTS:
            hide = moved & observed
    check = np.argwhere(hide)
    checkable = len(check) >= MIN_SCENE_POINTS and (observed & ~hide).sum() >= MIN_SCENE_POINTS
    if checkable:
        check = check[rng.choice(len(check), size=min(CHECK_POINTS, len(check)), replace=False)]
        truth = (values[tuple(check.T)] - centre) / scale
    best = None
    for drift, external in ((d, e) for d in trends for e in externals):
        maps = drift_maps if external else None
        resid = _drift_residuals(pts, zs, drift, None if maps is None else maps[:, observed].T)
        grid = np.full(values.shape, np.nan)
        grid[observed] = resid
        for family in families:
            params = fit_grid_variogram(grid, family, max_lag)
            if params is None:  # too few pairs on the grid's axes and diagonals: scattered points
                pick = rng.choice(len(z), size=min(fit_points, len(z)), replace=False)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    params = fit_variogram(pts[pick], resid[pick], family, nlags)
            krige = _kriger(pts, zs, observed, family, params, neighbours, drift, maps)
            score, q2 = 0.0, 1.0
            if checkable:
                cv_mean, cv_sd = krige(observed & ~hide, check.astype(np.float64))
                score = float(np.mean((cv_mean - truth) ** 2))
                q2 = float(np.sqrt(np.mean(((cv_mean - truth) / cv_sd) ** 2)))
            if best is None or score < best[0] - 1e-12:
                best = (score, q2, family, drift, external, params, krige)
    _, q2, family, drift, external, params, krige = best
    m_out, s_out = krige(observed, tgt)
    mean[gaps] = centre + scale * m_out
    std[gaps] = scale * s_out * (q2 if np.isfinite(q2) and q2 > 0 else 1.0)
    psill, range_, nugget = params
    return mean, std, {"model": family, "trend": drift, "external": external,
                       "params": [float(psill * scale**2), float(range_), float(nugget * scale**2)]}


def _drift_residuals(pts: np.ndarray, z: np.ndarray, plane: bool, external: np.ndarray | None) -> np.ndarray:
    """What the least-squares fit of the drift leaves of ``z [N]`` at ``pts [N, 2]``: a constant, a
    plane in row and column with ``plane``, and the external drift's values ``external [N, P]``."""
    if not plane and external is None:
        return z
    columns = [np.ones(len(z))]
    if plane:
        columns += list((pts - pts.mean(0)).T)
    if external is not None:
        columns += list((external - external.mean(0)).T)
    design = np.column_stack(columns)
    coef, *_ = np.linalg.lstsq(design, z, rcond=None)
    return z - design @ coef


def _kriger(pts: np.ndarray, zs: np.ndarray, observed: np.ndarray, family: str, params: list[float],
            neighbours: int, drift: bool, maps: np.ndarray | None = None):
    """``krige(seen [R, C], cells [M, 2]) -> (mean, s.d.)``: standardised kriging of ``cells`` from the
    observed cells ``seen`` (a subset of ``observed``) with the fitted ``family`` variogram; ``maps
    [P, R, C]``: an external drift (None: none)."""
    from pykrige.ok import OrdinaryKriging

    gamma = OrdinaryKriging.variogram_dict[family]
    psill, range_, nugget = params
    total = psill + nugget

    def cov(h: np.ndarray) -> np.ndarray:
        return np.where(h > 0, total - gamma([psill, range_, nugget], h), total)

    def krige(seen: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        use = seen[observed]  # which of pts (row-major, like argwhere) count
        near = quadrant_neighbours(pts[use], cells, max(1, neighbours // 4),
                                   available=quadrant_counts(seen, cells.astype(np.int64)))  # [M, K]
        ext = None
        if maps is not None:
            at = cells.astype(np.int64)
            ext = (maps[:, observed].T[use], maps[:, at[:, 0], at[:, 1]].T)
        return _solve(pts[use], zs[use], cells, near, cov, total, drift, ext)

    return krige


def _solve(pts: np.ndarray, zs: np.ndarray, cells: np.ndarray, near: np.ndarray, cov, total: float,
           drift: bool = False, external: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Kriging at ``cells [M, 2]`` from the neighbours ``near [M, K]`` (indices into ``pts``/``zs``,
    -1 absent), covariance ``cov(h)`` with ``cov(0) = total``: mean and s.d. ``[M]``. Ordinary
    kriging (an unknown constant mean), with ``drift`` universal kriging with an unknown linear
    trend in row and column, with ``external = (at the points [N, P], at the cells [M, P])`` an
    unknown mean linear in those covariates too (kriging with external drift): the bordered system
    ``[[K, F], [F^T, 0]] [w, mu] = [k_*, f_*]``, variance ``total - w k_* - mu f_*``."""
    m_out, s_out = np.empty(len(cells)), np.empty(len(cells))
    p_plane = 3 if drift else 1
    for start in range(0, len(cells), _BATCH):
        idx = near[start:start + _BATCH]
        ok = idx >= 0  # [B, K]
        b, k = idx.shape
        xs = pts[np.where(ok, idx, 0)]  # [B, K, 2]
        h_nn = np.linalg.norm(xs[:, :, None, :] - xs[:, None, :, :], axis=-1)
        k_nn = cov(h_nn) * ok[:, :, None] * ok[:, None, :]
        k_nn[:, np.arange(k), np.arange(k)] = np.where(ok, total + 1e-10, 1.0)
        rel = xs - cells[start:start + _BATCH, None, :]  # neighbours relative to the target: its drift is [1, 0, 0]
        k_t = cov(np.linalg.norm(rel, axis=-1)) * ok  # [B, K]
        # The drift's columns in units of the neighbourhood's size, so the system stays well scaled.
        reach = np.maximum(np.abs(np.where(ok[..., None], rel, 0.0)).max(axis=(1, 2)), 1.0)[:, None]
        columns = [ok.astype(np.float64), *(rel[..., i] / reach * ok for i in range(p_plane - 1))]
        if external is not None:  # the covariates relative to the target's, each in its neighbourhood's range
            at_pts, at_cells = external
            rel_e = np.where(ok[..., None], at_pts[np.where(ok, idx, 0)] - at_cells[start:start + b, None, :], 0.0)
            spread = np.abs(rel_e).max(axis=1, keepdims=True)  # [B, 1, P]
            columns += list(np.moveaxis(rel_e / np.where(spread > 0, spread, 1.0), -1, 0))
        f = np.stack(columns, -1)  # [B, K, P]
        p = f.shape[-1]
        a = np.zeros((b, k + p, k + p))
        a[:, :k, :k], a[:, :k, k:], a[:, k:, :k] = k_nn, f, np.swapaxes(f, 1, 2)
        a[:, np.arange(k, k + p), np.arange(k, k + p)] = -1e-10  # a collinear neighbourhood leaves the drift undefined
        rhs = np.zeros((b, k + p))
        rhs[:, :k], rhs[:, k] = k_t, 1.0
        solved = np.linalg.solve(a, rhs[..., None])[..., 0]
        w, mu = solved[:, :k], solved[:, k:]
        m_out[start:start + b] = (w * np.where(ok, zs[np.where(ok, idx, 0)], 0.0)).sum(-1)
        s_out[start:start + b] = np.sqrt(np.clip(total - (w * k_t).sum(-1) - mu[:, 0], 1e-12, None))
    return m_out, s_out


def krige_stack(values: np.ndarray, valid: np.ndarray, *, neighbours: int = 64, variogram_model: str = "exponential",
                trend: bool | str = False, check: str = "clouds", rng: np.random.Generator | None = None,
                drift_maps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """:func:`krige_scene` on every step of ``values [T, R, C]`` (``valid`` ``[R, C]`` or ``[T, R, C]``;
    ``variogram_model``, ``trend``, ``check`` and ``drift_maps [P, R, C]``, the same for every step,
    as there); returns ``(mean, std, what)``, the first two ``[T, R, C]`` with NaN except at the gaps."""
    rng = np.random.default_rng(0) if rng is None else rng
    valid = np.broadcast_to(np.asarray(valid, bool), values.shape)
    mean, std = np.full(values.shape, np.nan), np.full(values.shape, np.nan)
    seen = values[np.isfinite(values) & valid]
    whole = (float(seen.mean()), float(seen.std()) or 1e-6) if seen.size else None
    chosen = []
    for t in range(values.shape[0]):
        mean[t], std[t], fit = krige_scene(values[t], valid[t], neighbours=neighbours, variogram_model=variogram_model,
                                           trend=trend, check=check, rng=rng, fallback=whole, drift_maps=drift_maps)
        if fit is not None:
            chosen.append(f"{fit['model']}{' with a linear drift' if fit['trend'] else ''}"
                          f"{' with the external drift' if fit['external'] else ''}")
    kinds = ", ".join(f"{k} ({n})" for k, n in zip(*np.unique(chosen, return_counts=True))) if chosen else "none"
    how = "kriging" if trend is False else "kriging, with a linear drift where it checked better"
    if drift_maps is not None:
        how += ", elevation as an external drift where it checked better"
    return mean, std, f"{'ordinary ' if trend is False else ''}{how}; variogram fitted per scene: {kinds}; " \
                      f"{neighbours} neighbours by quadrant"
