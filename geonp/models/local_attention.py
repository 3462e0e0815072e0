"""Local TE attention: every query attends to its ``k`` nearest context points at full resolution.

A pseudo-token model summarises the whole context in ``M`` tokens (32 for hundreds of cells in
an infill window), so a target learns its nearest observations only through that summary.
Measured on MODIS LST (issue #13): the bundled te-pt-tnp was *least* accurate next to
observations (RMSE 1.44 K at one cell from an observed cell, kriging 0.96 K). This module gives
every query a direct path to its ``k`` nearest context points, so it can weigh them like a
learned, data-adaptive kriging, at a cost of ``O(k (Nc + Nt))`` per layer.

Neighbours are chosen by a weighted Euclidean distance between input locations,
``d^2 = sum_i (w_i (x_i - x'_i))^2`` with fixed per-dimension weights ``w`` (e.g. time counted
as 2 cells, elevation ignored). Distances depend only on differences, so shifting every input
leaves the choice unchanged and the model stays translation equivariant. Ties (equal distances
on a lattice) are broken by the order of the context, which is deterministic.

The attention logits are those of :class:`~geonp.models.te_attention.TEAttention` (kernel MLP
on per-head q.k and x_q - x_k, plus the distance prior), evaluated on the gathered pairs only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from geonp.models import cpu_build
from geonp.models.layers import mlp
from geonp.models.te_attention import DEFAULT_BLOCK_ELEMS, TEAttention

#: Elements of one query chunk's distance matrix in the neighbour search.
_SEARCH_ELEMS = 2**24


@torch.no_grad()
def nearest_neighbours(xq: torch.Tensor, xk: torch.Tensor, mask_k: torch.Tensor, k: int,
                       weights: torch.Tensor | None = None, quadrant_dims: tuple[int, int] | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of each query's ``k`` nearest present keys, overall or per quadrant.

    Args:
        xq: ``[B, Nq, Dx]`` query locations.
        xk: ``[B, Nk, Dx]`` key locations.
        mask_k: ``[B, Nk]`` bool, True where a key is present.
        k: neighbours per query; fewer when a task has fewer present keys.
        weights: ``[Dx]`` per-dimension distance weights (0 ignores a dimension), or None for 1.
        quadrant_dims: two input dimensions (e.g. rows and columns) that split the plane around
            each query into four quadrants; the query then takes its ``k // 4`` nearest keys in
            each (the quadrant search of geostatistics). Inside a wide gap the ``k`` nearest keys
            all lie on the near rim; a quadrant search also reaches the far side, so kriging
            interpolates across the gap instead of extrapolating from one edge.

    Returns:
        ``(index [B, Nq, K], valid [B, Nq, K])`` with ``K = min(k, Nk)`` (``4 * min(k // 4, Nk)``
        by quadrant), nearest first (within each quadrant, quadrant by quadrant); ``valid`` is
        False where a task (or quadrant) has fewer present keys, and the index there is any key's
        (0 from the CPU kernel, an absent key's from PyTorch's search): callers mask with ``valid``.
    """
    b, nq, _ = xq.shape
    nk = xk.shape[1]
    if quadrant_dims is not None and k < 4:
        raise ValueError(f"a quadrant search needs k >= 4 neighbours, got {k}")
    kk = min(k // 4 if quadrant_dims is not None else k, nk)
    if weights is not None:
        xq, xk = xq * weights, xk * weights
    kernel = cpu_build.kernel("neighbours") if _kernel_takes(xq, xk, mask_k) else None
    if kernel is not None:  # one pass over the keys per query, no distance matrix (kernels/neighbours_cpu.cpp)
        du, dv = (-1, -1) if quadrant_dims is None else (d % xq.shape[-1] for d in quadrant_dims)
        index, dist = kernel.nearest(xq.contiguous(), xk.contiguous(), mask_k.contiguous(), kk, du, dv)
        return index, torch.isfinite(dist)
    return _nearest_torch(xq, xk, mask_k, kk, quadrant_dims)


def _kernel_takes(xq: torch.Tensor, xk: torch.Tensor, mask_k: torch.Tensor) -> bool:
    """Whether the search kernel can run on these inputs: float32 locations on the CPU, one batch
    size for all three (elsewhere the PyTorch search, which broadcasts, and which a GPU runs on
    the whole distance matrix at once)."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (xq, xk))
            and xq.shape[0] == xk.shape[0] == mask_k.shape[0] and xk.shape[1] == mask_k.shape[1])


def _nearest_torch(xq: torch.Tensor, xk: torch.Tensor, mask_k: torch.Tensor, kk: int,
                   quadrant_dims: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nearest_neighbours` in PyTorch on weighted locations, ``kk`` per query (or per
    quadrant): the distance matrix a chunk of queries at a time, then :func:`smallest`."""
    b, nq, _ = xq.shape
    nk = xk.shape[1]
    rows = max(1, _SEARCH_ELEMS // max(1, b * nk))
    index, dist = [], []
    for s in range(0, nq, rows):
        diff = xk[:, None, :, :] - xq[:, s:s + rows, None, :]  # [B, q, Nk, Dx]
        d2 = diff.float().square().sum(-1)  # [B, q, Nk]
        d2 = d2.masked_fill(~mask_k[:, None, :], float("inf"))
        if quadrant_dims is None:
            val, idx = smallest(d2, kk)
        else:
            picks = [smallest(d2.masked_fill(~inside, float("inf")), kk)
                     for inside in _quadrants(diff[..., quadrant_dims[0]], diff[..., quadrant_dims[1]])]
            val, idx = torch.cat([p[0] for p in picks], -1), torch.cat([p[1] for p in picks], -1)
        index.append(idx)
        dist.append(val)
    return torch.cat(index, 1), torch.isfinite(torch.cat(dist, 1))


def smallest(d2: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest of ``d2 [..., N]`` along its last axis, nearest first, equal distances
    in index order: ``(values [..., k], indices [..., k])``, ``k <= N``.

    ``topk`` breaks ties its own way on each device, and on a grid many keys lie at exactly the
    same distance: the CPU and a GPU then kept different neighbours at the k-th place and filled
    the same cube 1e-2 apart. Here the keys kept and their order follow (distance, index), so
    every device keeps the same keys in the same order. The 2k nearest are ranked so; a row whose
    k-th distance is shared beyond them (rare: a grid ring holds few keys) is ranked in full.
    """
    n = d2.shape[-1]
    m = min(2 * k, n)
    val, idx = _by_distance_then_index(*d2.topk(m, dim=-1, largest=False, sorted=True))
    if 0 < m < n:
        kth = val[..., k - 1]
        unsure = (val[..., m - 1] == kth) & torch.isfinite(kth)  # absent keys (inf) are masked anyway
        if unsure.any():
            rows, edge = d2[unsure], kth[unsure, None]  # [R, N], [R, 1]
            below, at = rows < edge, rows == edge
            take = below | at & (at.cumsum(-1) <= k - below.sum(-1, keepdim=True))
            pick = take.nonzero()[:, 1].view(-1, k)  # exactly k per row, in index order
            head_val, head_idx = _by_distance_then_index(rows.gather(-1, pick), pick)
            val, idx = val[..., :k].clone(), idx[..., :k].clone()
            val[unsure], idx[unsure] = head_val, head_idx
    return val[..., :k], idx[..., :k]


def _by_distance_then_index(val: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(val, idx) [..., K]`` reordered by distance, equal distances by index."""
    idx, order = idx.sort(dim=-1)
    val, order = val.gather(-1, order).sort(dim=-1, stable=True)
    return val, idx.gather(-1, order)


def _quadrants(du: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Four half-open quadrants of the offsets ``(du, dv)``, angles [0, 90), [90, 180), ... degrees
    measured from the ``dv`` axis; every offset falls in exactly one (zero offset: the first)."""
    return ((dv > 0) & (du >= 0) | (dv == 0) & (du == 0), (dv <= 0) & (du > 0),
            (dv < 0) & (du <= 0), (dv >= 0) & (du < 0))


def gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t [B, N, ...]`` at non-negative ``index [B, Q, K]`` (or ``[1, Q, K]``, broadcast) ->
    ``[B, Q, K, ...]``.

    On the CPU one ``index_select`` on the flattened rows: advanced indexing ``t[batch, index]``
    gives the same values, but took four times as long for the few-column tensors of the kriging
    head (locations, values, drift; 1.9 against 0.4 ms for 4 x 1024 x 64 rows of 3 on 2 threads).
    On a GPU advanced indexing stays: its backward sums without atomics, so training there stays
    reproducible."""
    batch = torch.arange(t.shape[0], device=t.device)[:, None, None]
    if t.device.type != "cpu":
        return t[batch, index]
    flat = index + batch * t.shape[1]  # [B, Q, K]: rows of t's B x N rows
    rows = t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]).index_select(0, flat.reshape(-1))
    return rows.view(*flat.shape, *t.shape[2:])


def rows_reached(index: torch.Tensor, valid: torch.Tensor, num_rows: int,
                 mask_q: torch.Tensor | None = None) -> torch.Tensor:
    """Which of ``num_rows`` key rows some wanted query has among its neighbours: ``[B, N]`` bool.

    Args:
        index, valid: ``[B, Q, K]`` neighbour indices and their validity (:func:`nearest_neighbours`).
        num_rows: ``N``, the key rows indexed.
        mask_q: ``[B, Q]`` bool, the queries that matter (a padded batch's padding is False), or
            None for all.

    A layer whose outputs reach the result only through these neighbours need compute no other row
    (te-pt-tnp's last context update: 20% of the context rows in the demo's fine-tuning windows,
    15% in its fill)."""
    wanted = valid if mask_q is None else valid & mask_q[..., None]  # [B, Q, K]
    # Rows not wanted write into a spare column N, so every write is True and duplicates agree.
    cols = torch.where(wanted, index, num_rows).flatten(1)  # [B, Q * K]
    reached = torch.zeros(index.shape[0], num_rows + 1, dtype=torch.bool, device=index.device)
    return reached.scatter_(1, cols, True)[:, :num_rows]


def pack_wanted(mask_q: torch.Tensor, index: torch.Tensor,
                num_keys: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The wanted queries of every task as one task, for per-query work that padding would waste.

    Args:
        mask_q: ``[B, Q]`` bool, the queries that matter.
        index: ``[B, Q, K]`` their neighbours' indices among each task's ``num_keys`` keys.

    Returns:
        ``rows``, ``(task [P], query [P])`` of the ``P`` wanted queries (``t[rows]`` packs a
        ``[B, Q, ...]`` tensor to ``[P, ...]``), and their neighbours' indices ``[1, P, K]`` among the
        ``B * num_keys`` keys of every task (``keys.reshape(1, B * num_keys, ...)``).
    """
    rows = mask_q.nonzero(as_tuple=True)
    return rows, (index[rows] + rows[0][:, None] * num_keys)[None]


class TELocalAttentionBlock(nn.Module):
    """Pre-norm residual block: queries attend to their gathered nearest keys, then an MLP.

    The attention parameters (q/k/v maps, kernel MLP, distance prior) are a
    :class:`TEAttention` without location updates; only the pairs in ``index`` are evaluated.

    Args:
        dim, num_heads, head_dim, dim_x, dim_hidden, distance_prior: as :class:`TEAttention`.
        max_block_elems: at most this many kernel-MLP activations per query chunk.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, dim_x: int, dim_hidden: int,
                 distance_prior: bool = True, max_block_elems: int = DEFAULT_BLOCK_ELEMS) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = TEAttention(dim, num_heads, head_dim, dim_x, dim_hidden, update_locations=False,
                                max_block_elems=max_block_elems, distance_prior=distance_prior)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = mlp(dim, dim, dim)
        # Both residual branches start at zero: the block starts as the identity, so it can be
        # added to a trained model (``init_from`` in a training config) without changing it.
        for layer in (self.attn.to_out, self.ff[-1]):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, z: torch.Tensor, x: torch.Tensor, kv: torch.Tensor, x_kv: torch.Tensor,
                index: torch.Tensor, valid: torch.Tensor, mask_q: torch.Tensor | None = None) -> torch.Tensor:
        """``z [B, Nq, Dz], x [B, Nq, Dx], kv [B, Nk, Dz], x_kv [B, Nk, Dx]``, ``index/valid [B, Nq, K]``
        -> updated query tokens ``[B, Nq, Dz]``.

        ``mask_q [B, Nq]`` (optional) marks the queries that matter: only those attend (the others,
        a batch's padding, get the MLP branch alone); a query row's result never depends on another's."""
        zq = self.norm_q(z)
        if mask_q is None or bool(mask_q.all()):
            z = z + self._attend(zq, x, self.norm_kv(kv), x_kv, index, valid)
        else:
            z = z + self._attend_wanted(zq, x, self.norm_kv(kv), x_kv, index, valid, mask_q)
        return z + self.ff(self.norm_ff(z))

    def _attend_wanted(self, zq, xq, zk, xk, index, valid, mask_q) -> torch.Tensor:
        """``_attend`` of the wanted queries alone, packed into one task whose keys are every task's
        keys (indices shifted to their task's rows); zeros at the other rows. Padding was 42% of the
        target rows in the demo's fine-tuning batches, and the per-pair MLP runs on every row given."""
        b, nk, _ = zk.shape
        rows, packed_index = pack_wanted(mask_q, index, nk)  # (task [P], query [P]), [1, P, K]
        if rows[0].numel() == 0:  # no wanted query at all
            return torch.zeros_like(zq)
        out = self._attend(zq[rows][None], xq[rows][None], zk.reshape(1, b * nk, -1), xk.reshape(1, b * nk, -1),
                           packed_index, valid[rows][None])  # [1, P, Dz]
        # In the output's dtype (bfloat16 under autocast), as the unpacked sum z + out promotes it.
        return zq.new_zeros(zq.shape, dtype=out.dtype).index_put(rows, out[0])  # [B, Nq, Dz]

    def _attend(self, zq, xq, zk, xk, index, valid) -> torch.Tensor:
        """``zq [B, Nq, Dz], xq [B, Nq, Dx], zk [B, Nk, Dz], xk [B, Nk, Dx]``, ``index/valid [B, Nq, K]``
        -> attention output ``[B, Nq, Dz]``."""
        a = self.attn
        h, dh = a.num_heads, a.head_dim
        b, nq, _ = zq.shape
        kk = index.shape[-1]
        q = a.to_q(zq).view(b, nq, h, dh) / math.sqrt(dh)  # [B, Nq, H, Dh]
        k = a.to_k(zk).view(b, -1, h, dh)  # [B, Nk, H, Dh]
        v = a.to_v(zk).view(b, -1, h, dh)
        # Query chunks bound the gathered keys/values and kernel activations held at once.
        per_query = b * kk * max(a.dim_hidden * 4, 2 * h * dh)
        rows = max(1, min(nq, a.max_block_elems // per_query))
        outs = []
        for s in range(0, nq, rows):
            idx, ok = index[:, s:s + rows], valid[:, s:s + rows]  # [B, q, K]
            kg, vg = gather_rows(k, idx), gather_rows(v, idx)  # [B, q, K, H, Dh]
            diff = xq[:, s:s + rows, None, :] - gather_rows(xk, idx)  # [B, q, K, Dx]
            dots = (q[:, s:s + rows, None] * kg).sum(-1)  # [B, q, K, H]
            logits = a.pair_logits(dots, diff).masked_fill(~ok[..., None], float("-inf"))
            alpha = logits.softmax(dim=2).to(vg.dtype)  # over the K neighbours
            outs.append(torch.einsum("bqkh,bqkhd->bqhd", alpha, vg))  # [B, q, H, Dh]
        return a.to_out(torch.cat(outs, 1).reshape(b, nq, h * dh))  # [B, Nq, Dz]
