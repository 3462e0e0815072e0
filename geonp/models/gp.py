"""Exact Gaussian-process baseline, refitted from scratch on every task.

Not a neural process: it has no weights to train. For each task it fits the
hyper-parameters of a GP (constant mean, ARD squared-exponential kernel with an
output scale, Gaussian noise) by maximising the exact marginal likelihood of the
task's context set plus weak log-normal priors (MAP), then predicts the targets.
The lengthscale prior (median 1) assumes inputs in normalised units, as geonp's
synthetic tasks and grid-unit windows are. It is the reference the TE-TNP
paper compares its models against on GP-generated data.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.constraints import GreaterThan
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import LogNormalPrior
from linear_operator.utils.errors import NotPSDError
from torch.distributions import Normal

from geonp.models.base import NeuralProcess
from geonp.models.catalog import register

# Above gpytorch's default (800) it switches to conjugate gradients with random
# probe vectors, which is approximate and non-deterministic; always use Cholesky.
_MAX_CHOLESKY = 1_000_000
_PRIOR_POINTS = 4.0  # pseudo-observations of unit variance in the y-scale estimate


class _TaskGP(gpytorch.models.ExactGP):
    """One exact GP per output dimension, batched over ``dim_y`` (they share inputs).

    ``x [Dy, N, Dx]``, ``y [Dy, N]``; every hyper-parameter has batch shape ``[Dy]``
    so the output dimensions are fitted independently.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: GaussianLikelihood) -> None:
        super().__init__(x, y, likelihood)
        batch = torch.Size([y.shape[0]])
        self.mean_module = ConstantMean(batch_shape=batch)
        # Weak log-normal priors (medians 1 for lengthscale and output scale, 0.1 for the
        # noise, on standardised y) turn the fit into MAP: with only 1-5 context points
        # plain maximum likelihood collapses the noise and the output scale and predicts
        # with absurd confidence (log-likelihoods of -100s seen on synthetic GP tasks).
        kernel = RBFKernel(ard_num_dims=x.shape[-1], batch_shape=batch, lengthscale_prior=LogNormalPrior(0.0, 1.0))
        self.covar_module = ScaleKernel(kernel, batch_shape=batch, outputscale_prior=LogNormalPrior(0.0, 1.0))

    def forward(self, x: torch.Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


@register("gp", presets={"small": {"fit_steps": 100, "max_context": 256},
                        "tiny": {"fit_steps": 30, "max_context": 128}})
class GPBaseline(NeuralProcess):
    """Exact GP with hyper-parameters fitted per task by type-II maximum likelihood.

    Args:
        dim_x: input dimension ``Dx``.
        dim_y: output dimension ``Dy``; each output gets its own independent GP.
        fit_steps: Adam steps on the exact marginal likelihood per task. The TE-TNP
            paper used 1000 steps at lr 0.1; the default here (200) is cheaper and
            close to converged for the small, standardised problems it sees.
        lr: Adam learning rate.
        max_context: fit on at most this many context points per task, those nearest
            (Euclidean, in input units) to any of its targets; None: all of them. A local
            neighbourhood, as kriging uses: the cost is cubic in the context size; one
            window of 1024 context points and 484 targets took 20.9 s to fit (100 steps,
            float64, 1 CPU thread), at 256 points 0.89 s.

    ``dist = model(xc [B, Nc, Dx], yc [B, Nc, Dy], xt [B, Nt, Dx], mask_c, mask_t)``
    returns the predictive of *noisy* observations, ``Normal`` with ``loc``/``scale``
    ``[B, Nt, Dy]``: posterior mean, and ``sqrt(posterior variance + noise variance)``.
    Padded targets get ``loc = 0``, ``scale = 1``. Outputs carry no gradient.
    """

    # Fitting happens inside predict; there is nothing for a training loop to optimise.
    trainable = False
    # The SE kernel is stationary and the constant mean is refitted per task, so
    # shifting every input leaves the fit (and so the prediction) unchanged.
    translation_equivariant = True

    def __init__(self, dim_x: int, dim_y: int, fit_steps: int = 200, lr: float = 0.1,
                 max_context: int | None = None) -> None:
        super().__init__(dim_x, dim_y)
        if fit_steps < 0:
            raise ValueError(f"fit_steps must be >= 0, got {fit_steps}")
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                        or max_context < 1):
            raise ValueError(f"max_context must be None or an integer >= 1, got {max_context!r}")
        self.fit_steps = fit_steps
        self.lr = lr
        self.max_context = max_context

    def predict(
        self, xc: torch.Tensor, yc: torch.Tensor, xt: torch.Tensor, mask_c: torch.Tensor, mask_t: torch.Tensor
    ) -> Normal:
        """Fit and predict task by task (tasks have different sizes, so no batching)."""
        b, nt, _ = xt.shape
        loc = xc.new_zeros(b, nt, self.dim_y)  # output dtype follows xc
        scale = xc.new_ones(b, nt, self.dim_y)
        # enable_grad: fitting needs autograd even when the caller evaluates under no_grad.
        # debug(False): skips the "test inputs equal training inputs" warning (targets may
        # legitimately coincide with context points) and per-call input checks.
        with torch.enable_grad(), gpytorch.settings.max_cholesky_size(_MAX_CHOLESKY), gpytorch.settings.debug(False):
            for i in range(b):
                mc, mt = mask_c[i], mask_t[i]
                if not mt.any():
                    continue
                mean, std = self._fit_predict(xc[i, mc], yc[i, mc], xt[i, mt])
                loc[i, mt] = mean.to(loc.dtype)
                scale[i, mt] = std.to(scale.dtype)
        return Normal(loc, scale)

    def _fit_predict(self, x: torch.Tensor, y: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fit one task's GPs on ``x [Nc, Dx]``, ``y [Nc, Dy]``; predict at ``xs [M, Dx]``.

        Returns the noisy predictive mean and standard deviation, each ``[M, Dy]``.
        """
        # float64 throughout: Cholesky of a nearly-noiseless SE Gram matrix is fragile in float32.
        x, y, xs = (t.detach().double() for t in (x, y, xs))
        if self.max_context is not None and len(x) > self.max_context:
            x, y = nearest_context(x, y, xs, self.max_context)
        n, dy = y.shape
        # Standardise y so the fixed initialisation (lengthscale 1, outputscale 1, noise 0.1)
        # and the priors are sensible whatever the units. The variance estimate is shrunk
        # towards 1 (as if _PRIOR_POINTS extra points of unit variance were seen): the raw
        # sample std of 2-3 nearby points can be tiny, and dividing by it made the GP
        # absurdly over-confident. Inputs geonp feeds it are normalised, so 1 is apt.
        mu = y.mean(0)
        sd = (((y - mu) ** 2).sum(0) + _PRIOR_POINTS) / (n - 1 + _PRIOR_POINTS)
        sd = sd.sqrt()
        ys = ((y - mu) / sd).T.contiguous()  # [Dy, Nc]

        likelihood = GaussianLikelihood(batch_shape=torch.Size([dy]), noise_constraint=GreaterThan(1e-4),
                                        noise_prior=LogNormalPrior(math.log(0.1), 1.0))
        gp = _TaskGP(x.expand(dy, n, x.shape[-1]), ys, likelihood).to(torch.float64)
        gp.covar_module.base_kernel.lengthscale = 1.0
        gp.covar_module.outputscale = 1.0
        likelihood.noise = 0.1
        self._fit(gp, ys)

        gp.eval()
        with torch.no_grad():
            pred = likelihood(gp(xs.expand(dy, *xs.shape)))  # adds the noise variance
            mean, var = pred.mean, pred.variance  # [Dy, M]
        std = var.clamp_min(1e-12).sqrt()
        return (mean.T * sd + mu), std.T * sd

    def _fit(self, gp: _TaskGP, ys: torch.Tensor) -> None:
        """Maximise the exact marginal likelihood with Adam (deterministic: no sampling)."""
        gp.train()
        mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
        opt = torch.optim.Adam(gp.parameters(), lr=self.lr)  # includes the likelihood's noise
        last_good = {k: v.detach().clone() for k, v in gp.state_dict().items()}
        for _ in range(self.fit_steps):
            opt.zero_grad()
            try:
                # Sum over the Dy independent GPs: their objectives do not interact.
                loss = -mll(gp(*gp.train_inputs), ys).sum()
            except NotPSDError:
                loss = None
            # A step into a numerically bad region should not poison the prediction:
            # fall back to the last hyper-parameters whose likelihood was finite.
            if loss is None or not torch.isfinite(loss):
                gp.load_state_dict(last_good)
                break
            last_good = {k: v.detach().clone() for k, v in gp.state_dict().items()}
            loss.backward()
            opt.step()


def nearest_context(x: torch.Tensor, y: torch.Tensor, xs: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``keep`` context points ``x [Nc, Dx]``, ``y [Nc, Dy]`` nearest to any target ``xs [M, Dx]``.

    Distances are Euclidean in input units; ties go to the earlier point, so the choice is
    deterministic. Targets are taken in chunks so memory stays ``O(Nc x 4096)``.
    """
    near = torch.full((len(x),), math.inf, dtype=x.dtype, device=x.device)
    for chunk in xs.split(4096):
        near = torch.minimum(near, torch.cdist(x, chunk).min(1).values)
    idx = torch.sort(torch.argsort(near, stable=True)[:keep]).values  # keep the context's own order
    return x[idx], y[idx]
