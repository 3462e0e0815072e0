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

    Attributes:
        xc: context inputs ``[B, Nc, Dx]`` (model units: grid offsets, or normalised inputs).
        yc: context values ``[B, Nc, Dy]`` (normalised).
        xt: target inputs ``[B, Nt, Dx]``.
        yt: target values ``[B, Nt, Dy]`` (what the model is scored against).
        mask_c: bool ``[B, Nc]``, True where a context point is present.
        mask_t: bool ``[B, Nt]``, True where a target point is present.
    """

    xc: torch.Tensor
    yc: torch.Tensor
    xt: torch.Tensor
    yt: torch.Tensor
    mask_c: torch.Tensor
    mask_t: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        """Return a copy with every tensor moved to ``device``.

        Args:
            device: a torch device or its name (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

        Returns:
            A new ``Batch``; ``self`` is unchanged.
        """
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def __len__(self) -> int:
        return self.xc.shape[0]

    def shifted(self, tau: torch.Tensor | float) -> Batch:
        """Translate every input location by ``tau`` (the test-time shift of equivariance checks).

        Args:
            tau: a scalar or a ``[Dx]`` tensor added to ``xc`` and ``xt``, in input units.

        Returns:
            A new ``Batch`` with shifted inputs and the same values and masks.
        """
        return Batch(self.xc + tau, self.yc, self.xt + tau, self.yt, self.mask_c, self.mask_t)

    def task(self, i: int) -> Batch:
        """Task ``i`` alone, with its padding removed.

        Args:
            i: index of the task in the batch, ``0 <= i < B``.

        Returns:
            A ``Batch`` with ``B = 1`` holding only task ``i``'s present points.
        """
        mc, mt = self.mask_c[i], self.mask_t[i]
        return Batch(
            self.xc[i, mc][None], self.yc[i, mc][None], self.xt[i, mt][None],
            self.yt[i, mt][None], mc[mc][None], mt[mt][None],
        )
