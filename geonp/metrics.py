"""Scores for probabilistic predictions: per-task log-likelihood for training, and the
point-wise skill scores of gap-filling evaluations (RMSE, MAE, NLL, CRPS, coverage, interval score).

CRPS and the interval score come from ``scoringrules`` (closed form for a Gaussian predictive).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import norm
from torch.distributions import Normal


def task_log_likelihood(dist: Normal, yt: torch.Tensor, mask_t: torch.Tensor) -> torch.Tensor:
    """Mean log-likelihood per present target point, one value per task.

    ``dist`` loc/scale ``[B, Nt, Dy]``, ``yt [B, Nt, Dy]``, ``mask_t [B, Nt]`` -> ``[B]``
    (nats per target point, output dimensions summed). Padded targets count as nothing.
    """
    log_p = dist.log_prob(torch.where(mask_t[..., None], yt, dist.loc.detach())).sum(-1)  # [B, Nt]
    log_p = log_p * mask_t
    return log_p.sum(-1) / mask_t.sum(-1).clamp(min=1)


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of the mean of a 1-D tensor of per-task scores."""
    values = values.double()
    n = values.numel()
    stderr = values.std(unbiased=True).item() / n**0.5 if n > 1 else float("nan")
    return values.mean().item(), stderr


@torch.no_grad()
def task_scores(model, batches: list, device: torch.device | str = "cpu", shift: float = 0.0) -> torch.Tensor:
    """Per-task mean log-likelihood of ``model`` on fixed ``batches`` (``geonp.data.Batch``).

    ``shift`` translates every input location first (the TE-TNP paper's test-time
    Δ). Runs in evaluation mode and float32; returns ``[num_tasks]`` on the CPU.
    """
    was_training = getattr(model, "training", False)
    model.eval()
    scores = []
    for batch in batches:
        b = batch.shifted(shift).to(device) if shift else batch.to(device)
        dist = model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t)
        scores.append(task_log_likelihood(dist, b.yt, b.mask_t).cpu())
    model.train(was_training)
    return torch.cat(scores)


def gaussian_skill(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
    """Skill of Gaussian predictions ``N(mean, std^2)`` at held-out truths ``y`` (same shapes).

    NaN in any of the three drops that point. Returns, in ``y``'s units unless stated:
    ``n`` points, ``rmse``, ``mae``, ``nll`` (nats per point), ``crps`` (closed form),
    ``coverage_90``/``coverage_95`` (fraction of ``y`` inside the central 90%/95% interval),
    ``interval_score_90`` (Gneiting & Raftery 2007, alpha = 0.1; width plus penalties).
    """
    import scoringrules as sr

    y, mean, std = (np.asarray(a, dtype=np.float64).ravel() for a in (y, mean, std))
    keep = np.isfinite(y) & np.isfinite(mean) & np.isfinite(std) & (std > 0)
    y, mean, std = y[keep], mean[keep], std[keep]
    if y.size == 0:
        raise ValueError("no point with a finite truth, mean and standard deviation to score")
    err = mean - y
    scores = {
        "n": int(y.size),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "mae": float(np.mean(np.abs(err))),
        "nll": float(np.mean(0.5 * np.log(2 * math.pi * std**2) + 0.5 * (err / std) ** 2)),
        "crps": float(np.mean(sr.crps_normal(y, mean, std))),
    }
    for level in (0.90, 0.95):
        half = norm.ppf(0.5 + level / 2) * std
        scores[f"coverage_{round(level * 100)}"] = float(np.mean(np.abs(err) <= half))
    half = norm.ppf(0.95) * std
    scores["interval_score_90"] = float(np.mean(sr.interval_score(y, mean - half, mean + half, 0.1)))
    return scores
