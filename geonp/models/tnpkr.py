"""TNP-KR (Jenson et al. 2024): transformer neural processes built from kernel-regression blocks.

A KR block is a pre-norm transformer block in which the queries are all tokens,
``[targets; context]``, and the keys/values are the context tokens only:

    z = z + Attn(LN(z) <- LN(z_context)),   z = z + FFN(LN(z)),   z = [z_target; z_context]

so context tokens do self-attention, targets do cross-attention to the context,
and no token ever attends to a target: targets never influence each other or the
context. This is TNP-D's masked attention without computing the masked-out
entries: ``O(Nc^2 + Nc Nt)`` per layer instead of ``O((Nc + Nt)^2)``. Attention
is read as Nadaraya-Watson kernel regression with a softmax kernel on token
embeddings, hence the name.

* ``tnp-kr`` computes each layer's attention exactly, in one fused
  ``scaled_dot_product_attention`` call with the context key-padding mask.
* ``tnp-kr-fast`` uses FAVOR+ (:mod:`geonp.models.favor`) inside the same block:
  linear in ``Nc + Nt`` in time and memory. Keys are reduced block by block to a
  fixed-size summary, then query rows (and the embedding, FFN and decoder MLPs)
  run ``max_block_elems``-bounded blocks at a time: one forward with 10^6 context
  and 10^6 target points (Dx = 2, class defaults, one CPU thread) took 137 s at
  2.1 GiB peak RSS.

Tokens: context ``[x, y, 1]``, targets ``[x, 0, 0]`` through an embedding MLP,
as in ``tnp``. The paper's code concatenates a learned 2-vector embedding of the
observed/unobserved flag instead; a learned embedding of a binary flag fed to a
linear layer is an affine function of a 0/1 scalar, so the two are the same model
class. Target tokens after the last block go through a final LayerNorm, a
decoder MLP and a heteroscedastic :class:`GaussianHead`.

Sizes: the paper text gives none; class defaults follow the authors' public
reference configuration (dl4bi): token size 64, 6 KR blocks, 4 heads with 128-wide query/key/value
projections (head size 32), GELU MLPs (embedding 256-128-64, FFN 256, decoder
256-64). Presets ``small`` and ``tiny`` use the ``tnp`` sizes with MLP width
twice the token size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Normal

from geonp.models.attention import MultiHeadAttention
from geonp.models.base import NeuralProcess
from geonp.models.catalog import register
from geonp.models.favor import DEFAULT_NUM_FEATURES, FavorAttention, KeySummary
from geonp.models.likelihood import GaussianHead
from geonp.models.tnp import _SIZES

#: Default cap on the elements of one block of per-row work in ``tnp-kr-fast``
#: (2**24 floats = 64 MiB): the ``[B, H, rows, m]`` random features or ``[B, rows, hidden]``
#: MLP activations of one row block.
DEFAULT_BLOCK_ELEMS = 2**24

_PRESETS = {p: {**s, "dim_hidden": 2 * s["dim_model"]} for p, s in _SIZES.items()}


def _gelu_mlp(*widths: int) -> nn.Sequential:
    """Linear layers through ``widths`` with GELU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.GELU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


class KRBlock(nn.Module):
    """Kernel-regression block with exact softmax attention.

    ``forward(zt [B, Nt, Dz], zc [B, Nc, Dz], mask_c [B, Nc]) -> (zt, zc)`` updated.
    One LayerNorm serves queries and keys (context tokens are both).
    """

    def __init__(self, dim: int, dim_hidden: int, attn: MultiHeadAttention) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(dim)
        self.attn = attn
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = _gelu_mlp(dim, dim_hidden, dim)

    def forward(self, zt: torch.Tensor, zc: torch.Tensor, mask_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nt = zt.shape[1]
        z = torch.cat([zt, zc], dim=1)  # queries [B, Nt + Nc, Dz]
        zn = self.norm_attn(z)
        z = z + self.attn(zn, zn[:, nt:], mask_c)  # one fused SDPA call; keys = context only
        z = z + self.ff(self.norm_ff(z))
        return z[:, :nt], z[:, nt:]


class FastKRBlock(KRBlock):
    """Kernel-regression block with FAVOR+ attention, run ``rows`` token rows at a time.

    Context tokens are folded into a key summary block by block; then every
    target and context row is updated independently (attention read-out, FFN).
    """

    attn: FavorAttention

    def _update(self, z: torch.Tensor, summary: KeySummary, rows: int) -> torch.Tensor:
        # z [B, N, Dz] -> [B, N, Dz], each row independently
        parts = []
        for i in range(0, max(z.shape[1], 1), rows):
            h = z[:, i:i + rows]
            h = h + self.attn.attend(self.norm_attn(h), summary)
            parts.append(h + self.ff(self.norm_ff(h)))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def forward(self, zt: torch.Tensor, zc: torch.Tensor, mask_c: torch.Tensor,
                rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        rows = rows or max(zt.shape[1], zc.shape[1], 1)
        summary = None
        for i in range(0, zc.shape[1], rows):
            summary = self.attn.summarise(summary, self.norm_attn(zc[:, i:i + rows]), mask_c[:, i:i + rows])
        return self._update(zt, summary, rows), self._update(zc, summary, rows)


class _KernelRegressionNP(NeuralProcess):
    """Shared parts: token embedding, a stack of KR blocks, final norm, decoder, likelihood."""

    def __init__(self, dim_x: int, dim_y: int, dim_model: int, dim_hidden: int, blocks: list[KRBlock],
                 min_scale: float) -> None:
        super().__init__(dim_x, dim_y)
        self.embed = _gelu_mlp(dim_x + dim_y + 1, dim_hidden, max(dim_hidden // 2, dim_model), dim_model)
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim_model)
        self.decoder = _gelu_mlp(dim_model, dim_hidden, dim_model, 2 * dim_y)
        self.head = GaussianHead(dim_y, min_scale)

    def _tokens(self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedding inputs: context ``[x, y, 1]`` ``[B, Nc, Dx + Dy + 1]``, target ``[x, 0, 0]``."""
        ctx = torch.cat([xc, yc, torch.ones_like(yc[..., :1])], -1)
        tgt = torch.cat([xt, xt.new_zeros(*xt.shape[:2], self.dim_y + 1)], -1)
        return ctx, tgt


@register("tnp-kr", presets=_PRESETS)
class TNPKR(_KernelRegressionNP):
    """TNP-KR with exact attention: ``num_layers`` KR blocks, cost ``O(Nc^2 + Nc Nt)`` per layer.

    Args:
        dim_x, dim_y: input and output dimensions.
        dim_model: token size ``Dz``.
        num_heads, head_dim: attention heads and their size.
        num_layers: number of KR blocks.
        dim_hidden: width of the embedding, FFN and decoder MLPs.
        min_scale: floor on the predictive standard deviation.
    """

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 64, num_heads: int = 4, head_dim: int = 32,
                 num_layers: int = 6, dim_hidden: int = 256, min_scale: float = 1e-3) -> None:
        blocks = [KRBlock(dim_model, dim_hidden, MultiHeadAttention(dim_model, num_heads, head_dim))
                  for _ in range(num_layers)]
        super().__init__(dim_x, dim_y, dim_model, dim_hidden, blocks, min_scale)

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        ctx, tgt = self._tokens(xc, yc, xt)
        zc, zt = self.embed(ctx), self.embed(tgt)  # [B, Nc, Dz], [B, Nt, Dz]
        for block in self.blocks:
            zt, zc = block(zt, zc, mask_c)
        return self.head(self.decoder(self.norm(zt)))  # loc/scale [B, Nt, Dy]


@register("tnp-kr-fast", presets=_PRESETS)
class FastTNPKR(_KernelRegressionNP):
    """TNP-KR with FAVOR+ attention: time and memory linear in ``Nc + Nt``.

    Args (besides :class:`TNPKR`'s):
        num_features: FAVOR+ random features ``m`` per layer (default 128, see
            :data:`geonp.models.favor.DEFAULT_NUM_FEATURES`), drawn once at build
            time from torch's global generator and stored in the state dict, so
            evaluation is deterministic and save/load exact.
        max_block_elems: runtime memory knob (not part of the model): the most
            elements of one row block of per-row work, ``B * rows * max(H * m, dim_hidden)``.
            May be reassigned on a built model.
    """

    def __init__(self, dim_x: int, dim_y: int, dim_model: int = 64, num_heads: int = 4, head_dim: int = 32,
                 num_layers: int = 6, dim_hidden: int = 256, num_features: int = DEFAULT_NUM_FEATURES,
                 max_block_elems: int = DEFAULT_BLOCK_ELEMS, min_scale: float = 1e-3) -> None:
        blocks = [FastKRBlock(dim_model, dim_hidden, FavorAttention(dim_model, num_heads, head_dim, num_features))
                  for _ in range(num_layers)]
        super().__init__(dim_x, dim_y, dim_model, dim_hidden, blocks, min_scale)
        self.max_block_elems = max_block_elems
        self.per_row = max(num_heads * num_features, dim_hidden)

    def block_rows(self, batch: int) -> int:
        """Token rows per block so that one block holds at most ``max_block_elems`` elements."""
        return max(1, self.max_block_elems // (batch * self.per_row))

    @staticmethod
    def _rowwise(fn, v: torch.Tensor, rows: int) -> torch.Tensor:
        """Row-wise ``fn`` on ``v [B, N, D]``, ``rows`` rows at a time."""
        if v.shape[1] <= rows:
            return fn(v)
        return torch.cat([fn(v[:, i:i + rows]) for i in range(0, v.shape[1], rows)], dim=1)

    def predict(self, xc, yc, xt, mask_c, mask_t) -> Normal:
        rows = self.block_rows(xc.shape[0])
        ctx, tgt = self._tokens(xc, yc, xt)
        zc, zt = self._rowwise(self.embed, ctx, rows), self._rowwise(self.embed, tgt, rows)  # [B, N, Dz]
        del ctx, tgt
        for block in self.blocks:
            zt, zc = block(zt, zc, mask_c, rows)
        raw = self._rowwise(lambda z: self.decoder(self.norm(z)), zt, rows)  # [B, Nt, 2 Dy]
        return self.head(raw)  # loc/scale [B, Nt, Dy]
