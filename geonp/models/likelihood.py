"""Likelihood heads: turn decoder outputs into a predictive distribution."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Normal
from torch.nn.functional import softplus


class GaussianHead(nn.Module):
    """Heteroscedastic Gaussian: ``raw [..., 2 * Dy] -> Normal(loc, scale)``.

    The first half of the last axis is the mean, the second half a pre-softplus
    scale. ``min_scale`` is a floor added to the scale so a model can never claim
    (and be rewarded for) near-zero uncertainty, which makes training unstable.
    Computed in float32 even under bf16 autocast so log-likelihoods stay exact.
    """

    def __init__(self, dim_y: int, min_scale: float = 1e-3) -> None:
        super().__init__()
        self.dim_y = dim_y
        self.min_scale = min_scale

    def forward(self, raw: torch.Tensor) -> Normal:
        raw = raw.float()
        loc, pre_scale = raw.split(self.dim_y, dim=-1)
        return Normal(loc, self.min_scale + softplus(pre_scale))
