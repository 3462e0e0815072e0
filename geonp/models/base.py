"""The one calling convention every geonp model follows, and its input checks.

``dist = model(xc, yc, xt, mask_c=None, mask_t=None)`` with

* ``xc [B, Nc, Dx]`` context inputs, ``yc [B, Nc, Dy]`` context outputs,
* ``xt [B, Nt, Dx]`` target inputs,
* ``mask_c [B, Nc]`` / ``mask_t [B, Nt]`` bool, True where a point is present,

returns a ``torch.distributions.Normal`` with ``loc``/``scale`` ``[B, Nt, Dy]``.
Padded entries (mask False) may hold anything, NaN included: they are zeroed
before the model sees them and never influence present points.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributions import Normal


class NeuralProcess(nn.Module):
    """Base class: validates inputs, then calls :meth:`predict`.

    Subclasses implement ``predict`` with the same signature, receiving clean
    tensors (masks filled in, padding zeroed). ``config`` records the keyword
    arguments the model was built with so :func:`geonp.models.save` can rebuild it.

    Args:
        dim_x: number of input dimensions ``Dx``, at least 1.
        dim_y: number of output dimensions ``Dy``, at least 1.
    """

    #: Whether a task needs at least one context point (True for every model here).
    needs_context: bool = True
    #: Whether predictions are unchanged when all inputs are shifted (tested).
    translation_equivariant: bool = False
    #: Whether the model has weights trained by gradient descent.
    trainable: bool = True
    #: Whether the model has a grid path (``predict_gridded``) for windows on a lattice (ConvCNP).
    supports_gridded: bool = False
    #: How many of the last inputs are per-cell covariates (what a field's history predicts there,
    #: :mod:`geonp.tasks.history`) rather than locations; infill computes them as the checkpoint's
    #: header names them.
    covariate_inputs: int = 0

    def __init__(self, dim_x: int, dim_y: int) -> None:
        super().__init__()
        if dim_x < 1 or dim_y < 1:
            raise ValueError(f"dim_x and dim_y must be >= 1, got dim_x={dim_x}, dim_y={dim_y}")
        self.dim_x = dim_x
        self.dim_y = dim_y
        self.config: dict[str, Any] = {}

    def forward(
        self,
        xc: torch.Tensor,
        yc: torch.Tensor,
        xt: torch.Tensor,
        mask_c: torch.Tensor | None = None,
        mask_t: torch.Tensor | None = None,
    ) -> Normal:
        """The predictive distribution at the targets, given the context: the calling convention.

        A padded batch gives the same predictions as its tasks one by one; padded entries may
        hold NaN.

        Args:
            xc: context inputs ``[B, Nc, Dx]``.
            yc: context values ``[B, Nc, Dy]``.
            xt: target inputs ``[B, Nt, Dx]``.
            mask_c: bool ``[B, Nc]``, True where a context point is present; None: all present.
            mask_t: bool ``[B, Nt]``, True where a target is present; None: all present.

        Returns:
            A ``torch.distributions.Normal`` with ``loc`` and ``scale`` ``[B, Nt, Dy]``.

        Raises:
            ValueError: shapes, dtypes or masks that do not fit (one line saying which).
        """
        xc, yc, xt, mask_c, mask_t = check_inputs(self, xc, yc, xt, mask_c, mask_t)
        return self.predict(xc, yc, xt, mask_c, mask_t)

    def for_prediction(self) -> NeuralProcess:
        """This model in eval mode, blocked for no-grad forwards of window-sized tasks on the
        device it is on (:meth:`blocked`). Runtime settings, not weights; the blocking fixes the
        summation order, so a resumed infill that calls this again (on the same kind of device)
        writes what an uninterrupted one would.

        Returns:
            the model itself.
        """
        return self.blocked(training=False).eval()

    def for_training(self) -> NeuralProcess:
        """This model in training mode, blocked for forwards with autograd on its device (:meth:`blocked`).

        Returns:
            the model itself.
        """
        return self.blocked(training=True).train()

    def blocked(self, training: bool) -> NeuralProcess:
        """Set how much of a task the attention and the kriging head form at once, by the device
        the model's weights are on. Attention: with autograd ``TRAIN_BLOCK_ELEMS`` on every device
        (:mod:`geonp.models.te_attention`); without it ``PREDICT_BLOCK_ELEMS`` on a CPU (sized for
        its caches) and ``GPU_PREDICT_BLOCK_ELEMS`` on a GPU. The kriging head's slices:
        :data:`geonp.models.local_kriging.CACHE_ELEMS` on a CPU, ``GPU_CACHE_ELEMS`` on a GPU, so
        that a window is a few launches rather than thousands. Blocking bounds memory; it never
        changes the result beyond the order of float sums. Move the model first, then call this
        (``geonp train`` keeps the sizes its model was built with).

        Args:
            training: blocks for forwards with autograd (True) or without (False).

        Returns:
            the model itself.
        """
        from geonp.models import local_kriging, te_attention

        weight = next(self.parameters(), None)
        gpu = weight is not None and weight.device.type == "cuda"
        attention = (te_attention.TRAIN_BLOCK_ELEMS if training else
                     te_attention.GPU_PREDICT_BLOCK_ELEMS if gpu else te_attention.PREDICT_BLOCK_ELEMS)
        te_attention.set_block_elems(self, attention)
        for module in self.modules():
            if isinstance(module, local_kriging.LocalKriging):
                module.cache_elems = local_kriging.GPU_CACHE_ELEMS if gpu else local_kriging.CACHE_ELEMS
        return self

    def predict(
        self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor, mask_t: torch.Tensor
    ) -> Normal:  # pragma: no cover - abstract
        """What each model implements: :meth:`forward` on validated inputs.

        Args:
            xc: context inputs ``[B, Nc, Dx]``, zero at padded entries.
            yc: context values ``[B, Nc, Dy]``, zero at padded entries.
            xt: target inputs ``[B, Nt, Dx]``, zero at padded entries.
            mask_c: bool ``[B, Nc]``, True where a context point is present.
            mask_t: bool ``[B, Nt]``, True where a target is present.

        Returns:
            A ``Normal`` with ``loc`` and ``scale`` ``[B, Nt, Dy]``.
        """
        raise NotImplementedError


def _check_mask(mask: torch.Tensor | None, name: str, like: torch.Tensor) -> torch.Tensor:
    b, n = like.shape[:2]
    if mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=like.device)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor (True = present), got {getattr(mask, 'dtype', type(mask))}")
    if tuple(mask.shape) != (b, n):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected [B, N] = {(b, n)}")
    return mask.to(like.device)


def check_inputs(
    model: NeuralProcess,
    xc: torch.Tensor,
    yc: torch.Tensor,
    xt: torch.Tensor,
    mask_c: torch.Tensor | None,
    mask_t: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a call in the geonp convention; return clean tensors.

    Raises ``ValueError`` naming the argument for: non-tensors, wrong rank,
    ``Dx``/``Dy`` other than the model's, batch or length mismatches, bad masks,
    NaN/inf at present points, and tasks with no context point when the model
    needs one.
    """
    name = type(model).__name__
    for arg, t in (("xc", xc), ("yc", yc), ("xt", xt)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 3:
            raise ValueError(f"{arg} must have shape [B, N, D], got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{arg} must be floating point, got {t.dtype}")
    if xc.shape[-1] != model.dim_x or xt.shape[-1] != model.dim_x:
        raise ValueError(
            f"input dimension mismatch: {name} was built with dim_x={model.dim_x}, "
            f"got xc[..., {xc.shape[-1]}] and xt[..., {xt.shape[-1]}]"
        )
    if yc.shape[-1] != model.dim_y:
        raise ValueError(
            f"output dimension mismatch: {name} was built with dim_y={model.dim_y}, got yc[..., {yc.shape[-1]}]"
        )
    if not (xc.shape[0] == yc.shape[0] == xt.shape[0]):
        raise ValueError(f"batch size mismatch: xc {xc.shape[0]}, yc {yc.shape[0]}, xt {xt.shape[0]}")
    if xc.shape[1] != yc.shape[1]:
        raise ValueError(f"context length mismatch: xc has {xc.shape[1]} points, yc has {yc.shape[1]}")
    mask_c = _check_mask(mask_c, "mask_c", xc)
    mask_t = _check_mask(mask_t, "mask_t", xt)
    for arg, t, m in (("xc", xc, mask_c), ("yc", yc, mask_c), ("xt", xt, mask_t)):
        bad = ~torch.isfinite(t).all(-1) & m
        if bad.any():
            b, n = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{arg} contains NaN or inf at a present point (task {b}, point {n})")
    if model.needs_context:
        empty = (~mask_c.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"empty context in task(s) {empty[:5]}: {name} needs at least one context point")
    # Zero the padding so NaN placeholders cannot leak through 0 * NaN.
    xc = torch.where(mask_c[..., None], xc, 0.0)
    yc = torch.where(mask_c[..., None], yc, 0.0)
    xt = torch.where(mask_t[..., None], xt, 0.0)
    return xc, yc, xt, mask_c, mask_t
