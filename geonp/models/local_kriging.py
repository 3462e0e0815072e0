"""Local kriging head: ordinary kriging of each target from its ``k`` nearest context points,
with a covariance the network predicts per target.

Kriging is the best linear unbiased interpolator for a field whose covariance is known; on real
cloud gaps it set the accuracy bar the neural processes missed (issue #13). Learning weights that
good from scratch takes far more training than a CPU affords, so this head gives the model the
kriging solution as a feature and lets it learn where to trust it and by how much to correct it:

* the covariance is exponential, Matern-3/2 or squared-exponential (``kernel``) with one
  lengthscale per input dimension (time and space separately), a sill and a nugget, all
  predicted from the target's token by a small MLP (so each target gets a kernel suited to its
  window, as kriging fits a variogram per window);
* the weights solve the ordinary-kriging system on the target's neighbours (the local mean is
  estimated, not assumed zero):  ``[K + t I, 1; 1^T, 0] [w; m] = [k_*; 1]``, through one
  Cholesky factor of ``K + t I``;
* it returns the kriging mean ``w^T y`` and the log kriging variance of an observation
  ``s + t - w^T k_* - m``; the model adds both to its target tokens, from which its decoder sets
  sigma, and predicts the kriging mean (:class:`geonp.models.tnp.TEPTTNP`).
* with covariates (``drift``, e.g. what the scene's history predicts at each cell), the local
  mean is ``b0 + b . (d_i - d_*)`` instead of a constant: kriging with external drift, whose
  coefficients are estimated from the target's own neighbours (generalised least squares, inside
  the kriging system), so each target learns the day-to-day relation (offset and scale) between
  its field and the covariate where it is, and a covariate that says nothing gets a slope near 0.
  The same Cholesky factor serves: ``A = K^-1 [k_*, F]``, ``l = (F^T K^-1 F)^-1 (F^T K^-1 k_* - f_*)``,
  ``w = K^-1 k_* - K^-1 F l``, variance ``s + t - w^T k_* - l^T f_*``, with ``F = [1, d_i - d_*]``
  and ``f_* = [1, 0]``; a small ridge on each slope (relative to its own precision) keeps
  ``F^T K^-1 F`` invertible where the covariate is flat. Without covariates this is the ordinary kriging above.
* 64 neighbours estimate a slope noisily, and where the history is good its noise is most of the
  error (Sentinel-2 NDVI far from observations: the drift was behind DINEOF itself). With
  ``slope_prior="empirical"`` the slopes get a Gaussian prior per window (empirical Bayes): centred
  on the precision-weighted mean of the window's targets' own slopes, with their variance about it
  beyond their sampling noise. Where the relation holds across the window the targets borrow it,
  where it changes from place to place (moving fronts) each keeps its own. The prior adds
  ``1 / tau^2`` to ``F^T K^-1 F``'s slope entries (Bayesian kriging; the weights and variance keep
  the form above) and kriging ``y - d . centre`` moves the mean by ``- centre . sum_i w_i (d_i - d_*)``.

Only differences of inputs enter, so the head keeps translation equivariance. Cost: one
``k x k`` Cholesky factorisation per target, ``O(Nt k^3)``; the ``k x k`` steps run a
cache-sized slice of targets at a time, and the covariance and the solve have their backward
passes written out (:mod:`geonp.models.kriging_linalg`; measured on one thread, te_speed's
flagship batches, the three together: training step 3.2-3.4 -> 1.2 s, infill 1.42 -> 0.69-0.71 s
per 16 windows; the slicing alone 1.92 -> 1.14 s and 1.19 -> 0.68 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from geonp.models.kriging_linalg import NeighbourCovariance, correlation, spd_solve
from geonp.models.layers import mlp
from geonp.models.local_attention import gather_rows, pack_wanted
from geonp.models.slope_prior import slope_prior

#: Initial covariance: lengthscale per kernel (input units; 8 cells per unit in infill windows),
#: sill, nugget. The rough kernels start long: with an exponential kernel and 64 neighbours, 2 units
#: (16 cells) gave RMSE within 2-8% of per-window fitted kriging on the validation crops (untrained).
INIT_LENGTHSCALES = {"gaussian": 0.25, "matern32": 1.0, "exponential": 2.0}
INIT_SILL, INIT_NUGGET = 1.0, 0.05
#: K x K entries processed at once (4 MiB of float32): one slice of targets (``LocalKriging.cache_elems``).
#: 1 MiB slices (64 targets of 64 neighbours) kept each step in cache, but since the solve is a
#: few dozen batched products a call (:func:`geonp.models.kriging_linalg.cholesky_solve`) their
#: fixed cost won: 4 MiB took the head from 113 to 77 us a target in prediction and 199 to 124
#: with its backward pass (4 windows of 1,024 targets, external drift, 2 threads); 16 MiB lost.
#: Measured before the ``spd`` kernel, which now solves where it is built (the blocked solve is
#: its fallback); not measured again since.
CACHE_ELEMS = 2**20
#: The same on a GPU (64 MiB): 1 MiB slices made 5,344 kriging-head calls of a 40 s fill of the
#: 150k-cell scene on an H200 (pipelines/results/fill_profile_cuda_scene150k.md).
GPU_CACHE_ELEMS = 2**24
#: Ridge on each drift slope, relative to that slope's own entry of ``F^T K^-1 F`` (a tiny floor
#: keeps a covariate flat among a target's neighbours solvable: its slope then goes to 0); a head's
#: own is ``LocalKriging.drift_ridge``.
DRIFT_RIDGE = 1e-3
#: A scene's nugget share as the head takes it (``nugget_share``): at least a trace, so the system
#: stays as well conditioned as with the network's own nugget, and at most most of the variance.
NUGGET_SHARE_RANGE = (1e-5, 0.9)
#: The slopes' priors by name (a positive number is a fixed share of each slope's own precision).
SLOPE_PRIORS = ("none", "empirical")


@dataclass(frozen=True)
class KrigingConfig:
    """The local kriging head's settings inside a model (``TEPTTNP(kriging={...})``); none holds a weight.

    Args:
        neighbours: kriging neighbours per target ``K``.
        quadrant_dims: two location dimensions (e.g. ``[1, 2]``, rows and columns): the neighbours
            are then the ``K // 4`` nearest in each quadrant around the target, so targets deep in
            a gap see its far side too (:func:`~geonp.models.local_attention.nearest_neighbours`);
            None: the ``K`` nearest.
        covariates: the model's last ``covariates`` inputs are covariates (what the scene's history
            predicts at each cell, :mod:`geonp.tasks.history`), not locations: they enter only the
            head's external drift.
        slope_prior: how the drift slopes are estimated (:class:`LocalKriging`).
        nugget_input: the last covariate is not a drift but the scene's nugget share, which sets
            the head's nugget (the variogram a geostatistician fits per scene).
    """

    neighbours: int = 64
    quadrant_dims: tuple[int, int] | None = None
    covariates: int = 0
    slope_prior: str | float = "none"
    nugget_input: bool = False

    @classmethod
    def from_dict(cls, value: dict[str, Any], dim_x: int) -> KrigingConfig:
        """Read and check a model header's ``kriging`` entry for a model of ``dim_x`` inputs.

        Raises:
            ValueError: an unknown key or a value out of range, naming it.
        """
        if not isinstance(value, dict):
            raise ValueError(f"kriging must be a mapping of {', '.join(cls.__dataclass_fields__)}, got {value!r}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"kriging: unknown setting(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(cls.__dataclass_fields__)}")
        quadrants = value.get("quadrant_dims")
        cfg = cls(**{**value, "quadrant_dims": None if quadrants is None else tuple(quadrants)})
        locations = dim_x - cfg.covariates
        if not 0 <= cfg.covariates < dim_x:
            raise ValueError(f"kriging covariates must be in 0..{dim_x - 1}, got {cfg.covariates}")
        if cfg.nugget_input and not cfg.covariates:
            raise ValueError("kriging nugget_input needs the nugget as the last of the kriging covariates")
        if cfg.neighbours < 1:
            raise ValueError(f"kriging neighbours must be at least 1, got {cfg.neighbours}")
        if cfg.quadrant_dims is not None and (len(cfg.quadrant_dims) != 2
                                              or not all(0 <= d < locations for d in cfg.quadrant_dims)):
            raise ValueError(f"kriging quadrant_dims needs two location dimensions in 0..{locations - 1}, "
                             f"got {list(cfg.quadrant_dims)}")
        return cfg


def variance_gap(gap: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """How much less the error variance of kriging weights ``w [B, Nt, K]`` is under the network's
    own covariance than under the scene's, whose nugget is ``gap [B, Nt]`` larger, ``[B, Nt]``.

    The scene's nugget sets the weights, but the decoder that turns the head's log variance into
    sigma learnt to read variances of the network's own near-zero nugget; given the scene's it
    widened sigma far too much where the share is large (Alaska's NDVI: CRPS +40%). So the head
    reports the variance of the same weights under the network's covariance: for weights that
    solve ``K w = k_* - F l`` (``F^T w = f_*``) with the scene's ``K``, the error variance
    ``c0 - 2 w^T k_* + w^T K w`` is ``c0 - w^T k_* - l_0``; the network's ``K`` and ``c0`` are the
    scene's less ``gap`` on the diagonal, which takes ``gap (1 + sum_i w_i^2)`` off.
    """
    return gap * (1 + w.square().sum(-1))


def _spreader(mask_t: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor]):
    """``[1, P, ...]`` results of the packed real targets (``rows``, :func:`pack_wanted`) -> ``[B, Nt, ...]``:
    each real target's own, and at a padding row a copy of a real target's (its window's first, or
    any), so that every later step solves a well-posed system there; padding is never read."""
    b, nt = mask_t.shape
    count = rows[0].numel()
    position = torch.zeros(b, nt, dtype=torch.long, device=mask_t.device)
    position[rows] = torch.arange(count, device=mask_t.device)
    first = (mask_t.sum(1).cumsum(0) - mask_t.sum(1)).clamp(max=count - 1)  # [B]: a window's first real target
    source = torch.where(mask_t, position, first[:, None])  # [B, Nt]
    return lambda t: t[0][source]


class LocalKriging(nn.Module):
    """``(zt [B, Nt, Dz], xt [B, Nt, Dx], xc [B, Nc, Dx], yc [B, Nc, Dy], index/valid [B, Nt, K])``
    -> ``(mean [B, Nt, Dy], log variance [B, Nt, 1])`` of ordinary kriging on each target's neighbours.

    ``kernel``: the covariance family (see :func:`correlation`); its lengthscales, sill and nugget
    are predicted per target. ``slope_prior``: how a target's drift slopes are estimated (module
    docstring): ``"none"``, from its own neighbours; ``"empirical"``, shrunk towards the window's
    slope as far as the targets' slopes agree; a positive number, shrunk by that share of each
    slope's own precision.

    Two attributes hold no weights: ``drift_ridge`` (:data:`DRIFT_RIDGE`; 0 is the textbook system)
    and ``cache_elems`` (:data:`CACHE_ELEMS`, :data:`GPU_CACHE_ELEMS` on a GPU: how many targets'
    systems are formed at once, which bounds memory and never changes the result; set by
    ``NeuralProcess.for_prediction`` / ``for_training`` for the model's device).
    """

    def __init__(self, dim_model: int, dim_x: int, kernel: str = "gaussian",
                 weights: list[float] | None = None, slope_prior: str | float = "none") -> None:
        super().__init__()
        correlation(torch.zeros(1), kernel)  # an unknown kernel fails at build time
        number = isinstance(slope_prior, (int, float)) and not isinstance(slope_prior, bool)
        if not (slope_prior in SLOPE_PRIORS or (number and math.isfinite(slope_prior) and slope_prior > 0)):
            raise ValueError(f"kriging slope prior must be one of {', '.join(SLOPE_PRIORS)} or a positive number, "
                             f"got {slope_prior!r}")
        self.dim_x, self.kernel, self.slope_prior = dim_x, kernel, slope_prior
        self.drift_ridge, self.cache_elems = DRIFT_RIDGE, CACHE_ELEMS
        self.covariance = mlp(dim_model, dim_model, dim_x + 2)  # log lengthscales [Dx], log sill, log nugget
        nn.init.zeros_(self.covariance[-1].weight)
        # Initial lengthscales follow the neighbour metric's weights (a dimension weighted w starts at
        # INIT_LENGTHSCALES[kernel] / w; weight 0, ignored by the search, starts nearly flat at 1e3).
        scales = [INIT_LENGTHSCALES[kernel] / w if w > 0 else 1e3 for w in (weights or [1.0] * dim_x)]
        with torch.no_grad():
            self.covariance[-1].bias.copy_(torch.tensor(
                [math.log(s) for s in scales] + [math.log(INIT_SILL), math.log(INIT_NUGGET)]))

    def forward(self, zt: torch.Tensor, xt: torch.Tensor, xc: torch.Tensor, yc: torch.Tensor,
                index: torch.Tensor, valid: torch.Tensor, drift_t: torch.Tensor | None = None,
                drift_c: torch.Tensor | None = None, mask_t: torch.Tensor | None = None,
                nugget_share: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``drift_t [B, Nt, P]``, ``drift_c [B, Nc, P]``: covariates of the external drift (None:
        ordinary kriging); ``mask_t [B, Nt]``: the real targets (None: all), whose slopes set the
        slopes' prior (``slope_prior``); ``nugget_share [B, Nt]``: each target's nugget as a share
        of sill + nugget, the scene's own (:func:`geonp.variogram.step_nugget_shares`), in place of
        the predicted nugget in the weights (None, or a negative share for a target: the predicted
        one); the log variance stays that of the network's covariance (:func:`variance_gap`).

        Where ``mask_t`` marks padding, each target's system is formed and solved for the real
        targets alone (packed as one task: padding was 42% of the target rows in the demo's
        fine-tuning batches); the padding rows get copies of a real target's results."""
        spread = None
        if mask_t is not None and bool(mask_t.any()) and not bool(mask_t.all()):
            rows, index = pack_wanted(mask_t, index, xc.shape[1])
            b, nc = xc.shape[:2]
            zt, xt, valid = zt[rows][None], xt[rows][None], valid[rows][None]
            xc, yc = xc.reshape(1, b * nc, -1), yc.reshape(1, b * nc, -1)
            if drift_c is not None:
                drift_t, drift_c = drift_t[rows][None], drift_c.reshape(1, b * nc, -1)
            if nugget_share is not None:
                nugget_share = nugget_share[rows][None]
            spread = _spreader(mask_t, rows)
        if drift_c is None:
            mean, log_var = self._sliced(zt, xt, xc, yc, index, valid, nugget_share=nugget_share)
            return (mean, log_var) if spread is None else (spread(mean), spread(log_var))
        parts = self._sliced(zt, xt, xc, yc, index, valid, drift_t, drift_c, nugget_share)
        if self.slope_prior == "none":  # each target's slopes from its neighbours alone
            prior, centre = self.drift_ridge, None
        else:  # pooled over each window's real targets (no gradient: spread padded only for it)
            prior, centre = self._slope_prior(parts if spread is None else {
                key: spread(value.detach()) for key, value in parts.items()}, mask_t)
            if spread is not None:  # each packed target's window's
                centre = centre[rows[0]][None]  # [1, P', P, Dy]
                prior = prior[rows[0], 0][None] if torch.is_tensor(prior) else prior  # [1, P', P]
        mean, log_var = self._drift_solution(parts, prior, centre)
        return (mean, log_var) if spread is None else (spread(mean), spread(log_var))

    def _sliced(self, zt: torch.Tensor, xt: torch.Tensor, xc: torch.Tensor, yc: torch.Tensor,
                index: torch.Tensor, valid: torch.Tensor, drift_t: torch.Tensor | None = None,
                drift_c: torch.Tensor | None = None, nugget_share: torch.Tensor | None = None):
        """:meth:`_targets` a slice of targets at a time, joined along the targets: ``(mean, log
        variance)`` of ordinary kriging, or the drift system's parts (:meth:`_drift_parts`)."""
        # Targets a slice at a time: each step's K x K matrices then stay in cache rather than
        # streaming through memory once per elementwise step.
        b, nt, k = index.shape
        step = max(1, self.cache_elems // (b * k * k))
        if step >= nt:
            return self._targets(zt, xt, xc, yc, index, valid, drift_t, drift_c, nugget_share)
        parts = [self._targets(zt[:, s:s + step], xt[:, s:s + step], xc, yc, index[:, s:s + step],
                               valid[:, s:s + step], None if drift_t is None else drift_t[:, s:s + step], drift_c,
                               None if nugget_share is None else nugget_share[:, s:s + step])
                 for s in range(0, nt, step)]
        if drift_c is not None:
            return {key: torch.cat([part[key] for part in parts], 1) for key in parts[0]}
        return torch.cat([m for m, _ in parts], 1), torch.cat([v for _, v in parts], 1)

    def kernel_parameters(self, zt: torch.Tensor, nugget_share: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Each target's covariance as the head uses it: ``(lengthscales [B, Nt, Dx] in input units,
        sill [B, Nt], nugget [B, Nt], gap)`` from its token ``zt [B, Nt, D]``; with ``nugget_share
        [B, Nt]`` the nugget is the scene's (a negative share keeps the network's own) and ``gap
        [B, Nt]`` the scene's nugget less the network's (:func:`variance_gap`), else None."""
        p = self.covariance(zt).float().clamp(-12.0, 8.0)  # [B, Nt, Dx + 2], bounded: exp stays finite
        ell = p[..., :self.dim_x].exp()  # [B, Nt, Dx]
        sill, nugget = p[..., self.dim_x].exp(), p[..., self.dim_x + 1].exp()  # [B, Nt]
        gap = None
        if nugget_share is not None:  # n / (s + n) = share  <=>  n = s share / (1 - share)
            share = nugget_share.float().clamp(NUGGET_SHARE_RANGE[0], NUGGET_SHARE_RANGE[1])
            # A negative share keeps the network's own nugget for that target (no gap).
            gap = torch.where(nugget_share < 0, 0.0, sill * share / (1 - share) - nugget)
            nugget = nugget + gap
        return ell, sill, nugget, gap

    def _targets(self, zt: torch.Tensor, xt: torch.Tensor, xc: torch.Tensor, yc: torch.Tensor,
                 index: torch.Tensor, valid: torch.Tensor, drift_t: torch.Tensor | None = None,
                 drift_c: torch.Tensor | None = None, nugget_share: torch.Tensor | None = None):
        ell, sill, nugget, gap = self.kernel_parameters(zt, nugget_share)
        # Absent neighbours may hold anything (NaN padding): zero them so 0 * NaN never arises.
        xg = torch.where(valid[..., None], gather_rows(xc, index), 0.0).float()  # [B, Nt, K, Dx]
        yg = torch.where(valid[..., None], gather_rows(yc, index), 0.0).float()  # [B, Nt, K, Dy]
        ok = valid.float()  # [B, Nt, K]
        scaled = (xg - xt.float()[:, :, None, :]) / ell[:, :, None, :]  # [B, Nt, K, Dx]: offsets in lengthscales
        k_tn = sill[..., None] * correlation(scaled.square().sum(-1), self.kernel) * ok  # [B, Nt, K]
        k_nn = NeighbourCovariance.apply(scaled, sill, nugget, ok, self.kernel)  # [B, Nt, K, K]
        if drift_c is not None:
            parts = self._drift_parts(k_nn, k_tn, ok, yg, sill, nugget, drift_t, drift_c, index, valid)
            return parts if gap is None else {**parts, "gap": gap}
        # Ordinary kriging through one Cholesky factor: w = K^-1 (k_* - m 1) with the Lagrange
        # multiplier m = (1^T K^-1 k_* - 1) / (1^T K^-1 1) making the weights sum to one.
        rhs = torch.stack([k_tn, ok], -1)  # [B, Nt, K, 2]
        a, b = spd_solve(k_nn, rhs).unbind(-1)  # K^-1 k_*, K^-1 1: [B, Nt, K]
        lagrange = ((ok * a).sum(-1) - 1) / (ok * b).sum(-1).clamp(min=1e-12)  # [B, Nt]
        w = a - lagrange[..., None] * b
        mean = torch.einsum("btk,btky->bty", w, yg)  # [B, Nt, Dy]
        var = sill + nugget - (w * k_tn).sum(-1) - lagrange  # [B, Nt]
        if gap is not None:
            var = var - variance_gap(gap, w)
        return mean, var.clamp(min=1e-6).log()[..., None]

    @staticmethod
    def _drift_parts(k_nn: torch.Tensor, k_tn: torch.Tensor, ok: torch.Tensor, yg: torch.Tensor, sill: torch.Tensor,
                     nugget: torch.Tensor, drift_t: torch.Tensor, drift_c: torch.Tensor, index: torch.Tensor,
                     valid: torch.Tensor) -> dict[str, torch.Tensor]:
        """The kriging-with-external-drift system (module docstring) of each target, solved but for
        the slopes' prior: ``k_nn [B, Nt, K, K]``, ``k_tn``/``ok [B, Nt, K]``, ``yg [B, Nt, K, Dy]``,
        ``drift_t [B, Nt, P]``, ``drift_c [B, Nc, P]`` -> ``a = K^-1 k_* [B, Nt, K]``, ``kf = K^-1 F``
        and ``f = F [B, Nt, K, 1 + P]``, ``gram = F^T K^-1 F [B, Nt, 1 + P, 1 + P]``, ``yg``,
        ``k_tn``, ``c0 = sill + nugget [B, Nt]``."""
        # Drift functions at the neighbours, relative to the target: F = [1, d_i - d_*] [B, Nt, K, 1 + P].
        dg = torch.where(valid[..., None], gather_rows(drift_c, index), 0.0).float()  # [B, Nt, K, P]
        rel = (dg - drift_t.float()[:, :, None, :]) * ok[..., None]
        f = torch.cat([ok[..., None], rel], -1)  # [B, Nt, K, 1 + P]
        solved = spd_solve(k_nn, torch.cat([k_tn[..., None], f], -1))  # K^-1 [k_*, F]: [B, Nt, K, 2 + P]
        a, kf = solved[..., 0], solved[..., 1:]  # [B, Nt, K], [B, Nt, K, 1 + P]
        with torch.autocast(kf.device.type, enabled=False):  # float32 under bf16 autocast: the
            gram = f.float().transpose(-1, -2) @ kf.float()  # prior's tests of information need it
        return {"a": a, "kf": kf, "f": f, "gram": gram, "yg": yg, "k_tn": k_tn, "c0": sill + nugget}

    def _drift_solution(self, parts: dict[str, torch.Tensor], prior: float | torch.Tensor,
                        centre: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean [B, Nt, Dy], log variance [B, Nt, 1])`` of :meth:`_drift_parts`' systems with a
        Gaussian prior on the slopes: precision ``prior``, a float (a share of each slope's own
        precision, scale-free; ``drift_ridge`` keeps a flat covariate solvable) or a tensor
        ``[B, 1, P]`` of absolute precisions per window (or ``[B, Nt, P]`` per target), added to the
        ridge of no prior (``drift_ridge`` of each slope's own); mean ``centre [B, P, Dy]`` per window
        or ``[B, Nt, P, Dy]`` per target (None: 0). The
        intercept is the ordinary-kriging constraint and never has a prior. Solved in float32 with
        autocast off, as the covariance and its solve are. With prior precision
        ``R`` the weights are those of Bayesian kriging (``F^T K^-1 F`` becomes ``F^T K^-1 F + R``),
        and kriging ``y - d . centre`` instead of ``y`` subtracts ``centre . sum_i w_i (d_i - d_*)``
        from the mean (the weights sum to one)."""
        parts = {key: value.float() for key, value in parts.items()}
        a, kf, f, gram = parts["a"], parts["kf"], parts["f"], parts["gram"]
        diag = gram.diagonal(dim1=-2, dim2=-1)  # [B, Nt, 1 + P]
        floor = 1e-9 * diag[..., :1].clamp(min=1e-12)  # a covariate flat among the neighbours stays solvable
        # A prior of absolute precisions (empirical Bayes) adds to the ridge of no prior, so a window
        # that pools nothing (precision and centre 0) is solved as "none" is, and a slope collinear
        # with the intercept (every neighbour on one covariate value, the target on another) stays
        # solvable.
        if isinstance(prior, float):
            ridge = prior * diag[..., 1:] + floor
        else:
            ridge = self.drift_ridge * diag[..., 1:] + floor + prior
        ridge = torch.cat([torch.zeros_like(diag[..., :1]), ridge], -1)  # [B, Nt, 1 + P]
        f_star = torch.zeros(gram.shape[-1], device=gram.device)
        f_star[0] = 1.0  # [1, 0, ..., 0]: the target's own drift, relative to itself
        with torch.autocast(gram.device.type, enabled=False):
            lagrange = torch.linalg.solve(gram + torch.diag_embed(ridge), (f * a[..., None]).sum(-2) - f_star)
            w = a - (kf * lagrange[..., None, :]).sum(-1)  # [B, Nt, K]
            mean = torch.einsum("btk,btky->bty", w, parts["yg"])  # [B, Nt, Dy]
            if centre is not None and centre.dim() == 3:  # one per window [B, P, Dy]
                mean = mean - torch.einsum("btk,btkp,bpy->bty", w, f[..., 1:], centre.float())
            elif centre is not None:  # one per (packed) target [B, Nt, P, Dy]
                drift_w = torch.einsum("btk,btkp->btp", w, f[..., 1:])  # [B, Nt, P]
                mean = mean - (drift_w[..., None] * centre.float()).sum(-2)
        var = parts["c0"] - (w * parts["k_tn"]).sum(-1) - lagrange[..., 0]  # [B, Nt]
        if "gap" in parts:
            var = var - variance_gap(parts["gap"], w)
        return mean, var.clamp(min=1e-6).log()[..., None]

    def _slope_prior(self, parts: dict[str, torch.Tensor],
                     mask_t: torch.Tensor | None) -> tuple[float | torch.Tensor, torch.Tensor]:
        """The slopes' prior of this head's ``slope_prior`` (:func:`geonp.models.slope_prior.slope_prior`)."""
        return slope_prior(parts, mask_t, self.slope_prior)
