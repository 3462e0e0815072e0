"""Translation-equivariant (TE) attention with bounded memory.

TE attention (Ashman et al., ICML 2024, Eq. 8, in the "post-MLP" form that the
TE-TNP thesis found better): for query ``n`` and key ``m`` the per-head logits are

    s[h, n, m] = rho([q_n^h . k_m^h / sqrt(Dh) for h in heads], x_n - x_m)[h]

with ``rho`` an MLP from ``H + Dx`` to ``H`` values, then a softmax over keys and
a weighted sum of values. Tokens never see absolute locations, only differences,
so shifting every location leaves the output unchanged.

Distance prior (geonp's addition, on by default): each head's logits also get
``-|x_n - x_m|^2 / (2 ell_h^2)`` with a learnable lengthscale ``ell_h`` per head,
initialised log-spaced from 0.1 to 3 input units. An MLP of the differences starts out
nearly flat, so attention begins as a plain average over all keys; with many keys
(infill windows: hundreds of cells in 3-D) the gradient towards local attention is then
too weak to find. Measured on infill windows (tiny te-pt-tnp, 256 context cells,
lr 1e-3, 1 CPU thread): without the prior the training NLL stayed at 1.51 (the marginal)
for 200 steps, te-tnp likewise for 50; with it, 1.55 -> 1.27 in 200 steps. The prior is
a squared-distance function of the differences, so equivariance is unchanged.

Query locations are updated as in Eq. 10,

    x_n <- x_n + (1 / N) sum_m (x_n - x_m) sum_h phi(alpha[:, n, m])[h]

with ``phi`` an MLP on the vector of per-head attention weights and ``N`` the
number of present keys.

Memory: the MLP ``rho`` runs on every (query, key) pair, so materialising its
hidden activation needs ``B * Nq * Nk * hidden`` numbers (13.5 GB for the
thesis' TETNP at Nc=5000). Here keys are processed in blocks with an online
(running max / running sum) softmax and queries in row blocks, so at most
``max_block_elems`` hidden activations exist at once; only the ``H``-wide logits
of one row block are kept between the two passes. Under autograd each row block
is recomputed in the backward pass (activation checkpointing), which bounds
training memory in the same way.

On the CPU the fast path normally runs as one fused C++ kernel (``geonp.models.te_fused``):
the whole per-pair chain for one query row at a time, forward and backward, with no pair
tensor at all; the Python code below is its fallback and its reference.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from geonp.models import te_fused
from geonp.models.layers import mlp


def recomputed_in_backward(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` with its activations recomputed in backward instead of kept: reentrant
    checkpointing as ``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)`` does it, by
    :class:`_Recomputed`. ``function`` must be deterministic (the RNG state is not replayed; its
    autocast state is). Before PyTorch 2.4 (no ``torch.get_autocast_dtype``) the public wrapper."""
    if not hasattr(torch, "get_autocast_dtype"):
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=True)
    device = next((a.device.type for a in args if torch.is_tensor(a)), "cpu")
    autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
                torch.is_autocast_cache_enabled())
    return _Recomputed.apply(function, autocast, *args)


class _Recomputed(torch.autograd.Function):
    """Forward without a graph; backward recomputes with one, under the forward's autocast state.

    The recomputed outputs' gradients enter as the scalar ``sum(<output, its gradient>)``, whose
    backward hands each output exactly its gradient (``1 * g``): PyTorch's ``CheckpointFunction``
    gradients to the bit (tested), without passing a tensor of gradients to
    ``torch.autograd.backward``, whose shape check imports SymPy at its first call (2.0 s of an
    H200 fill's cold start, ``pipelines/results/fill_profile_cuda_scene150k.md``)."""

    @staticmethod
    def forward(ctx, function: Callable[..., Any], autocast: tuple, *args: Any) -> Any:
        ctx.function, ctx.autocast = function, autocast
        ctx.at = [i for i, a in enumerate(args) if torch.is_tensor(a)]
        ctx.others = [None if torch.is_tensor(a) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.at))
        with torch.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple:
        if not torch.autograd._is_checkpoint_valid():  # as CheckpointFunction: .grad() would sum into .grad
            raise RuntimeError("TE attention's recomputed row blocks take .backward(), not torch.autograd.grad")
        args = list(ctx.others)
        for i, saved in zip(ctx.at, ctx.saved_tensors):
            args[i] = saved.detach().requires_grad_(saved.requires_grad)
        device, enabled, dtype, cache = ctx.autocast
        with torch.enable_grad():
            with torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache):
                outputs = ctx.function(*args)
            outputs = (outputs,) if torch.is_tensor(outputs) else outputs
            terms = [(o * g).sum() for o, g in zip(outputs, grads)
                     if torch.is_tensor(o) and o.requires_grad and g is not None]
            if terms:
                total = terms[0]
                for term in terms[1:]:  # added, not stacked: the outputs' dtypes may differ under autocast
                    total = total + term
                torch.autograd.backward(total)
        return (None, None, *(a.grad if torch.is_tensor(a) and a.requires_grad else None for a in args))


#: The implementations of TE attention: ``fused`` runs the fast form through the C++ kernel of
#: :mod:`geonp.models.te_fused` where it applies (CPU float32 tensors, kernel built) and the Python
#: fast form elsewhere; ``fast`` runs the Python fast form (split first layer of ``rho``, folded
#: last layer of ``phi``, see ``TEAttention._logits_fast``); ``direct`` runs the direct form, the
#: reference the tests hold the other two to. All three compute the same function.
BACKENDS = ("fused", "fast", "direct")
#: Default cap on hidden activations alive at once (elements; 2**24 floats = 64 MiB).
DEFAULT_BLOCK_ELEMS = 2**24
#: Block cap for window-sized tasks without autograd (see :func:`set_block_elems`), what
#: :meth:`geonp.models.base.NeuralProcess.for_prediction` sets.
PREDICT_BLOCK_ELEMS = 2**22
#: Block cap for window-sized tasks with autograd, what ``NeuralProcess.for_training`` sets.
TRAIN_BLOCK_ELEMS = 2**25
#: Block cap for no-grad forwards on a GPU (256 MiB of float32): the CPU's cap, sized for its
#: caches, cut a GPU fill into thousands of tiny launches (3,714 attention blocks in a 40 s fill of
#: the 150k-cell scene on an H200, pipelines/results/fill_profile_cuda_scene150k.md).
GPU_PREDICT_BLOCK_ELEMS = 2**26
#: Keys per block of the Python forms (``TEAttention.key_block``): bounds memory, never the result.
KEY_BLOCK = 512
_SAVED_PER_PAIR = 10  # kernel-MLP activations (in units of the hidden width) kept per pair for backward
_NEG = -1e30  # finite "minus infinity" so fully padded key blocks never give inf - inf


class TEAttention(nn.Module):
    """TE multi-head attention ``queries (zq, xq) <- keys (zk, xk)``.

    Which implementation runs (the fused kernel, the Python fast form or the direct form) is the
    layer's ``backend`` attribute, ``"fused"`` unless set (:func:`attention_backend` sets it for
    every layer of a model).

    Args:
        dim: token size ``Dz``.
        num_heads, head_dim: ``H`` and ``Dh``.
        dim_x: input-location dimension ``Dx``.
        dim_hidden: width of the two hidden layers of ``rho`` and ``phi``.
        update_locations: apply Eq. 10 to the query locations.
        max_block_elems: memory cap, see the module docstring.
        distance_prior: add the per-head squared-distance term, see the module docstring.

    ``max_block_elems``, ``key_block`` (:data:`KEY_BLOCK`) and ``backend`` are attributes a caller
    may change: they set how the work is done, never what it computes.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int,
        dim_x: int,
        dim_hidden: int,
        update_locations: bool = True,
        max_block_elems: int = DEFAULT_BLOCK_ELEMS,
        distance_prior: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.dim_hidden = num_heads, head_dim, dim_hidden
        self.max_block_elems, self.key_block, self.backend = max_block_elems, KEY_BLOCK, "fused"
        inner = num_heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.Linear(inner, dim)
        self.logit_mlp = mlp(num_heads + dim_x, dim_hidden, num_heads)  # rho
        self.loc_mlp = mlp(num_heads, dim_hidden, num_heads) if update_locations else None  # phi
        # log ell_h [H]: heads start at lengthscales from fine to coarse.
        self.log_lengthscale = (
            nn.Parameter(torch.linspace(math.log(0.1), math.log(3.0), num_heads)) if distance_prior else None
        )
        if self.loc_mlp is not None:
            # Start with no location updates; training switches them on as useful.
            nn.init.zeros_(self.loc_mlp[-1].weight)
            nn.init.zeros_(self.loc_mlp[-1].bias)

    def _split(self, z: torch.Tensor) -> torch.Tensor:
        b, n, _ = z.shape  # [B, N, H * Dh] -> [B, H, N, Dh]
        return z.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self, zq: torch.Tensor, xq: torch.Tensor, zk: torch.Tensor, xk: torch.Tensor, mask_k: torch.Tensor,
        mask_q: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``zq [B, Nq, Dz], xq [B, Nq, Dx], zk [B, Nk, Dz], xk [B, Nk, Dx], mask_k [B, Nk]``
        -> ``(out [B, Nq, Dz], new xq [B, Nq, Dx])``.

        ``mask_q [B, Nq]`` (optional) marks the queries that matter: the fused kernel skips the
        others (a batch's padding), whose rows then hold ``to_out``'s bias and an unmoved location;
        the Python paths compute every row. A query row's result never depends on another's."""
        q = self._split(self.to_q(zq)) / math.sqrt(self.head_dim)
        k, v = self._split(self.to_k(zk)), self._split(self.to_v(zk))
        b, h, nq, _ = q.shape
        nk = k.shape[2]
        n_valid = mask_k.sum(-1).clamp(min=1).to(xq.dtype)  # [B]
        xq_in = xq
        # Read once: row blocks recomputed in the backward pass must use the implementation the
        # forward pass used, even when backward() runs after the attribute has changed again.
        backend = self.backend
        direct = backend == "direct"
        if not direct:
            # Centre the locations on the keys' mean: a translation, so nothing changes but the
            # magnitude of the coordinates, which keeps the split first layer (see _logits_fast)
            # exact to rounding of the differences rather than of absolute positions.
            x0 = (xk * mask_k[..., None]).sum(1, keepdim=True) / n_valid[:, None, None]  # [B, 1, Dx]
            xq, xk = xq - x0, xk - x0
        if backend == "fused" and te_fused.usable(q, xq, xk):
            out, dx = te_fused.fused_attention(self.logit_mlp, self.loc_mlp, self.log_lengthscale, q, k, v, xq, xk,
                                               mask_k, mask_q)
            out = out.transpose(1, 2).reshape(b, nq, -1)  # [B, Nq, H * Dh]
            return self.to_out(out), xq_in + dx if self.loc_mlp is not None else xq_in
        width = max(self.dim_hidden, h)
        bk = min(nk, self.key_block)
        grad = torch.is_grad_enabled()
        # Row block size from the memory cap. Under autograd a row block keeps about
        # _SAVED_PER_PAIR activations of the kernel MLPs per (query, key) pair for the
        # backward pass (both MLPs' pre- and post-ReLU layers, logits, weights); without
        # autograd only one key block's few temporaries are alive at once.
        per_row = b * width * (nk * _SAVED_PER_PAIR if grad else bk * 3) + b * h * nk
        bq = max(1, min(nq, self.max_block_elems // per_row))
        outs, dxs = [], []
        for start in range(0, nq, bq):
            rows = (q[:, :, start:start + bq], xq[:, start:start + bq], k, v, xk, mask_k, n_valid, bk, direct)
            # One block within the cap is kept for backward as usual; several blocks are
            # recomputed in backward, else they would all stay alive until then. The
            # reentrant form: the non-reentrant one kept ~0.2 MB per block alive (measured
            # 11.6 GiB for te-tnp forward + backward at Nc=5000 against 0.23 GiB at Nc=2000).
            if grad and q.requires_grad and bq < nq:
                out, dx = recomputed_in_backward(self._attend_rows, *rows)
            else:
                out, dx = self._attend_rows(*rows)
            outs.append(out)
            dxs.append(dx)
        out = torch.cat(outs, dim=2).transpose(1, 2).reshape(b, nq, -1)  # [B, Nq, H * Dh]
        new_xq = xq_in + torch.cat(dxs, dim=1) if self.loc_mlp is not None else xq_in
        return self.to_out(out), new_xq

    def _logits(self, q: torch.Tensor, xq: torch.Tensor, k: torch.Tensor, xk: torch.Tensor,
                direct: bool = False) -> torch.Tensor:
        # q [B, H, bq, Dh], k [B, H, bk, Dh], xq [B, bq, Dx], xk [B, bk, Dx] -> logits [B, H, bq, bk] (float32)
        if not direct:
            return self._logits_fast(q, xq, k, xk)
        dots = (q @ k.transpose(-1, -2)).permute(0, 2, 3, 1)  # [B, bq, bk, H]
        # Differences are formed in full precision before any cast, so equivariance is exact.
        diff = xq[:, :, None, :] - xk[:, None, :, :]  # [B, bq, bk, Dx]
        return self.pair_logits(dots, diff).permute(0, 3, 1, 2)

    def _logits_fast(self, q: torch.Tensor, xq: torch.Tensor, k: torch.Tensor, xk: torch.Tensor) -> torch.Tensor:
        """``_logits`` with the kernel MLP's first layer split: it is linear in ``(q.k, x_q - x_k)``,
        so its location part is ``W_x x_q - W_x x_k``, one projection per query and one per key
        instead of one per pair, and the ``[.., H + Dx]`` input is never built."""
        first = self.logit_mlp[0]
        h = self.num_heads
        w_dots, w_x = first.weight[:, :h], first.weight[:, h:]  # [J, H], [J, Dx]
        dots = (q @ k.transpose(-1, -2)).permute(0, 2, 3, 1)  # [B, bq, bk, H]
        per_q = F.linear(xq.to(dots.dtype), w_x, first.bias)  # [B, bq, J]
        per_k = F.linear(xk.to(dots.dtype), w_x)  # [B, bk, J]
        hidden = F.linear(dots, w_dots) + (per_q[:, :, None, :] - per_k[:, None, :, :])  # [B, bq, bk, J]
        logits = self.logit_mlp[1:](hidden).float()  # [B, bq, bk, H]
        if self.log_lengthscale is not None:
            dist2 = (xq[:, :, None, :] - xk[:, None, :, :]).float().square().sum(-1, keepdim=True)
            logits = logits - 0.5 * dist2 * torch.exp(-2.0 * self.log_lengthscale.float())
        return logits.permute(0, 3, 1, 2)

    def pair_logits(self, dots: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
        """The TE logits of (query, key) pairs: ``dots [..., H]`` (scaled q.k per head) and
        ``diff [..., Dx]`` (x_query - x_key) -> ``[..., H]`` float32."""
        logits = self.logit_mlp(torch.cat([dots, diff.to(dots.dtype)], dim=-1)).float()
        if self.log_lengthscale is not None:
            dist2 = diff.float().square().sum(-1, keepdim=True)  # [..., 1]
            logits = logits - 0.5 * dist2 * torch.exp(-2.0 * self.log_lengthscale.float())
        return logits

    def _attend_rows(
        self,
        q: torch.Tensor,
        xq: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        xk: torch.Tensor,
        mask_k: torch.Tensor,
        n_valid: torch.Tensor,
        bk: int,
        direct: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One row block: ``q [B, H, bq, Dh], xq [B, bq, Dx]`` -> ``(out [B, H, bq, Dh], dx [B, bq, Dx])``;
        ``direct``: the direct form (the reference) instead of the fast one."""
        b, h, bq, _ = q.shape
        nk = k.shape[2]
        # Pass 1: logits block by block with a running max and running sum.
        run_max = q.new_full((b, h, bq), _NEG, dtype=torch.float32)
        run_sum = q.new_zeros((b, h, bq), dtype=torch.float32)
        blocks = []
        for s in range(0, nk, bk):
            logits = self._logits(q, xq, k[:, :, s:s + bk], xk[:, s:s + bk], direct)
            logits = logits.masked_fill(~mask_k[:, None, None, s:s + bk], float("-inf"))
            new_max = torch.maximum(run_max, logits.amax(-1))
            run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(logits - new_max[..., None]).sum(-1)
            run_max = new_max
            blocks.append(logits)
        log_norm = run_max + torch.log(run_sum)  # [B, H, bq]
        # Pass 2: normalised weights -> values and (Eq. 10) location updates.
        out = q.new_zeros((b, h, bq, v.shape[-1]), dtype=torch.float32)
        dx = xq.new_zeros(xq.shape, dtype=torch.float32)
        for i, s in enumerate(range(0, nk, bk)):
            alpha = torch.exp(blocks[i] - log_norm[..., None])  # [B, H, bq, bk]; 0 at padding
            out = out + alpha @ v[:, :, s:s + bk].float()
            if self.loc_mlp is not None and not direct:
                # phi's last layer is summed over heads right away: fold the sum into its weights,
                # and sum_k w (x_q - x_k) = x_q sum_k w - sum_k w x_k needs no per-pair differences.
                last = self.loc_mlp[-1]
                hidden = self.loc_mlp[:-1](alpha.permute(0, 2, 3, 1).to(q.dtype))  # [B, bq, bk, J]
                w = F.linear(hidden, last.weight.sum(0, keepdim=True), last.bias.sum().view(1))[..., 0].float()
                w = w * mask_k[:, None, s:s + bk]  # [B, bq, bk]
                dx = dx + xq.float() * w.sum(-1, keepdim=True) - w @ xk[:, s:s + bk].float()
            elif self.loc_mlp is not None:
                diff = xq[:, :, None, :] - xk[:, None, s:s + bk, :]  # [B, bq, bk, Dx]
                w = self.loc_mlp(alpha.permute(0, 2, 3, 1).to(q.dtype)).sum(-1).float()  # [B, bq, bk]
                w = w * mask_k[:, None, s:s + bk]
                dx = dx + torch.einsum("bqk,bqkd->bqd", w, diff.float())
        dx = dx / n_valid[:, None, None].float()
        return out.to(v.dtype), dx.to(xq.dtype)


class TEAttentionBlock(nn.Module):
    """Pre-norm residual TE block: attention on ``(tokens, locations)`` then an MLP.

    Self-attention when called with the queries as keys; cross-attention
    otherwise. Returns the updated tokens and the updated query locations.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, dim_x: int, dim_hidden: int, **kwargs) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = TEAttention(dim, num_heads, head_dim, dim_x, dim_hidden, **kwargs)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = mlp(dim, dim, dim)

    def forward(
        self, z: torch.Tensor, x: torch.Tensor, kv: torch.Tensor, x_kv: torch.Tensor, mask_kv: torch.Tensor,
        mask_q: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # z [B, Nq, Dz], x [B, Nq, Dx], kv [B, Nk, Dz], x_kv [B, Nk, Dx], mask_kv [B, Nk], mask_q [B, Nq] or None
        out, x = self.attn(self.norm_q(z), x, self.norm_kv(kv), x_kv, mask_kv, mask_q)
        z = z + out
        return z + self.ff(self.norm_ff(z)), x


def _te_layers(model: nn.Module) -> list[TEAttention]:
    """The TE attention layers of ``model`` (the model itself if it is one)."""
    return [module for module in model.modules() if isinstance(module, TEAttention)]


def set_block_elems(model: nn.Module, max_block_elems: int) -> nn.Module:
    """Set the memory cap of every TE attention layer in ``model`` (a runtime knob, not a weight).

    Measured on 2 CPU threads (te-pt-tnp, 16 windows of 1024 context): without autograd,
    2**22 runs the small preset 20x faster than 2**26, whose temporaries outgrow the caches;
    with autograd 2**22 forces row-by-row recomputation and trains 70x slower than 2**25.
    """
    for layer in _te_layers(model):
        layer.max_block_elems = max_block_elems
    return model


@contextlib.contextmanager
def attention_backend(model: nn.Module, name: str) -> Iterator[nn.Module]:
    """Run every TE attention layer of ``model`` with implementation ``name`` inside the block.

    Each layer keeps its choice in its ``backend`` attribute (``"fused"`` unless set), like
    ``max_block_elems``: how the work is done, never what it computes. The previous choices
    come back when the block ends.

    Args:
        model: any module; its :class:`TEAttention` layers are switched.
        name: one of :data:`BACKENDS`.

    Raises:
        ValueError: an unknown name.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown TE attention backend {name!r}; known: {', '.join(BACKENDS)}")
    layers = _te_layers(model)
    before = [m.backend for m in layers]
    for layer in layers:
        layer.backend = name
    try:
        yield model
    finally:
        for layer, was in zip(layers, before):
            layer.backend = was
