"""Convolutional conditional neural process, ``convcnp`` (Gordon et al., ICLR 2020).

``data -> SetConv -> grid -> UNet -> SetConv -> MLP -> Gaussian``:

* encoder: an RBF SetConv puts the context onto a regular grid as a *density* channel
  ``sum_i w_i`` and normalised data channels ``sum_i w_i y_i / density`` (one per output, and
  one per covariate, below), with a learnable (log-parametrised) lengthscale per gridded
  dimension, initialised to ``lengthscale_init`` grid spacings;
* a UNet (:mod:`geonp.models.unet`, Conv1d/2d/3d by the number of gridded dimensions);
* decoder: an RBF SetConv with its own lengthscales reads the UNet output at each target
  (a weighted mean of the nearby cells), then a pointwise MLP into a heteroscedastic Gaussian.

Grid: ``points_per_unit`` cells per input unit along each gridded dimension, cells at integer
multiples of the spacing (origin 0). Each task gets its own grid covering its present context
and target points plus a margin (the RBF windows plus ``margin`` input units), sized so the
UNet's pooling divides it (:func:`geonp.models.setconv.task_grids`). The RBFs are truncated to
``rbf_cutoff`` lengthscales (error bound in :mod:`geonp.models.setconv`), so encoder and
decoder cost ``O(N * window)``, and points go through them in chunks (``target_chunk``,
``max_block_elems``) so their memory is bounded whatever ``Nt`` and the grid size (in training
autograd keeps each chunk's gathered cells for the backward pass). The window grows with the
learned lengthscales: ``prod_d (2 ceil(rbf_cutoff * ell_d) + 1)`` cells per point.

Inputs beyond the first ``grid_dims`` (e.g. elevation as the 4th input of an infill window)
are *covariates*: the encoder smooths the context's covariates onto the grid as extra data
channels, and each target's covariates are appended to its decoded features before the MLP.

Defaults are the TE-TNP paper's ConvCNP (appendix F.1): UNet of 5 down / 1 / 5 up layers with
``C = 128`` channels, kernel size 9, 64 points per unit, decoder MLP with two hidden layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Normal

from geonp.models.base import NeuralProcess
from geonp.models.catalog import register
from geonp.models.layers import mlp
from geonp.models.likelihood import GaussianHead
from geonp.models.setconv import (
    density_channels,
    grid_to_points,
    points_to_grid,
    rbf_taps,
    smooth_grid,
    task_grids,
    valid_cells,
    window_radius,
)
from geonp.models.unet import UNet

_SIZES = {
    "small": {"unet_channels": 32, "unet_depth": 3, "kernel_size": 5, "points_per_unit": 32.0, "dim_model": 64},
    "tiny": {"unet_channels": 16, "unet_depth": 2, "kernel_size": 5, "points_per_unit": 16.0, "dim_model": 32},
}


def _per_dim(value: float | Sequence, n: int, name: str, kind: type = float) -> tuple:
    """A scalar or a length-``n`` sequence (JSON gives lists) -> a length-``n`` tuple."""
    values = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else (value,) * n
    if len(values) != n:
        raise ValueError(f"{name} needs one value per gridded dimension ({n}), got {value!r}")
    return tuple(kind(v) for v in values)


@register("convcnp", presets=_SIZES)
class ConvCNP(NeuralProcess):
    """ConvCNP on a 1-D, 2-D or 3-D internal grid; see the module docstring.

    Args:
        dim_x, dim_y: input and output dimensions.
        grid_dims: leading inputs that are gridded (default ``min(dim_x, 3)``); the rest are
            covariates.
        points_per_unit: grid cells per input unit, one float or one per gridded dimension
            (e.g. ``(1, 8, 8)`` for (time, rows, cols)).
        unet_channels, unet_depth, kernel_size: UNet width, number of down-sampling steps,
            odd convolution size (int or one per gridded dimension).
        downsample: whether the UNet pools each gridded dimension (bool or one per dimension);
            a short time axis is cheaper unpooled.
        lengthscale_init: initial encoder/decoder RBF lengthscale in grid spacings.
        rbf_cutoff: RBF truncation radius in lengthscales.
        margin: extra grid beyond the RBF windows around the data, in input units.
        dim_model: width of the decoder MLP's two hidden layers.
        target_chunk: at most this many targets (and context points) go through a SetConv at
            once; fewer when ``B * chunk * window * channels`` would exceed ``max_block_elems``
            (the decoder gathers ``window = prod_d (2 radius_d + 1)`` cells of ``unet_channels``
            per target), which bounds SetConv memory at about ``4 * max_block_elems`` bytes.
        max_block_elems: the runtime memory knob above (a ``RUNTIME_KEYS`` name: changing it
            does not make a different model).
        min_scale: floor on the predictive standard deviation.

    Gridded data: :meth:`predict_gridded` skips the point-to-grid SetConv for data already on
    the model's grid (``supports_gridded``).
    """

    #: Not exactly equivariant to arbitrary shifts: the grid discretises space.
    translation_equivariant = False
    #: Exactly equivariant (to float rounding) for shifts by whole grid steps
    #: (``k / points_per_unit_d`` along gridded dimension ``d``, covariates unshifted): each
    #: task's grid is anchored at integer cells relative to its own data, so such a shift
    #: moves grid, windows and UNet pooling blocks together. Other shifts are approximate.
    grid_equivariant = True
    #: :meth:`predict_gridded` is available for data on the model's grid.
    supports_gridded = True
    #: Refuse tasks whose grid would exceed this many cells (e.g. a target far from the context).
    max_grid_cells = 2**26

    def __init__(self, dim_x: int, dim_y: int, grid_dims: int | None = None,
                 points_per_unit: float | Sequence[float] = 64.0, unet_channels: int = 128, unet_depth: int = 5,
                 kernel_size: int | Sequence[int] = 9, downsample: bool | Sequence[bool] = True,
                 lengthscale_init: float | Sequence[float] = 2.0, rbf_cutoff: float = 4.0, margin: float = 0.1,
                 dim_model: int = 128, target_chunk: int = 1024, max_block_elems: int = 2**25,
                 min_scale: float = 1e-3) -> None:
        super().__init__(dim_x, dim_y)
        grid_dims = min(dim_x, 3) if grid_dims is None else int(grid_dims)
        if not 1 <= grid_dims <= min(dim_x, 3):
            raise ValueError(f"grid_dims must be in [1, min(dim_x, 3)] = [1, {min(dim_x, 3)}], got {grid_dims}")
        if min(unet_channels, target_chunk, max_block_elems) < 1 or unet_depth < 0 or rbf_cutoff <= 0 or margin < 0:
            raise ValueError("unet_depth >= 0, unet_channels, target_chunk, max_block_elems >= 1, rbf_cutoff > 0 "
                             "and margin >= 0 are required")
        self.grid_dims = grid_dims
        self.num_covariates = dim_x - grid_dims
        self.points_per_unit = _per_dim(points_per_unit, grid_dims, "points_per_unit")
        if min(self.points_per_unit) <= 0:
            raise ValueError(f"points_per_unit must be positive, got {points_per_unit!r}")
        downsample = _per_dim(downsample, grid_dims, "downsample", bool)
        ell = torch.tensor(_per_dim(lengthscale_init, grid_dims, "lengthscale_init"))
        if (ell <= 0).any():
            raise ValueError(f"lengthscale_init must be positive, got {lengthscale_init!r}")
        self.log_ell_encoder = nn.Parameter(ell.log())  # [D], log grid spacings
        self.log_ell_decoder = nn.Parameter(ell.log().clone())
        self.rbf_cutoff = float(rbf_cutoff)
        self.margin_cells = [math.ceil(margin * p) for p in self.points_per_unit]
        self.multiple = [2**unet_depth if s else 1 for s in downsample]  # grid sizes the UNet pools exactly
        self.target_chunk, self.max_block_elems = int(target_chunk), int(max_block_elems)
        self.unet = UNet(grid_dims, 1 + dim_y + self.num_covariates, unet_channels, unet_depth,
                         _per_dim(kernel_size, grid_dims, "kernel_size", int), downsample)
        self.decoder = mlp(unet_channels + self.num_covariates, dim_model, 2 * dim_y)
        self.head = GaussianHead(dim_y, min_scale)

    @property
    def lengthscales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder and decoder RBF lengthscales in input units, ``[grid_dims]`` each."""
        ppu = self.log_ell_encoder.new_tensor(self.points_per_unit)
        return self.log_ell_encoder.exp() / ppu, self.log_ell_decoder.exp() / ppu

    def _geometry(self) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int], list[int]]:
        """Lengthscales (cells), window radii (cells) and grid margins (cells) for this call."""
        ell_e, ell_d = self.log_ell_encoder.exp(), self.log_ell_decoder.exp()
        rad_e, rad_d = window_radius(ell_e, self.rbf_cutoff), window_radius(ell_d, self.rbf_cutoff)
        margin = [max(a, b) + m for a, b, m in zip(rad_e, rad_d, self.margin_cells)]
        return ell_e, ell_d, rad_e, rad_d, margin

    def _check_size(self, shape: Sequence[int]) -> None:
        if math.prod(shape) > self.max_grid_cells:
            raise ValueError(f"ConvCNP grid {list(shape)} exceeds max_grid_cells={self.max_grid_cells}: "
                             "targets far from the context, or points_per_unit too high for this extent")

    def _decode(self, features: torch.Tensor, covariates: torch.Tensor) -> torch.Tensor:
        """``features [..., C]`` + ``covariates [..., Dcov]`` -> raw Gaussian parameters ``[..., 2 Dy]``."""
        return self.decoder(torch.cat([features, covariates], -1))

    def _chunk(self, batch: int, radius: list[int], channels: int) -> int:
        """Points per SetConv call: ``target_chunk``, or fewer to stay within ``max_block_elems``."""
        per_point = batch * math.prod(2 * r + 1 for r in radius) * channels
        return max(1, min(self.target_chunk, self.max_block_elems // per_point))

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        ppu = xc.new_tensor(self.points_per_unit)
        uc, ut = xc[..., :self.grid_dims] * ppu, xt[..., :self.grid_dims] * ppu  # grid units [B, N, D]
        cov_c, cov_t = xc[..., self.grid_dims:], xt[..., self.grid_dims:]  # [B, N, Dcov]
        ell_e, ell_d, rad_e, rad_d, margin = self._geometry()
        origin, size, shape = task_grids([(uc, mask_c), (ut, mask_t)], margin, self.multiple)  # [B, D] each
        self._check_size(shape)
        values = torch.cat([yc, cov_c], -1)  # [B, Nc, Dy + Dcov]
        grid = points_to_grid(uc, values, mask_c, origin, shape, ell_e, rad_e,
                              self._chunk(xc.shape[0], rad_e, 1 + values.shape[-1]))  # [B, 1 + Dy + Dcov, *G]
        h = self.unet(grid, valid_cells(size, shape))  # [B, C, *G]
        h = h.flatten(2).transpose(1, 2)  # [B, prod(G), C]
        n = self._chunk(xt.shape[0], rad_d, h.shape[-1])
        raw = [self._decode(grid_to_points(h, ut[:, s:s + n], mask_t[:, s:s + n], origin, shape, ell_d, rad_d),
                            cov_t[:, s:s + n]) for s in range(0, xt.shape[1], n)]  # [B, nt, 2 Dy] each
        raw = torch.cat(raw, 1) if raw else xt.new_zeros(xt.shape[0], 0, 2 * self.dim_y)
        return self.head(raw)  # loc/scale [B, Nt, Dy]

    def predict_gridded(self, y: torch.Tensor, mask: torch.Tensor, covariates: torch.Tensor | None = None) -> Normal:
        """Predict every cell of data already on the model's grid, without point SetConvs.

        Args:
            y: ``[B, *G, Dy]`` values on ``grid_dims`` axes whose spacing is the model's grid
                spacing ``1 / points_per_unit_d``; anything (NaN included) where unobserved.
            mask: ``[B, *G]`` bool, True where ``y`` is observed (the context).
            covariates: ``[B, *G, Dcov]`` per-cell covariates, required iff ``dim_x > grid_dims``.

        Returns ``Normal`` with ``loc``/``scale`` ``[B, *G, Dy]``.

        The encoder is a masked separable RBF convolution (``mask`` and ``y * mask``, same
        lengthscales and truncation as the SetConv) with a density channel, the decoder a
        separable grid convolution. It equals ``model(xc, yc, xt, mask_c)`` with ``xt`` the
        coordinates of all cells and ``xc``/``yc`` the observed cells, whenever the cell
        coordinates are integer multiples of the spacing (cell ``i`` at ``(o + i) / ppu``, any
        integer ``o``), up to float32 rounding: tested at ``atol = rtol = 1e-5``, measured at
        most 9e-6 absolute on outputs of magnitude ~10 (about 1e-6 relative). Cells at other
        offsets need the off-grid path.
        Cost: the UNet on the padded grid plus two separable convolutions; no per-point windows.
        """
        g = tuple(y.shape[1:-1])
        if y.ndim != self.grid_dims + 2 or y.shape[-1] != self.dim_y:
            raise ValueError(f"y must be [B, *G, Dy] with {self.grid_dims} grid axes and Dy={self.dim_y}, "
                             f"got {tuple(y.shape)}")
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(y.shape[:-1]):
            raise ValueError(f"mask must be a bool tensor of shape {tuple(y.shape[:-1])}")
        if self.num_covariates and (covariates is None or tuple(covariates.shape) != (*y.shape[:-1],
                                                                                      self.num_covariates)):
            raise ValueError(f"covariates [B, *G, {self.num_covariates}] are required (dim_x={self.dim_x}, "
                             f"grid_dims={self.grid_dims})")
        if not self.num_covariates:
            covariates = y.new_zeros(*y.shape[:-1], 0)
        if (~torch.isfinite(y).all(-1) & mask).any() or (~torch.isfinite(covariates).all(-1)).any():
            raise ValueError("y (at observed cells) or covariates contain NaN or inf")
        empty = (~mask.flatten(1).any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"empty context in task(s) {empty[:5]}: ConvCNP needs at least one observed cell")
        ell_e, ell_d, rad_e, rad_d, margin = self._geometry()
        shape = [-(-(n + 2 * m) // s) * s for n, m, s in zip(g, margin, self.multiple)]  # as task_grids
        self._check_size(shape)
        m = mask[..., None].to(y.dtype)
        values = torch.cat([m, torch.where(mask[..., None], y, 0.0) * m, covariates * m], -1)  # [B, *G, 1+Dy+Dcov]
        pad = []
        for n, lo, total in zip(reversed(g), reversed(margin), reversed(shape)):  # F.pad wants last axis first
            pad += [lo, total - n - lo]
        sums = smooth_grid(nn.functional.pad(values.movedim(-1, 1), pad), rbf_taps(ell_e, rad_e, False))
        h = self.unet(density_channels(sums), sums.new_ones(1, 1, *shape))  # [B, C, *Gpad]
        h = smooth_grid(h, rbf_taps(ell_d, rad_d, True))
        crop = (slice(None), slice(None), *(slice(lo, lo + n) for n, lo in zip(g, margin)))
        return self.head(self._decode(h[crop].movedim(1, -1), covariates))  # loc/scale [B, *G, Dy]
