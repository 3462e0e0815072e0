"""Scores for probabilistic predictions (more arrive with the evaluation issue)."""

from __future__ import annotations

import torch
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
