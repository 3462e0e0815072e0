"""The drift slopes' prior of the local kriging head (:mod:`geonp.models.local_kriging`), from the
targets' own estimates: a share of each slope's own precision, or empirical Bayes per window
(random-effects meta-analysis of the targets' generalised-least-squares slopes)."""

from __future__ import annotations

import torch

#: Smallest spread of the targets' drift slopes (empirical Bayes, in squared slope units: values and
#: covariates are standardised per window): a window whose slopes agree still leaves each target a
#: slope within about 0.03 of the window's.
TAU2_FLOOR = 1e-3
#: A target's covariate varies among its neighbours when its slope's precision (given the intercept
#: and the other slopes: one over its entry of ``(F^T K^-1 F)^-1``) is above this share of the
#: intercept's entry of ``F^T K^-1 F`` (covariates standardised per window): below it the target
#: estimates no slope and takes no part in the prior.
SLOPE_INFORMATIVE = 1e-6
#: ... and when that precision keeps at least this share of its raw entry: a target whose neighbours
#: all share one covariate value (its own differs) has a large raw entry and no information on the
#: slope; what the float32 system leaves of it then is rounding.
SLOPE_IDENTIFIED = 1e-4


def slope_prior(parts: dict[str, torch.Tensor], mask_t: torch.Tensor | None,
                kind: str | float) -> tuple[float | torch.Tensor, torch.Tensor]:
    """The slopes' prior, ``(precision, centre [B, P, Dy])``, from the targets' own estimates.

    Each target's generalised-least-squares slopes ``b_j`` (its neighbours and its covariance)
    have sampling variances ``v_j``. Only targets that can estimate a slope take part: real
    ones (``mask_t [B, Nt]``, None: all) whose covariate varies among their neighbours (a flat
    covariate, e.g. where a history map holds the field's mean, says nothing about the slope,
    and nor does one on which all the neighbours share a value the target's own differs from:
    the slope is then collinear with the intercept). Such targets still receive the prior.
    The centre is their precision-weighted mean, on the same footing as each ``b_j`` (a
    window-wide ordinary least squares ignores the spatial covariance and is biased against
    them on a smooth field). The precision is a share of each slope's own (``kind`` a
    number) or, ``"empirical"``, ``1 / tau^2`` per window and covariate ``[B, 1, P]``, ``tau^2``
    the targets' spread about the centre beyond their sampling noise (DerSimonian-Laird: the
    precision-weighted moments of random-effects meta-analysis): a window whose targets all see
    the same relation to the covariate borrows it, one where the relation changes from place to
    place (moving fronts) keeps each target's own. Fewer than two such targets: no prior, and
    the window is solved as with ``"none"`` (centre 0).
    """
    # Hyperparameters estimated from the data, not paths for gradients; float64, whatever autocast does.
    with torch.no_grad(), torch.autocast(parts["gram"].device.type, enabled=False):
        gram = parts["gram"].double()  # [B, Nt, 1 + P, 1 + P]
        diag = gram.diagonal(dim1=-2, dim2=-1)  # [B, Nt, 1 + P]
        floor = 1e-9 * diag[..., :1].clamp(min=1e-300)  # as the head's solution's: a flat covariate's slope is 0
        cov = torch.linalg.inv(gram + torch.diag_embed(torch.cat([torch.zeros_like(floor), floor.expand_as(
            diag[..., 1:])], -1)))  # [B, Nt, 1 + P, 1 + P]: the GLS estimates' covariance
        beta = cov @ (parts["kf"].double().transpose(-1, -2) @ parts["yg"].double())  # [B, Nt, 1 + P, Dy]
        slopes, noise = beta[..., 1:, :], cov.diagonal(dim1=-2, dim2=-1)[..., 1:]  # [B, Nt, P, Dy], [B, Nt, P]
        # A slope's own precision given the intercept and the other slopes (1 / noise), not its
        # raw entry of F^T K^-1 F: a target whose neighbours all share one covariate value has a
        # large raw entry when its own value differs, and no information on the slope at all.
        # The raw entry bounds it too: the float32 system's rounding must not pass for information.
        # (Rounding can even leave it negative: no information either.)
        own = torch.where(noise > 0, 1.0 / noise.clamp(min=1e-300), 0.0)  # [B, Nt, P]
        informative = (own > SLOPE_INFORMATIVE * diag[..., :1]) & (own > SLOPE_IDENTIFIED * diag[..., 1:])
        real = informative if mask_t is None else informative & mask_t[..., None]  # [B, Nt, P]
        w = torch.where(real, own, 0.0)  # [B, Nt, P]: precisions, 0 for targets taking no part
        slopes = torch.where(real[..., None], slopes, 0.0)  # theirs may be anything, NaN included
        s1 = w.sum(1)  # [B, P]
        centre = (w[..., None] * slopes).sum(1) / s1.clamp(min=1e-300)[..., None]  # [B, P, Dy]
        if kind != "empirical":
            return float(kind), centre.to(parts["yg"].dtype)
        q = (w * (slopes - centre[:, None]).square().mean(-1)).sum(1)  # [B, P]: Cochran's Q
        k = real.sum(1).double()  # [B, P]: targets taking part
        tau2 = (q - (k - 1)) / (s1 - w.square().sum(1) / s1.clamp(min=1e-300)).clamp(min=1e-300)
        precision = torch.where(k >= 2, 1.0 / tau2.clamp(min=TAU2_FLOOR), 0.0)  # [B, P]
        centre = torch.where((k >= 2)[..., None], centre, 0.0)  # no prior: as "none", towards 0
        return precision[:, None, :].to(parts["gram"].dtype), centre.to(parts["yg"].dtype)
