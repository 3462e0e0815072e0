"""Set-function baselines: ``cnp`` (DeepSet mean) and ``rcnp`` (simple relational CNP).

Both follow the TE-TNP paper's appendix F: encoders are MLPs with five hidden
layers of width ``dim_model``, aggregated by a (masked) mean over the context;
decoders are MLPs with two hidden layers into a heteroscedastic Gaussian.
The RCNP encodes each target through its *differences* to the context points,
which makes it translation equivariant; the CNP sees absolute locations.
"""

from __future__ import annotations

import torch
from torch.distributions import Normal

from geonp.models.base import NeuralProcess
from geonp.models.catalog import register
from geonp.models.layers import mlp
from geonp.models.likelihood import GaussianHead

_SIZES = {"small": {"dim_model": 64}, "tiny": {"dim_model": 32}}


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of ``values`` over axis ``dim`` counting only entries where ``mask`` is True.

    ``mask`` broadcasts against ``values`` without its trailing feature axis.
    """
    weights = mask.to(values.dtype).unsqueeze(-1)
    return (values * weights).sum(dim) / weights.sum(dim).clamp(min=1.0)


@register("cnp", presets=_SIZES)
class CNP(NeuralProcess):
    """Conditional NP: ``r = mean_c phi(x_c, y_c)``, decoder on ``[r, x_t]``."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 128, min_scale: float = 1e-3) -> None:
        super().__init__(dim_x, dim_y)
        self.encoder = mlp(dim_x + dim_y, dim_model, dim_model, num_hidden=5)
        self.decoder = mlp(dim_model + dim_x, dim_model, 2 * dim_y)
        self.head = GaussianHead(dim_y, min_scale)

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        r = masked_mean(self.encoder(torch.cat([xc, yc], -1)), mask_c, dim=1)  # [B, Dz]
        r = r[:, None, :].expand(-1, xt.shape[1], -1)  # [B, Nt, Dz]
        return self.head(self.decoder(torch.cat([r, xt], -1)))  # loc/scale [B, Nt, Dy]


@register("rcnp", presets=_SIZES)
class RCNP(NeuralProcess):
    """Simple relational CNP: ``e(x_t) = mean_c phi(x_t - x_c, y_c)``, decoder on ``e`` only.

    The pairwise encoder costs ``B * Nt * Nc * dim_model`` memory per layer;
    targets are processed in chunks of ``target_chunk`` to bound it.
    """

    translation_equivariant = True

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 128, target_chunk: int = 1024,
                 min_scale: float = 1e-3) -> None:
        super().__init__(dim_x, dim_y)
        self.encoder = mlp(dim_x + dim_y, dim_model, dim_model, num_hidden=5)
        self.decoder = mlp(dim_model, dim_model, 2 * dim_y)
        self.head = GaussianHead(dim_y, min_scale)
        self.target_chunk = target_chunk

    def _encode(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor) -> torch.Tensor:
        diff = xt[:, :, None, :] - xc[:, None, :, :]  # [B, nt, Nc, Dx]
        pairs = torch.cat([diff, yc[:, None].expand(-1, xt.shape[1], -1, -1)], -1)  # [B, nt, Nc, Dx + Dy]
        return masked_mean(self.encoder(pairs), mask_c[:, None, :], dim=2)  # [B, nt, Dz]

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        chunks = [self._encode(xc, yc, xt[:, s:s + self.target_chunk], mask_c)
                  for s in range(0, xt.shape[1], self.target_chunk)]
        e = torch.cat(chunks, dim=1) if chunks else xt.new_zeros(xt.shape[0], 0, self.decoder[0].in_features)
        return self.head(self.decoder(e))  # loc/scale [B, Nt, Dy]
