"""Standard multi-head attention blocks (pre-norm), with key padding masks.

Used by the non-equivariant transformers (``tnp``, ``pt-tnp``). Tokens carry
absolute input locations inside them; the TE counterparts live in
:mod:`geonp.models.te_attention`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention

from geonp.models.layers import mlp


class MultiHeadAttention(nn.Module):
    """Multi-head attention ``queries [B, Nq, Dz] <- keys [B, Nk, Dz]``."""

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        inner = num_heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def split_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, N, H * Dh] -> [B, H, N, Dh]``."""
        b, n, _ = z.shape
        return z.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, zq: torch.Tensor, zk: torch.Tensor, mask_k: torch.Tensor) -> torch.Tensor:
        # zq [B, Nq, Dz], zk [B, Nk, Dz], mask_k [B, Nk] bool -> [B, Nq, Dz]
        q, k, v = self.split_heads(self.to_q(zq)), self.split_heads(self.to_k(zk)), self.split_heads(self.to_v(zk))
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask_k[:, None, None, :])  # [B, H, Nq, Dh]
        b, _, nq, _ = out.shape
        return self.to_out(out.transpose(1, 2).reshape(b, nq, -1))


class AttentionBlock(nn.Module):
    """Pre-norm residual block: ``z + MHA(LN(z), LN(kv))`` then ``z + MLP(LN(z))``.

    Self-attention when called with ``kv = z``; cross-attention otherwise (the
    queries never attend to each other, which keeps targets conditionally
    independent given the context).
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, num_heads, head_dim)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = mlp(dim, dim, dim)

    def forward(self, z: torch.Tensor, kv: torch.Tensor, mask_kv: torch.Tensor) -> torch.Tensor:
        # z [B, Nq, Dz], kv [B, Nk, Dz], mask_kv [B, Nk] -> [B, Nq, Dz]
        z = z + self.attn(self.norm_q(z), self.norm_kv(kv), mask_kv)
        return z + self.ff(self.norm_ff(z))
