"""The one container that carries a batch of context/target tasks between layers."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """A batch of ``B`` regression tasks, padded to common sizes.

    Shapes: ``xc [B, Nc, Dx]``, ``yc [B, Nc, Dy]``, ``xt [B, Nt, Dx]``,
    ``yt [B, Nt, Dy]``; ``mask_c [B, Nc]`` and ``mask_t [B, Nt]`` are bool,
    True where a point is present (False marks padding).
    """

    xc: torch.Tensor
    yc: torch.Tensor
    xt: torch.Tensor
    yt: torch.Tensor
    mask_c: torch.Tensor
    mask_t: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        """Return a copy with every tensor moved to ``device``."""
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def __len__(self) -> int:
        return self.xc.shape[0]

    def shifted(self, tau: torch.Tensor | float) -> Batch:
        """Translate every input location by ``tau`` (scalar or ``[Dx]``)."""
        return Batch(self.xc + tau, self.yc, self.xt + tau, self.yt, self.mask_c, self.mask_t)

    def task(self, i: int) -> Batch:
        """Task ``i`` alone, with its padding removed (``B = 1``)."""
        mc, mt = self.mask_c[i], self.mask_t[i]
        return Batch(
            self.xc[i, mc][None], self.yc[i, mc][None], self.xt[i, mt][None],
            self.yt[i, mt][None], mc[mc][None], mt[mt][None],
        )
