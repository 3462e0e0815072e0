"""Spatially coherent samples of a filled scene: fields whose cells err together, as real errors do.

A fill gives each gap cell a mean and a 1-sigma; drawing every cell on its own from them gives
samples whose regional means are far too certain, because neighbouring filled cells err together.
geonp draws a sample of one scene (one time step) by conditional simulation of the errors, the
geostatistician's construction (Journel & Huijbregts 1978; "conditioning by kriging"):

1. the scene's own correlation: an exponential variogram fitted to its observed cells
   (:func:`geonp.variogram.step_variograms`), as a nugget share ``eta`` and a range;
2. an unconditional standard Gaussian field ``u`` with that correlation on the whole grid, by the
   spectral method (a sum of cosines with wave vectors from the covariance's spectral density);
3. ``u`` conditioned to zero at the observed cells: ``u_c = u - sum_i w_i u_i``, ``w`` the simple
   kriging weights of each gap cell from its nearest observed cells, whose variance ``s_k^2`` is
   known: deep inside a cloud ``u_c``
   varies freely, at a cloud's edge it is pinned by the observations beside it;
4. the sample ``mean + sigma * u_c / s_k`` at gap cells, the observation at observed ones.

So every sample is exact at observed cells, its spread at each cell is the fill's own sigma
(``u_c / s_k`` is standard normal at every cell), and its errors are correlated as the scene's
variogram says, across the whole scene at once (no window seams). The kriging weights are solved
once per scene and reused for every sample; memory is a few copies of the scene.
"""

from __future__ import annotations

from collections.abc import Callable

import dask
import dask.array
import numpy as np
import xarray as xr
from scipy.spatial import cKDTree

from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED, SAMPLE_DIM
from geonp.variogram import step_variograms

#: Observed cells conditioning each gap cell, the nearest. Not a quarter per quadrant as the kriging
#: baseline's mean needs (to interpolate across a gap): the errors decorrelate within the range, and
#: the quadrant search took 51 of 59 s for 16 samples of a 150k-cell scene with 42,000 gap cells.
NEIGHBOURS = 32
#: Cosines summed per unconditional field (:func:`unconditional`): its marginal is Gaussian to the
#: central limit and its covariance exact in expectation.
MODES = 1024
_BATCH = 4096  # gap cells solved at once: [batch, K, K] float64, 32 MiB at K = 32


def scene_correlation(values: np.ndarray) -> tuple[float, float]:
    """``(range_cells, nugget_share)`` of the exponential variogram fitted to ``values [R, C]``
    (NaN at gaps): the correlation ``(1 - eta) exp(-3 h / range)`` at ``h`` cells (PyKrige's
    practical range), ``eta`` at zero lag. A scene with too few observed cells for a fit gets a range
    of a quarter of its longer side and no nugget."""
    fallback = (max(values.shape) / 4.0, 0.0)
    seen = values[np.isfinite(values)]
    fit = step_variograms(values[None])[0] if seen.size and seen.std() > 0 else None  # standardised, as kriging fits
    if fit is None:
        return fallback
    psill, range_cells, nugget = fit[2]
    return float(max(range_cells, 1e-3)), float(nugget / (psill + nugget)) if psill + nugget > 0 else 0.0


def correlation(h: np.ndarray, range_cells: float, nugget_share: float) -> np.ndarray:
    """The scene's correlation at distances ``h`` (cells): 1 at zero lag, ``(1 - eta) exp(-3 h / range)`` beyond."""
    return np.where(h > 0, (1.0 - nugget_share) * np.exp(-3.0 * h / range_cells), 1.0)


def unconditional(shape: tuple[int, int], n: int, range_cells: float, nugget_share: float,
                  rng: np.random.Generator, modes: int = MODES) -> np.ndarray:
    """``n`` standard Gaussian fields ``[n, R, C]`` with :func:`correlation`, by the spectral
    (randomisation) method: a sum of ``modes`` cosines whose wave vectors are drawn from the
    exponential covariance's spectral density (a bivariate Cauchy of scale ``3 / range``), so the
    covariance is exact at every lag whatever the range; circulant embedding on a grid twice the
    scene's lost 10% of the variance and a third of the correlation at ranges beyond the scene."""
    a = range_cells / 3.0  # the exponential's scale: exp(-h / a)
    rows, cols = np.arange(shape[0]), np.arange(shape[1])
    fields = np.empty((n, *shape))
    for i in range(n):
        wave = rng.standard_normal((modes, 2)) / np.abs(rng.standard_normal((modes, 1))) / a  # [L, 2]
        phase = rng.uniform(0.0, 2.0 * np.pi, modes)
        along_rows = np.exp(1j * (np.outer(rows, wave[:, 0]) + phase))  # [R, L]
        along_cols = np.exp(1j * np.outer(wave[:, 1], cols))  # [L, C]
        smooth = np.sqrt(2.0 / modes) * (along_rows @ along_cols).real
        fields[i] = np.sqrt(1.0 - nugget_share) * smooth + np.sqrt(nugget_share) * rng.standard_normal(shape)
    return fields


def plane_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distances between points ``a [..., 2]`` and ``b [..., 2]`` (broadcast), ``sqrt(dr^2 + dc^2)``:
    what ``np.linalg.norm(a - b, axis=-1)`` gives to the bit, five times faster on the ``[B, K, K]``
    pairs below (its reduction over an axis of two took 0.5 of the demo's 1.2 s of sample weights)."""
    dr, dc = a[..., 0] - b[..., 0], a[..., 1] - b[..., 1]
    return np.sqrt(dr * dr + dc * dc)


def conditioning_weights(observed: np.ndarray, gaps: np.ndarray, range_cells: float, nugget_share: float,
                         neighbours: int = NEIGHBOURS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Simple kriging of every gap cell from its nearest observed cells under :func:`correlation`.

    Args:
        observed, gaps: ``[R, C]`` bool masks.
        range_cells, nugget_share: the correlation (:func:`scene_correlation`).
        neighbours: observed cells per gap cell, the nearest.

    Returns:
        ``(near [M, K], weights [M, K], sd [M])`` for the ``M`` gap cells in row-major order:
        indices into the observed cells (row-major, -1 absent), their weights (0 where absent), and
        the kriging standard deviation of a standard field (1 with no neighbour).
    """
    pts = np.argwhere(observed).astype(np.float64)
    cells = np.argwhere(gaps)
    k = min(neighbours, len(pts))
    if k == 0:  # nothing observed: the errors are unconditioned
        return np.full((len(cells), 0), -1, np.int64), np.zeros((len(cells), 0)), np.ones(len(cells))
    near = cKDTree(pts).query(cells.astype(np.float64), k=k)[1].reshape(len(cells), k)  # [M, K], nearest first
    weights, sd = np.zeros(near.shape), np.ones(len(cells))
    for start in range(0, len(cells), _BATCH):
        idx = near[start:start + _BATCH]
        ok = idx >= 0
        xs = pts[np.where(ok, idx, 0)]  # [B, K, 2]
        k_nn = correlation(plane_distance(xs[:, :, None], xs[:, None]), range_cells, nugget_share)
        k_nn = k_nn * ok[:, :, None] * ok[:, None, :]
        k = idx.shape[1]
        k_nn[:, np.arange(k), np.arange(k)] = np.where(ok, 1.0 + 1e-9, 1.0)  # absent: an identity row
        k_t = correlation(plane_distance(xs, cells[start:start + _BATCH, None, :]), range_cells,
                          nugget_share) * ok  # [B, K]
        w = np.linalg.solve(k_nn, k_t[..., None])[..., 0]
        weights[start:start + len(idx)] = w * ok
        sd[start:start + len(idx)] = np.sqrt(np.clip(1.0 - (w * k_t).sum(-1), 1e-12, None))
    return near, weights, sd


def kriged(weights: np.ndarray, near: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``[n, M]``: each gap cell's simple-kriging combination ``sum_k weights[m, k] values[s, near[m, k]]``
    of ``values [n, N]`` (``n`` fields at the ``N`` conditioning cells; ``near``/``weights [M, K]``
    from :func:`conditioning_weights`, an absent neighbour -1 with weight 0)."""
    return np.einsum("mk,smk->sm", weights, values[:, np.where(near >= 0, near, 0)])


#: ``values [R, C]`` (NaN at gaps) -> ``(range_cells, nugget_share)`` of the errors' correlation.
CorrelationFit = Callable[[np.ndarray], tuple[float, float]]


def draw_samples(values: np.ndarray, mean: np.ndarray, std: np.ndarray, gaps: np.ndarray, n: int,
                 rng: np.random.Generator, neighbours: int = NEIGHBOURS,
                 correlation_fit: CorrelationFit = scene_correlation) -> np.ndarray:
    """``n`` coherent samples ``[n, R, C]`` of one filled scene (the module's construction).

    Args:
        values: ``[R, C]`` the input, NaN where not observed.
        mean, std: ``[R, C]`` the fill's mean and 1-sigma (read at ``gaps`` only).
        gaps: ``[R, C]`` bool, the cells the fill filled (valid, not observed).
        n: samples.
        rng: the random stream (a given seed gives the same samples).
        neighbours: observed cells conditioning each gap cell.
        correlation_fit: the errors' correlation from the scene (:func:`scene_correlation`, the
            scene's own variogram; another rule is an experiment's, ``pipelines.experiments.samples_check``).

    Returns:
        Samples equal to ``values`` at observed cells, draws at ``gaps``, NaN elsewhere.
    """
    observed = np.isfinite(values)
    out = np.where(observed, values, np.nan)[None].repeat(n, 0)
    if not gaps.any():
        return out
    range_cells, nugget_share = correlation_fit(values)
    near, weights, sd = conditioning_weights(observed, gaps, range_cells, nugget_share, neighbours)
    fields = unconditional(values.shape, n, range_cells, nugget_share, rng)
    conditioned = fields[:, gaps]
    if observed.any():
        at_obs = fields[:, observed]  # [n, N], row-major like the conditioning indices
        conditioned = conditioned - kriged(weights, near, at_obs)
    out[:, gaps] = mean[gaps] + std[gaps] * conditioned / sd
    return out



def with_samples(out: xr.Dataset, variables: list[str], n: int, seed: int,
                 correlation_fit: CorrelationFit = scene_correlation) -> xr.Dataset:
    """``out`` (the fill's layers ``v``, ``v_std``, ``v_flag`` in the working convention, rows and
    columns last) with ``v_sample [sample, *v.dims]`` per variable: ``n`` samples of every scene
    (each index of the leading dimensions), drawn lazily one scene at a time, so that writing them
    holds one scene's ``n`` samples in memory, never the cube's. Reproducible: scene ``i``'s stream
    is ``default_rng([seed, 15331, i])``, whatever the order scenes are computed in. Chunked one
    sample of one scene per chunk. ``correlation_fit``: as for :func:`draw_samples`."""
    out = out.copy()
    for v in variables:
        layer = out[v]
        lead = layer.shape[:-2]
        flat = [layer.data, out[f"{v}_std"].data, out[f"{v}_flag"].data]
        pieces = [dask.array.from_delayed(
            dask.delayed(_scene_samples)(*(a[index] for a in flat), n, seed, i, correlation_fit),
            shape=(n, *layer.shape[-2:]), dtype=np.float32) for i, index in enumerate(np.ndindex(*lead))]
        stacked = dask.array.stack(pieces, axis=1).reshape((n, *layer.shape)) if lead else pieces[0]
        attrs = {k: layer.attrs[k] for k in ("units", "standard_name") if k in layer.attrs}
        attrs["long_name"] = f"coherent samples of {layer.attrs.get('long_name', v)}"
        attrs["comment"] = ("observed cells as observed; filled cells a draw of the fill whose errors are "
                            "correlated as the scene's variogram says (geonp.fill.samples)")
        out[f"{v}_sample"] = ((SAMPLE_DIM, *layer.dims), stacked.rechunk((1, *([1] * len(lead)), -1, -1)), attrs)
    return out


def _scene_samples(values: np.ndarray, std: np.ndarray, flag: np.ndarray, n: int, seed: int,
                   index: int, correlation_fit: CorrelationFit) -> np.ndarray:
    """``n`` samples ``[n, R, C]`` (float32) of one filled scene from its stored layers."""
    values, std, flag = (np.asarray(a) for a in (values, std, flag))
    observed = np.where(flag == FLAG_OBSERVED, values, np.nan).astype(np.float64)
    gaps = (flag == FLAG_INFILLED) & np.isfinite(values) & np.isfinite(std)
    rng = np.random.default_rng([seed, 15331, index])
    return draw_samples(observed, values.astype(np.float64), std.astype(np.float64), gaps, n, rng,
                        correlation_fit=correlation_fit).astype(np.float32)
