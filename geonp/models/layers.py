"""Small building blocks shared by every model: MLPs and pre-norm residual blocks."""

from __future__ import annotations

from torch import nn


def mlp(dim_in: int, dim_hidden: int, dim_out: int, num_hidden: int = 2) -> nn.Sequential:
    """``num_hidden`` hidden layers of width ``dim_hidden`` with ReLU, linear output."""
    layers: list[nn.Module] = []
    width = dim_in
    for _ in range(num_hidden):
        layers += [nn.Linear(width, dim_hidden), nn.ReLU()]
        width = dim_hidden
    layers.append(nn.Linear(width, dim_out))
    return nn.Sequential(*layers)
