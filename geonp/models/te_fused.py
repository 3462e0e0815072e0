"""Fused TE attention on the CPU: a C++ kernel for TEAttention's fast path.

The Python fast path (``TEAttention._logits_fast``) evaluates the logit MLP on blocks of
``[B, bq, bk, hidden]`` pairs: memory traffic, not arithmetic, bounds it. The kernel in
``kernels/te_attention_cpu.cpp`` runs the whole per-pair chain (``q.k``, the MLP rho, the
distance prior, softmax, value sum and the location MLP phi of Eq. 10) for one query row at a
time, in tiles of 16 keys held in registers, so no pair tensor ever exists and memory is
``O(threads * H * Nk)`` whatever the sizes.

It is compiled on first use (:mod:`geonp.models.cpu_build`: needs a C++ compiler and ``ninja``;
the first build takes about 45 s here and is announced on stderr, later processes load it in a
second). Where it cannot be built :func:`cpu_kernel` returns None and TEAttention keeps its
Python path: same function, slower. Whether a TEAttention layer asks for it at all is the layer's ``backend``
attribute (:func:`geonp.models.te_attention.attention_backend` switches a whole model). The backward pass
is fused too: it recomputes each query row's pair activations tile by tile rather than storing
them, so training memory is that of the forward pass (the Python path checkpoints row blocks
for the same reason).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from geonp.models import cpu_build

#: Keys per tile in the kernel: the key axis is padded to a multiple of it.
KEY_TILE = 16


def cpu_kernel() -> ModuleType | None:
    """The compiled kernel module for this CPU, or None (no compiler, no ninja, a failed build):
    :func:`geonp.models.cpu_build.kernel`'s ``te_attention``."""
    return cpu_build.kernel("te_attention")


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernel can run on these tensors: CPU float32, and the kernel built."""
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return False
    return cpu_kernel() is not None


class _Kernel(torch.autograd.Function):
    """The kernel's forward and backward as one differentiable step (inputs as in ``fused_attention``)."""

    @staticmethod
    def forward(ctx, has_phi: bool, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.has_phi = has_phi
        ctx.save_for_backward(*inputs)
        out, dx = cpu_kernel().forward(list(inputs), has_phi)
        return out, dx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out: torch.Tensor, g_dx: torch.Tensor) -> tuple:
        grads = cpu_kernel().backward(list(ctx.saved_tensors), ctx.has_phi, g_out, g_dx)
        grads.insert(5, None)  # the keys' mask
        return (None, *grads, None)  # the queries' mask last


def fused_attention(rho: nn.Sequential, phi: nn.Sequential | None, log_lengthscale: torch.Tensor | None,
                    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, xq: torch.Tensor, xk: torch.Tensor,
                    mask_k: torch.Tensor, mask_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """TE attention weights applied to values, and the Eq. 10 location update, by the kernel.

    Args:
        rho, phi: the logit MLP (``H + Dx -> J -> J -> H``) and location MLP (``H -> J -> J -> H``,
            or None for no update), both ``geonp.models.layers.mlp`` with two hidden layers.
        log_lengthscale: ``[H]`` distance-prior lengthscales (log, input units), or None.
        q: ``[B, H, Nq, Dh]`` queries, already scaled by ``1 / sqrt(Dh)``.
        k, v: ``[B, H, Nk, Dh]``.
        xq, xk: ``[B, Nq, Dx]``, ``[B, Nk, Dx]`` locations (centred: only differences matter).
        mask_k: ``[B, Nk]`` bool, True where a key is present.
        mask_q: ``[B, Nq]`` bool, True where a query is wanted, or None for all: the kernel skips
            the others (a padded batch's padding: in the demo's fine-tuning 32% of the context rows
            and 42% of the target rows, in its fill 61% of the target rows), leaving their ``out``
            and ``dx`` zero and sending them no gradient.

    Returns:
        ``out [B, H, Nq, Dh]`` and ``dx [B, Nq, Dx]`` (zeros when ``phi`` is None).
    """
    if cpu_kernel() is None:
        raise RuntimeError("fused TE attention kernel unavailable; see geonp.models.te_fused")
    h = q.shape[1]
    pad = (-k.shape[2]) % KEY_TILE
    if pad:  # padded keys are absent keys
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        xk, mask_k = F.pad(xk, (0, 0, 0, pad)), F.pad(mask_k, (0, pad))
    first, second, last = rho[0], rho[2], rho[4]
    w_x = first.weight[:, h:]  # [J, Dx]
    pq = F.linear(xq, w_x, first.bias)  # [B, Nq, J]: the query half of rho's first layer
    neg_pk = -F.linear(xk, w_x)  # [B, Nk, J]: the key half, negated
    if log_lengthscale is None:
        half_inv_ell2 = q.new_zeros(h)
    else:
        half_inv_ell2 = 0.5 * torch.exp(-2.0 * log_lengthscale)
    if phi is None:
        unused = q.new_zeros(1)
        phi_args = (unused.expand(1, h), unused, unused.expand(1, 1), unused, unused, unused)
    else:
        phi_args = (phi[0].weight, phi[0].bias, phi[2].weight, phi[2].bias, phi[4].weight.sum(0),
                    phi[4].bias.sum().view(1))
    inputs = [q, k.transpose(-1, -2), v, xq, xk.transpose(1, 2), mask_k.float(), pq, neg_pk.transpose(1, 2),
              first.weight[:, :h], second.weight, second.bias, last.weight, last.bias, half_inv_ell2, *phi_args,
              q.new_ones(q.shape[0], q.shape[2]) if mask_q is None else mask_q.float()]
    return _Kernel.apply(phi is not None, *(t.contiguous() for t in inputs))  # no graph without autograd
