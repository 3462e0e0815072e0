"""Synthetic regression task generators: GP samples and sawtooth waves.

Follows the synthetic 1-D/2-D set-up of the TE-TNP paper (Ashman et al., ICML 2024,
appendix F.1) and the sawtooth tasks of the accompanying thesis (ch. 5-6).

Every generator draws, per task, ``Nc ~ U{min_context..max_context}`` context inputs
uniform on ``[-context_range, context_range]^dx + shift`` and ``num_target`` target
inputs uniform on ``[-target_range, target_range]^dx + shift``. ``shift`` is the
paper's test-time translation Delta; all inputs and outputs are unitless.

A whole batch is drawn with batched tensor ops (no per-task Python loop) from one
``torch.Generator``, so the same generator state always yields the same batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Self

import torch

from geonp.tasks.batch import Batch

KERNELS: tuple[str, ...] = ("se", "matern52", "periodic")


def _check_range(name: str, bounds: tuple[float, float]) -> None:
    """Raise ``ValueError`` unless ``bounds`` is ``(lo, hi)`` with ``0 < lo <= hi``."""
    if len(bounds) != 2 or not 0 < bounds[0] <= bounds[1]:
        raise ValueError(f"{name} must be (lo, hi) with 0 < lo <= hi, got {bounds!r}")


def _log_uniform(bounds: tuple[float, float], n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` float64 draws, log-uniform on ``[lo, hi]``."""
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.exp(lo + (hi - lo) * u)


def kernel_matrix(
    name: str, diff: torch.Tensor, lengthscale: torch.Tensor, period: torch.Tensor | None = None
) -> torch.Tensor:
    """Unit-variance stationary kernel evaluated on pairwise input differences.

    ``"se"`` and ``"matern52"`` use the Euclidean distance ``r = |x - x'|``. ``"periodic"``
    is ``exp(-2 sum_d sin^2(pi |x_d - x'_d| / p) / l^2)``: in 1-D exactly the usual
    exp-sine-squared kernel; in 2-D a product over coordinates, because plugging the
    Euclidean distance into exp-sine-squared is not positive definite for Dx >= 2.

    Args:
        name: one of ``KERNELS``.
        diff: differences ``x - x'``, shape ``[B, N, M, Dx]``.
        lengthscale: per-task lengthscale ``l``, shape ``[B]`` (same units as ``x``).
        period: per-task period ``p``, shape ``[B]``; only used by ``"periodic"``.

    Returns:
        Kernel values, shape ``[B, N, M]``, equal to 1 at zero difference.
    """
    ls = lengthscale[:, None, None]
    if name == "se":
        return torch.exp(-0.5 * diff.pow(2).sum(-1) / ls**2)
    if name == "matern52":
        r = math.sqrt(5.0) * diff.pow(2).sum(-1).sqrt() / ls
        return (1.0 + r + r**2 / 3.0) * torch.exp(-r)
    if name == "periodic":
        if period is None:
            raise ValueError("the periodic kernel needs a period")
        s2 = torch.sin(math.pi * diff / period[:, None, None, None]).pow(2).sum(-1)
        return torch.exp(-2.0 * s2 / ls**2)
    raise ValueError(f"unknown kernel {name!r}; valid kernels: {', '.join(KERNELS)}")


@dataclass(frozen=True)
class _TaskGenerator:
    """Shared configuration and input/mask sampling; subclasses only map inputs to outputs.

    Attributes:
        dim_x: input dimension ``Dx`` (1 or 2). Outputs always have ``Dy = 1``.
        min_context, max_context: bounds (inclusive) of the per-task context size.
        num_target: number of target points per task (never padded).
        context_range, target_range: half-widths of the input boxes.
        shift: translation Delta added to both input boxes (0 during training).
        noise_std: standard deviation of the i.i.d. Gaussian observation noise.
    """

    dim_x: int = 1
    min_context: int = 1
    max_context: int = 64
    num_target: int = 128
    context_range: float = 2.0
    target_range: float = 3.0
    shift: float = 0.0
    noise_std: float = 0.2

    @property
    def dim_y(self) -> int:
        """Output dimension ``Dy`` (always 1 for these generators)."""
        return 1

    def __post_init__(self) -> None:
        if self.dim_x not in (1, 2):
            raise ValueError(f"dim_x must be 1 or 2, got {self.dim_x!r}")
        if self.min_context < 0:
            raise ValueError(f"min_context must be >= 0, got {self.min_context}")
        if self.max_context < self.min_context:
            raise ValueError(f"min_context ({self.min_context}) must be <= max_context ({self.max_context})")
        if self.num_target < 1:
            raise ValueError(f"num_target must be >= 1, got {self.num_target}")
        if not self.context_range > 0:
            raise ValueError(f"context_range must be positive, got {self.context_range}")
        if not self.target_range > 0:
            raise ValueError(f"target_range must be positive, got {self.target_range}")
        if not math.isfinite(self.shift):
            raise ValueError(f"shift must be finite, got {self.shift}")
        if not self.noise_std > 0:
            raise ValueError(f"noise_std must be positive, got {self.noise_std}")

    def with_shift(self, shift: float) -> Self:
        """A copy of this generator whose input boxes are translated by ``shift`` instead."""
        return dataclasses.replace(self, shift=float(shift))

    def _draw_inputs(
        self, batch_size: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw context sizes and all inputs of a batch.

        Returns:
            ``xc [B, Nc_max, Dx]`` (padding rows still hold valid-looking inputs, so the
            joint output draw stays well defined), ``xt [B, Nt, Dx]``, ``mask_c [B, Nc_max]``.
        """
        nc = torch.randint(self.min_context, self.max_context + 1, (batch_size,), generator=generator)
        nc_max = int(nc.max())
        unit_c = torch.rand(batch_size, nc_max, self.dim_x, generator=generator)
        unit_t = torch.rand(batch_size, self.num_target, self.dim_x, generator=generator)
        xc = (2.0 * unit_c - 1.0) * self.context_range + self.shift
        xt = (2.0 * unit_t - 1.0) * self.target_range + self.shift
        mask_c = torch.arange(nc_max)[None, :] < nc[:, None]
        return xc, xt, mask_c

    def _draw_outputs(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Map inputs ``x [B, N, Dx]`` to noisy outputs ``[B, N, 1]`` (joint over the N points)."""
        raise NotImplementedError

    def sample(self, batch_size: int, generator: torch.Generator | int | None = None) -> Batch:
        """Draw one batch of ``batch_size`` tasks.

        Args:
            batch_size: number of tasks ``B``.
            generator: a ``torch.Generator`` (advanced in place), an int seed (a fresh
                generator is made from it), or None for torch's global generator.

        Returns:
            A float32 ``Batch`` with ``xc [B, Nc_max, Dx]``, ``yc [B, Nc_max, 1]``,
            ``xt [B, Nt, Dx]``, ``yt [B, Nt, 1]``; padded context entries are zeros.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        xc, xt, mask_c = self._draw_inputs(batch_size, generator)
        nc_max = xc.shape[1]
        # Context and target outputs come from one joint draw so they share the same function.
        y = self._draw_outputs(torch.cat([xc, xt], dim=1), generator).to(torch.float32)
        yc, yt = y[:, :nc_max], y[:, nc_max:]
        pad = ~mask_c[..., None]
        xc = xc.masked_fill(pad, 0.0)
        yc = yc.masked_fill(pad, 0.0)
        mask_t = torch.ones(batch_size, self.num_target, dtype=torch.bool)
        return Batch(xc=xc, yc=yc, xt=xt, yt=yt, mask_c=mask_c, mask_t=mask_t)


@dataclass(frozen=True)
class GPTaskGenerator(_TaskGenerator):
    """Tasks drawn from zero-mean, unit-variance GP priors plus Gaussian noise.

    Per task: kernel uniform over ``kernels``; lengthscale log-uniform on
    ``lengthscale_range``; for ``"periodic"`` (``exp(-2 sin^2(pi r / p) / l^2)``) a period
    ``p`` log-uniform on ``period_range``. The paper does not state the period prior;
    ``[0.5, 2]`` is our choice. With ``dim_x = 2`` one lengthscale (and period) is shared
    by both coordinates: SE and Matern-5/2 are isotropic in the Euclidean distance, the
    periodic kernel is a product over coordinates (see ``kernel_matrix``). Outputs have variance
    ``1 + noise_std^2``.
    """

    kernels: tuple[str, ...] = KERNELS
    lengthscale_range: tuple[float, float] = (0.25, 4.0)
    period_range: tuple[float, float] = (0.5, 2.0)
    jitter: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not self.kernels:
            raise ValueError("kernels must name at least one kernel")
        bad = [k for k in self.kernels if k not in KERNELS]
        if bad:
            raise ValueError(f"kernels: unknown {bad}; valid kernels: {', '.join(KERNELS)}")
        _check_range("lengthscale_range", self.lengthscale_range)
        _check_range("period_range", self.period_range)
        if self.jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {self.jitter}")

    def _draw_outputs(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        b, n, _ = x.shape
        # Draw every hyperparameter for every task, used or not, so the number of RNG
        # draws (and hence reproducibility) does not depend on which kernels were picked.
        family = torch.randint(len(self.kernels), (b,), generator=generator)
        lengthscale = _log_uniform(self.lengthscale_range, b, generator)
        period = _log_uniform(self.period_range, b, generator)
        # float64 throughout: SE with l = 4 on ~200 points is numerically rank-deficient in float32.
        x64 = x.to(torch.float64)
        diff = x64[:, :, None, :] - x64[:, None, :, :]  # [B, N, N, Dx]
        # Group tasks by kernel family (at most three groups) so each kernel is evaluated
        # only on its own tasks; no per-task loop.
        k = torch.empty(b, n, n, dtype=torch.float64)
        for i, name in enumerate(self.kernels):
            idx = (family == i).nonzero().squeeze(1)
            if idx.numel():
                k[idx] = kernel_matrix(name, diff[idx], lengthscale[idx], period[idx])
        # Sampling y ~ N(0, K + sigma^2 I) directly equals f + noise in distribution and the
        # noise term keeps the Cholesky well conditioned; jitter guards tiny noise_std.
        cov = k + (self.noise_std**2 + self.jitter) * torch.eye(n, dtype=torch.float64)
        chol = torch.linalg.cholesky(cov)
        eps = torch.randn(b, n, 1, generator=generator, dtype=torch.float64)
        return chol @ eps


@dataclass(frozen=True)
class SawtoothTaskGenerator(_TaskGenerator):
    """Sawtooth waves ``y = ((f * <x, d> + phase) mod 1) - 0.5 + noise``.

    Per task: frequency ``f`` (cycles per unit input) uniform on ``freq_range``, phase
    uniform on ``[0, 1)``, direction ``d`` a uniformly random unit vector when
    ``dim_x = 2`` (``d = 1`` in 1-D). Noise-free values lie in ``[-0.5, 0.5)``.
    """

    noise_std: float = 0.05
    freq_range: tuple[float, float] = (3.0, 5.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("freq_range", self.freq_range)

    def _draw_outputs(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        b, n, _ = x.shape
        lo, hi = self.freq_range
        freq = lo + (hi - lo) * torch.rand(b, generator=generator, dtype=torch.float64)
        phase = torch.rand(b, generator=generator, dtype=torch.float64)
        if self.dim_x == 1:
            direction = torch.ones(b, 1, dtype=torch.float64)
        else:
            angle = 2.0 * math.pi * torch.rand(b, generator=generator, dtype=torch.float64)
            direction = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)
        proj = (x.to(torch.float64) * direction[:, None, :]).sum(-1)  # [B, N]
        y = torch.remainder(freq[:, None] * proj + phase[:, None], 1.0) - 0.5
        noise = self.noise_std * torch.randn(b, n, generator=generator, dtype=torch.float64)
        return (y + noise)[..., None]


_FACTORY: dict[str, tuple[type[_TaskGenerator], dict[str, object]]] = {
    "gp": (GPTaskGenerator, {}),
    "gp-se": (GPTaskGenerator, {"kernels": ("se",)}),
    "gp-matern52": (GPTaskGenerator, {"kernels": ("matern52",)}),
    "gp-periodic": (GPTaskGenerator, {"kernels": ("periodic",)}),
    "sawtooth": (SawtoothTaskGenerator, {}),
}


def make_generator(name: str, **kwargs: object) -> GPTaskGenerator | SawtoothTaskGenerator:
    """Build a task generator by name: ``"gp"``, ``"gp-se"``, ``"gp-matern52"``, ``"gp-periodic"``, ``"sawtooth"``.

    ``kwargs`` are fields of the generator class (e.g. ``dim_x``, ``max_context``,
    ``shift``). Raises ``ValueError`` for an unknown name, an unknown or fixed field, or
    an invalid value.
    """
    if name not in _FACTORY:
        raise ValueError(f"unknown generator {name!r}; valid names: {', '.join(_FACTORY)}")
    cls, fixed = _FACTORY[name]
    allowed = {f.name for f in dataclasses.fields(cls)}
    for key in kwargs:
        if key not in allowed:
            raise ValueError(f"unknown argument {key!r} for {name!r}; valid: {', '.join(sorted(allowed))}")
        if key in fixed:
            raise ValueError(f"argument {key!r} is fixed by generator name {name!r}")
    return cls(**fixed, **kwargs)  # type: ignore[arg-type]


def fixed_tasks(generator: _TaskGenerator, num_tasks: int, batch_size: int, seed: int) -> list[Batch]:
    """Materialise ``num_tasks`` tasks as a list of batches from a fresh generator seeded with ``seed``.

    The result depends only on ``(generator config, num_tasks, batch_size, seed)``, never on
    global RNG state, so validation/test sets stay fixed. The last batch holds the
    remainder when ``batch_size`` does not divide ``num_tasks``.
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rng = torch.Generator().manual_seed(seed)
    sizes = [batch_size] * (num_tasks // batch_size) + ([num_tasks % batch_size] if num_tasks % batch_size else [])
    return [generator.sample(size, rng) for size in sizes]
