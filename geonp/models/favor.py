"""FAVOR+ attention (Choromanski et al., ICLR 2021): softmax attention in linear time.

The softmax kernel ``exp(q . k / sqrt(Dh))`` is written as an expectation over
random directions ``w ~ N(0, I)`` of a product of positive features,

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(m),    x = q / Dh^(1/4) or k / Dh^(1/4),

with ``W [m, Dh]`` holding ``m`` orthogonal random directions (blocks of ``Dh``
orthonormal rows, each row rescaled to an independent chi(Dh)-distributed
length, so every row is still marginally Gaussian). Attention then becomes

    out_n = phi(q_n) . S / phi(q_n) . z,   S = sum_k phi(k) v_k^T [m, Dv],   z = sum_k phi(k) [m]

so keys are reduced once to the summary ``(S, z)`` and every query row is read
independently: time and memory are linear in ``Nk + Nq`` (no ``Nq x Nk`` matrix).
Padded keys (mask False) get zero features and contribute nothing.

Numerical stability: exponents are shifted before ``exp`` by constants that cancel
in the ratio. Per query row, the whole ``-|q|^2/2`` term and ``max_j (W q)_j``
cancel (both are per-row constants), so query features lie in ``(0, 1]``. For
keys one shift is shared by every key of a (task, head): the running maximum of
the exponent over present keys, kept online while keys arrive in blocks (the
accumulated summary is rescaled when the maximum grows). The ``1/sqrt(m)`` factor
cancels as well and is omitted. The features are computed in float32 with
autocast off, whatever the surrounding precision.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from geonp.models.attention import MultiHeadAttention

#: Default number of random features m. Performer's analysis asks for m = Theta(Dh log Dh):
#: 128 >= 32 ln 32 = 111 for the paper's head size 32 (4 orthogonal blocks). The output error
#: falls roughly as m^-1/2 (tests/test_tnpkr.py: 0.015 at m = 64, 0.011 at 128, 0.005 at 1024),
#: while cost grows linearly in m; 128 is 2x the authors' code's 64 for ~25% less error.
DEFAULT_NUM_FEATURES = 128


def orthogonal_gaussian_features(num_features: int, dim: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Block-orthogonal random directions ``W [num_features, dim]`` for FAVOR+.

    Rows come in blocks of ``dim`` mutually orthogonal directions (QR of a Gaussian
    matrix, signs fixed so the basis is Haar distributed); each row's length is
    redrawn as the norm of an independent ``N(0, I_dim)`` vector, so rows are
    marginally ``N(0, I)`` and the kernel estimate stays unbiased.
    """
    if num_features < 1 or dim < 1:
        raise ValueError(f"num_features and dim must be >= 1, got {num_features} and {dim}")
    blocks = []
    for _ in range(-(-num_features // dim)):
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # rows orthonormal
    directions = torch.cat(blocks)[:num_features]
    lengths = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (directions * lengths).float()


class KeySummary(NamedTuple):
    """Keys reduced for FAVOR+: ``values [B, H, m, Dv]``, ``norm [B, H, m]``, ``shift [B, H]``.

    ``values = sum_k exp(a_k - shift) v_k``, ``norm = sum_k exp(a_k - shift)`` over
    present keys, where ``a_k [m]`` is key ``k``'s feature exponent.
    """

    values: torch.Tensor
    norm: torch.Tensor
    shift: torch.Tensor


def _scaled(x: torch.Tensor) -> torch.Tensor:
    # q . k / sqrt(Dh) = (q / Dh^1/4) . (k / Dh^1/4)
    return x.float() * x.shape[-1] ** -0.25


def add_keys(summary: KeySummary | None, k: torch.Tensor, v: torch.Tensor, features: torch.Tensor,
             mask_k: torch.Tensor) -> KeySummary:
    """Fold a block of keys into ``summary`` (None starts a new one).

    ``k [B, H, n, Dh]``, ``v [B, H, n, Dv]``, ``features W [m, Dh]``, ``mask_k [B, n]``
    bool. Differentiable in ``k`` and ``v``; the shift is a detached constant.
    """
    with torch.autocast(k.device.type, enabled=False):
        k = _scaled(k)
        a = k @ features.float().T - 0.5 * k.square().sum(-1, keepdim=True)  # [B, H, n, m]
        a = a.masked_fill(~mask_k[:, None, :, None], float("-inf"))  # padded keys -> exp(-inf) = 0
        block_max = a.detach().amax(dim=(-2, -1))  # [B, H]; -inf where the block has no key
        shift = block_max if summary is None else torch.maximum(summary.shift, block_max)
        safe = torch.where(torch.isfinite(shift), shift, 0.0)
        e = torch.exp(a - safe[..., None, None])  # [B, H, n, m], in [0, 1]
        values = e.transpose(-2, -1) @ v.float()  # [B, H, m, Dv]
        norm = e.sum(-2)  # [B, H, m]
        if summary is not None:
            # Rescale what was summed under the old shift; nothing was summed while it was -inf.
            old = torch.where(torch.isfinite(summary.shift), summary.shift, safe)
            rescale = torch.exp(old - safe)  # [B, H], <= 1
            values = values + summary.values * rescale[..., None, None]
            norm = norm + summary.norm * rescale[..., None]
    return KeySummary(values, norm, shift)


def read_queries(q: torch.Tensor, features: torch.Tensor, summary: KeySummary) -> torch.Tensor:
    """Attention output for queries ``q [B, H, n, Dh]`` against summarised keys -> ``[B, H, n, Dv]``.

    Each query row is computed independently of every other row.
    """
    with torch.autocast(q.device.type, enabled=False):
        b = _scaled(q) @ features.float().T  # [B, H, n, m]
        phi = torch.exp(b - b.detach().amax(-1, keepdim=True))  # in (0, 1]; per-row constants cancel
        num = phi @ summary.values  # [B, H, n, Dv]
        den = (phi @ summary.norm[..., None]).clamp_min(torch.finfo(torch.float32).tiny)  # [B, H, n, 1]
        return (num / den).to(q.dtype)


def favor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, features: torch.Tensor,
                    mask_k: torch.Tensor | None = None, block_rows: int = 1 << 15) -> torch.Tensor:
    """FAVOR+ estimate of ``softmax(q k^T / sqrt(Dh)) v`` -> ``[B, H, Nq, Dv]``.

    ``q [B, H, Nq, Dh]``, ``k [B, H, Nk, Dh]``, ``v [B, H, Nk, Dv]``, ``features W [m, Dh]``,
    ``mask_k [B, Nk]`` bool (True = present; None = all). Keys and queries are processed
    ``block_rows`` at a time, so extra memory is ``O(block_rows * H * m)``.
    """
    if mask_k is None:
        mask_k = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
    summary = None
    for i in range(0, k.shape[2], block_rows):
        summary = add_keys(summary, k[:, :, i:i + block_rows], v[:, :, i:i + block_rows], features,
                           mask_k[:, i:i + block_rows])
    parts = [read_queries(q[:, :, i:i + block_rows], features, summary) for i in range(0, q.shape[2], block_rows)]
    return torch.cat(parts, dim=2)


class FavorAttention(MultiHeadAttention):
    """Multi-head attention with FAVOR+ in place of exact softmax, split in two phases.

    ``summarise`` folds blocks of key tokens into a :class:`KeySummary`; ``attend``
    maps any block of query tokens through it. The random directions ``features
    [m, Dh]`` are drawn once at construction (from torch's global generator) and
    kept as a buffer: evaluation is deterministic and a saved model reloads exactly.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, num_features: int = DEFAULT_NUM_FEATURES) -> None:
        super().__init__(dim, num_heads, head_dim)
        self.register_buffer("features", orthogonal_gaussian_features(num_features, head_dim))

    @property
    def num_features(self) -> int:
        return self.features.shape[0]

    def summarise(self, summary: KeySummary | None, zk: torch.Tensor, mask_k: torch.Tensor) -> KeySummary:
        """Fold key tokens ``zk [B, n, Dz]`` (mask ``[B, n]``) into ``summary``."""
        k, v = self.split_heads(self.to_k(zk)), self.split_heads(self.to_v(zk))  # [B, H, n, Dh]
        return add_keys(summary, k, v, self.features, mask_k)

    def attend(self, zq: torch.Tensor, summary: KeySummary) -> torch.Tensor:
        """Query tokens ``zq [B, n, Dz]`` -> attention output ``[B, n, Dz]``."""
        out = read_queries(self.split_heads(self.to_q(zq)), self.features, summary)  # [B, H, n, Dh]
        b, _, n, _ = out.shape
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1).to(zq.dtype))

    def forward(self, zq: torch.Tensor, zk: torch.Tensor, mask_k: torch.Tensor) -> torch.Tensor:
        # zq [B, Nq, Dz], zk [B, Nk, Dz], mask_k [B, Nk] bool -> [B, Nq, Dz]
        return self.attend(zq, self.summarise(None, zk, mask_k))
