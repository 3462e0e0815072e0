"""A UNet over 1-D, 2-D or 3-D grids whose tasks each own a sub-grid of a padded batch.

Layout (Ronneberger et al. 2015; the TE-TNP paper's ConvCNP baseline, appendix F.1): a
pointwise lift to ``C`` channels, ``depth`` convolutions each followed by a stride-2 average
pool, one convolution at the bottom, then ``depth`` steps of linear up-sampling, concatenation
with the matching down-path output (``2C`` channels) and a convolution back to ``C``. With
``depth = 5`` that is the paper's 11 convolutional layers (plus the lift).

Every layer is followed by multiplication with each task's *valid-cell* mask, so the cells a
task does not own act exactly like the zero padding at the edge of its own grid: a task in a
padded batch is computed exactly as it would be alone. For the same reason up-sampling is a
fixed linear-interpolation kernel with zero extension (``F.interpolate`` would clamp at the
tensor edge, which is not the task's edge).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_UP = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class UNet(nn.Module):
    """``h [B, C_in, *G], valid [B, 1, *G] -> [B, C, *G]``.

    Args:
        dims: number of grid dimensions (1, 2 or 3): picks Conv1d/2d/3d.
        in_channels: channels of the input grid.
        channels: ``C``, width of every layer.
        depth: number of down-sampling steps; each grid dimension ``d`` with
            ``downsample[d]`` must have a size divisible by ``2**depth``.
        kernel_size: odd convolution size per dimension (an int applies to all).
        downsample: per dimension, whether pooling halves it (e.g. keep a short time axis).
    """

    def __init__(self, dims: int, in_channels: int, channels: int, depth: int, kernel_size: tuple[int, ...],
                 downsample: tuple[bool, ...]) -> None:
        super().__init__()
        if dims not in _CONV:
            raise ValueError(f"UNet grids have 1, 2 or 3 dimensions, got {dims}")
        if any(k % 2 == 0 or k < 1 for k in kernel_size):
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        conv = _CONV[dims]
        pad = tuple(k // 2 for k in kernel_size)
        self.dims, self.depth = dims, depth
        self.factor = tuple(2 if s else 1 for s in downsample)
        self.lift = conv(in_channels, channels, 1)
        self.down = nn.ModuleList(conv(channels, channels, kernel_size, padding=pad) for _ in range(depth))
        self.bottom = conv(channels, channels, kernel_size, padding=pad)
        self.up = nn.ModuleList(conv(2 * channels, channels, kernel_size, padding=pad) for _ in range(depth))

    def _pool(self, h: torch.Tensor) -> torch.Tensor:
        return _POOL[self.dims](h, self.factor, self.factor)

    def _upsample(self, h: torch.Tensor) -> torch.Tensor:
        """Linear interpolation by ``factor`` with zero extension: taps 1/4, 3/4, 3/4, 1/4."""
        kernel = h.new_ones(())
        for f in self.factor:
            taps = h.new_tensor([0.25, 0.75, 0.75, 0.25] if f == 2 else [1.0])
            kernel = kernel[..., None] * taps
        weight = kernel.expand(h.shape[1], 1, *kernel.shape).contiguous()  # depthwise [C, 1, *K]
        padding = tuple(1 if f == 2 else 0 for f in self.factor)
        return _UP[self.dims](h, weight, stride=self.factor, padding=padding, groups=h.shape[1])

    def forward(self, h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        masks = [valid]  # valid cells per level, [B, 1, *G_l]; pooled blocks are all-in or all-out
        for _ in range(self.depth):
            masks.append(self._pool(masks[-1]))
        h = F.relu(self.lift(h)) * valid  # [B, C, *G]
        skips = []
        for level, conv in enumerate(self.down):
            h = F.relu(conv(h)) * masks[level]
            skips.append(h)
            h = self._pool(h)  # [B, C, *G_{l+1}]
        h = F.relu(self.bottom(h)) * masks[self.depth]
        for i, conv in enumerate(self.up):
            level = self.depth - 1 - i
            h = self._upsample(h) * masks[level]  # [B, C, *G_l]
            h = F.relu(conv(torch.cat([h, skips[level]], 1))) * masks[level]
        return h
