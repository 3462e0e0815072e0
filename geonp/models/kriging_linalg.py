"""The local kriging head's linear algebra (:mod:`geonp.models.local_kriging`): the covariance
families, each target's neighbour covariance matrix and the symmetric positive definite solve,
both with their backward passes written out (autograd through the plain chain of steps kept a
dozen ``K x K`` tensors per target and differentiated the Cholesky factor itself)."""

from __future__ import annotations

import math

import numpy as np
import torch

from geonp.models import cpu_build

#: Added to the diagonal of every neighbour covariance beside the nugget: keeps it factorable.
JITTER = 1e-4


def correlation(d2: torch.Tensor, kernel: str) -> torch.Tensor:
    """Correlation at squared scaled distance ``d2`` (distance in lengthscales, squared).

    ``exponential`` (Matern 1/2) suits rough fields such as 1 km land surface temperature,
    ``matern32`` fields with some smoothness, ``gaussian`` smooth ones (and conditions badly).
    """
    if kernel == "gaussian":
        return torch.exp(-0.5 * d2)
    d = (d2 + 1e-12).sqrt()  # the epsilon keeps the gradient finite at distance 0
    if kernel == "exponential":
        return torch.exp(-d)
    if kernel == "matern32":
        return (1 + math.sqrt(3) * d) * torch.exp(-math.sqrt(3) * d)
    raise ValueError(f"local kriging kernel must be exponential, matern32 or gaussian, got {kernel!r}")


def _correlation_slope(d2: torch.Tensor, corr: torch.Tensor, kernel: str) -> torch.Tensor:
    """``d corr / d d2`` from ``d2`` and ``corr`` (masked entries of ``corr`` stay 0), as
    :func:`correlation` computes it (same epsilon)."""
    if kernel == "gaussian":
        return -0.5 * corr
    d = (d2 + 1e-12).sqrt()
    if kernel == "exponential":  # exp(-d)
        return -0.5 * corr / d
    return -1.5 * corr / (1 + math.sqrt(3) * d)  # matern32: (1 + sqrt3 d) exp(-sqrt3 d)


#: The covariance families' numbers in the ``covariance`` kernel (kernels/covariance_cpu.cpp).
FAMILIES = {"gaussian": 0, "exponential": 1, "matern32": 2}


def _covariance_kernel(*tensors: torch.Tensor):
    """The compiled ``covariance`` kernel where it runs on these (float32 CPU tensors) and is built, else None."""
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    return cpu_build.kernel("covariance")


class NeighbourCovariance(torch.autograd.Function):
    """The neighbours' covariance matrix of each target, with the backward pass written out.

    ``scaled [B, Nt, K, Dx]`` (neighbour offsets in lengthscales), ``sill``/``nugget`` ``[B, Nt]``,
    ``ok [B, Nt, K]`` (1 present, 0 absent) -> ``K [B, Nt, K, K]``: ``sill * corr(|s_i - s_j|^2)``
    between present neighbours, ``nugget + jitter`` added on their diagonal, a unit diagonal and
    no tie for absent ones (their weight then solves to 0). Autograd through the same chain of
    elementwise steps made and kept a dozen ``K x K`` tensors per target; this keeps two. On the
    CPU in float32 the ``covariance`` kernel (``kernels/covariance_cpu.cpp``) builds each matrix in
    one pass and recomputes what the backward pass needs, keeping none: in the demo's te-pt-tnp fill
    (Intel Xeon, 2 threads, cProfile) 0.48 s forward and 0.12 s backward against 1.66 s and 0.56 s
    for the chain below, which runs on a GPU, in float64 and where the kernel cannot be built.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)  # kriging in float32 under autocast
    def forward(ctx, scaled: torch.Tensor, sill: torch.Tensor, nugget: torch.Tensor, ok: torch.Tensor,
                kernel: str) -> torch.Tensor:
        ctx.kernel = kernel
        compiled = _covariance_kernel(scaled, sill, nugget, ok) if scaled.shape[-2] else None
        ctx.compiled = compiled is not None
        if compiled is not None:  # one pass per matrix; the backward recomputes what it needs
            # The leading dims broadcast (a head's parameters [1, Nt] serve every task); the kernel
            # takes one of each per system. Gradients come back at the broadcast shape, which
            # autograd sums to each input's own. NumPy's rule (see batch_shape: torch's imports SymPy).
            lead = np.broadcast_shapes(tuple(scaled.shape[:-2]), tuple(sill.shape), tuple(nugget.shape),
                                       tuple(ok.shape[:-1]))
            k_, dim = scaled.shape[-2:]
            flat = [t.expand(*lead, *tail).reshape(-1, *tail).contiguous()
                    for t, tail in ((scaled, (k_, dim)), (sill, ()), (nugget, ()), (ok, (k_,)))]
            ctx.save_for_backward(*flat[:2], flat[3])
            ctx.lead = lead
            return compiled.forward(*flat, FAMILIES[kernel]).view(*lead, k_, k_)
        # Squared distances as |a|^2 + |b|^2 - 2 a.b: one batched matmul, no [.., K, K, Dx] tensor
        # (offsets are centred on the target, so the cancellation is small).
        norm = scaled.square().sum(-1)  # [B, Nt, K]
        d2 = (norm[..., :, None] + norm[..., None, :] - 2 * scaled @ scaled.transpose(-1, -2)).clamp_(min=0)
        corr = correlation(d2, kernel).mul_(ok[..., :, None]).mul_(ok[..., None, :])  # [B, Nt, K, K]
        k = corr * sill[..., None, None]
        k.diagonal(dim1=-2, dim2=-1).add_((nugget[..., None] + JITTER) * ok + (1 - ok))
        ctx.save_for_backward(scaled, sill, ok, d2, corr)
        return k

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple:
        if ctx.compiled:
            scaled, sill, ok = ctx.saved_tensors
            g_scaled, g_sill, g_nugget = cpu_build.kernel("covariance").backward(
                g.reshape(-1, *g.shape[-2:]).contiguous(), scaled, sill, ok, FAMILIES[ctx.kernel])
            return (g_scaled.view(*ctx.lead, *scaled.shape[-2:]), g_sill.view(ctx.lead), g_nugget.view(ctx.lead),
                    None, None)
        scaled, sill, ok, d2, corr = ctx.saved_tensors
        g_sill = (g * corr).sum((-2, -1))
        g_nugget = (g.diagonal(dim1=-2, dim2=-1) * ok).sum(-1)
        g_d2 = g * _correlation_slope(d2, corr, ctx.kernel) * sill[..., None, None]
        both = g_d2 + g_d2.transpose(-1, -2)  # d2_ij depends on s_i and s_j alike
        both.diagonal(dim1=-2, dim2=-1).zero_()  # d2_ii is 0 whatever s_i (and its slope huge for rough kernels)
        # d/ds_a sum_ij g_ij |s_i - s_j|^2 = 2 sum_j (g_aj + g_ja) (s_a - s_j)
        g_scaled = 2 * (both.sum(-1, keepdim=True) * scaled - both @ scaled)
        return g_scaled, g_sill, g_nugget, None, None


class _SPDSolve(torch.autograd.Function):
    """``x = K^-1 r`` for symmetric positive definite ``K [..., n, n]`` and ``r [..., n, m]``, by one
    Cholesky factor, with the backward pass written out.

    Autograd through ``cholesky`` and ``cholesky_solve`` differentiates the factor itself: triangular
    solves and masks on whole ``n x n`` matrices, ``O(n^3)`` per system, and most of the local
    kriging head's time (64 neighbours). The gradient of the solution needs only one more solve
    with the saved factor: ``dL/dr = K^-1 g`` and ``dL/dK = -(K^-1 g) x^T``, ``O(n^2 m)``.

    On the CPU the factor and both solves are the ``spd`` kernel's (:mod:`geonp.models.cpu_build`;
    :func:`_kernel_solve`) where it is built; a system the kernel finds not positive definite
    sends the whole call to :func:`robust_cholesky`, which adds jitter.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)  # Cholesky needs float32 or wider
    def forward(ctx, k: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        solved = _kernel_solve(k, r, keep_factor=any(ctx.needs_input_grad))
        if solved is not None:
            x, packed = solved
            ctx.save_for_backward(packed, x)
            ctx.packed = True
            return x
        chol = robust_cholesky(k)
        x = cholesky_solve(r, chol)
        ctx.save_for_backward(chol, x)
        ctx.packed = False
        return x

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        factor, x = ctx.saved_tensors
        if ctx.packed:  # K^-1 g from the kernel's own packed factors
            flat = g.reshape(-1, *x.shape[-2:]).contiguous()  # g has x's shape: [S, n, m]
            g_r = cpu_build.kernel("spd").factor_substitute(factor, flat).view(x.shape)
        else:
            g_r = cholesky_solve(g, factor)  # K^-1 g (K symmetric)
        return -g_r @ x.transpose(-1, -2), g_r


def _kernel_solve(k: torch.Tensor, r: torch.Tensor, keep_factor: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(x = K^-1 r [..., n, m], packed factors)`` by the ``spd`` kernel (eight systems to a
    vector: 8 us a 64-unknown system with 5 right-hand sides on 2 threads, against 36 us for
    LAPACK's factor and :func:`cholesky_solve`), or None: not float32 on the CPU, the kernel not
    built, or a matrix not positive definite (the caller's :func:`robust_cholesky` then adds
    jitter). The packed factors (empty unless ``keep_factor``) are the kernel's layout, for its
    ``factor_substitute`` in the backward pass."""
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (k, r)):
        return None
    kernel = cpu_build.kernel("spd")
    if kernel is None:
        return None
    n, m = k.shape[-1], r.shape[-1]
    batch = batch_shape(k, r)
    flat_k = k.expand(*batch, n, n).reshape(-1, n, n).contiguous()
    flat_r = r.expand(*batch, n, m).reshape(-1, n, m).contiguous()
    x, info, packed = kernel.factor_solve(flat_k, flat_r, keep_factor)
    if bool(info.any()):
        return None
    return x.view(*batch, n, m), packed


def robust_cholesky(k: torch.Tensor, tries: int = 6) -> torch.Tensor:
    """Lower Cholesky factor of symmetric ``K [..., n, n]``; a matrix that float rounding left not
    quite positive definite (a large sill over a tiny nugget, near-duplicate neighbours) gets
    jitter on its diagonal, 1e-6 of its mean diagonal and ten times more on each retry, so one
    degenerate target does not stop a training run. Well-conditioned matrices are untouched."""
    chol, info = torch.linalg.cholesky_ex(k)
    failed = info > 0  # [...]
    if not bool(failed.any()):
        return chol
    scale = k.diagonal(dim1=-2, dim2=-1).abs().mean(-1, keepdim=True)  # [..., 1]
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    for attempt in range(tries):
        jitter = scale * 1e-6 * 10.0**attempt
        retry, info = torch.linalg.cholesky_ex(k + (jitter * failed[..., None].to(k.dtype))[..., None] * eye)
        chol = torch.where(failed[..., None, None], retry, chol)
        failed = failed & (info > 0)
        if not bool(failed.any()):
            return chol
    raise torch.linalg.LinAlgError("kriging covariance not positive definite even with jitter of "
                                   f"{1e-6 * 10.0 ** (tries - 1):g} of its diagonal")


#: Rows per diagonal block of :func:`cholesky_solve`'s blocked substitution on the CPU: the
#: blocks are inverted at once for every system, the rest is one matrix product per block row.
SOLVE_BLOCK = 8


def cholesky_solve(r: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """``K^-1 r`` from ``K``'s lower Cholesky factor ``chol [..., n, n]``, ``r [..., n, m]`` -> ``[..., n, m]``.

    On a GPU, ``torch.cholesky_solve``. On the CPU that call hands each system to LAPACK in turn,
    and the library opens its thread team for every one, so its cost is how fast sleeping threads
    wake: with OpenMP threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``, geonp's policy
    until the short spin of :mod:`geonp.threads`) 99 us a 64-neighbour system against 20 us for
    its Cholesky factor, two thirds of the kriging head's time; 6-8 us after a short spin. Here
    the substitution runs on all systems at once in blocks of :data:`SOLVE_BLOCK` rows: each
    diagonal block's inverse for every system together (:func:`_block_inverses`), then forward
    and back substitution one block row at a time, each a batched matrix product: 15 us a system
    on 2 threads whatever the waiting policy, the same accuracy (relative error 3e-7 in float32
    against 3e-7 for LAPACK's), and a few dozen thread teams per slice of targets instead of two
    per system, which pays beside another job: the demo's te-pt-tnp fill beside a PyTorch job
    took 58.6 s against 69.3 s with LAPACK's solve (whole process, medians of two, 2 cores).
    """
    if chol.device.type != "cpu":
        return torch.cholesky_solve(r, chol)
    n, size = chol.shape[-1], SOLVE_BLOCK
    pad = -n % size
    if pad:  # the factor of [[K, 0], [0, I]]: the padded rows solve to 0
        chol = torch.nn.functional.pad(chol, (0, pad, 0, pad))
        chol.diagonal(dim1=-2, dim2=-1)[..., n:] = 1.0
        r = torch.nn.functional.pad(r, (0, 0, 0, pad))
    batch = batch_shape(chol, r)  # as torch.cholesky_solve broadcasts
    chol, r = chol.expand(*batch, *chol.shape[-2:]).contiguous(), r.expand(*batch, *r.shape[-2:])
    inverse = _block_inverses(chol, size)  # [..., blocks, size, size]
    rows = [slice(i, i + size) for i in range(0, n + pad, size)]
    y = torch.empty_like(r)
    for i, row in enumerate(rows):  # L y = r
        rhs = r[..., row, :] if i == 0 else r[..., row, :] - chol[..., row, :row.start] @ y[..., :row.start, :]
        y[..., row, :] = inverse[..., i, :, :] @ rhs
    x = torch.empty_like(r)
    for i, row in reversed(list(enumerate(rows))):  # L^T x = y
        rhs = y[..., row, :]
        if row.stop < n + pad:
            rhs = rhs - chol[..., row.stop:, row].mT @ x[..., row.stop:, :]
        x[..., row, :] = inverse[..., i, :, :].mT @ rhs
    return x[..., :n, :] if pad else x


def _block_inverses(chol: torch.Tensor, size: int) -> torch.Tensor:
    """The inverses of lower-triangular ``chol [..., n, n]``'s diagonal blocks of ``size`` rows
    (``n`` a multiple of ``size``, a power of two) -> ``[..., n / size, size, size]``: from the
    diagonal's reciprocals, pairs of inverted halves joined, ``[[A, 0], [B, C]]^-1 = [[A^-1, 0],
    [-C^-1 B A^-1, C^-1]]``, every block of every system in one product per doubling."""
    def diagonal_blocks(t: torch.Tensor, width: int) -> torch.Tensor:  # [..., n, n] -> [..., n / width, width, width]
        count = t.shape[-1] // width
        return t.view(*t.shape[:-2], count, width, count, width).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)

    lower = diagonal_blocks(chol, size).contiguous()  # [..., blocks, size, size]
    inverse = torch.diag_embed(lower.diagonal(dim1=-2, dim2=-1).reciprocal())
    half = 1
    while half < size:
        low, inv = diagonal_blocks(lower, 2 * half), diagonal_blocks(inverse, 2 * half)  # views
        inv[..., half:, :half] = -(inv[..., half:, half:] @ low[..., half:, :half] @ inv[..., :half, :half])
        half *= 2
    return inverse


def batch_shape(*matrices: torch.Tensor) -> tuple[int, ...]:
    """The broadcast batch shape of ``[..., n, k]`` tensors (all but their last two dimensions).

    NumPy's rule, which is torch's: ``torch.broadcast_shapes`` gives the same, but its first call
    imports ``torch.fx.experimental.symbolic_shapes`` and SymPy, 0.4 s of every fill's time."""
    return np.broadcast_shapes(*(tuple(m.shape[:-2]) for m in matrices))


def spd_solve(k: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``K^-1 r`` for symmetric positive definite ``K [..., n, n]``, ``r [..., n, m]`` -> ``[..., n, m]``."""
    return _SPDSolve.apply(k, r)
