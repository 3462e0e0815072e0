"""Tests for the exact GP baseline (geonp.models.gp)."""

from __future__ import annotations

import math

import torch

from geonp.models.gp import GPBaseline


def _se(a: torch.Tensor, b: torch.Tensor, lengthscale: float) -> torch.Tensor:
    """Unit-variance SE kernel between ``a [N, 1]`` and ``b [M, 1]`` -> ``[N, M]``."""
    return torch.exp(-0.5 * (a - b.T) ** 2 / lengthscale**2)


def _task(gen: torch.Generator, b: int, nc: int, nt: int, dy: int = 1) -> tuple[torch.Tensor, ...]:
    """A smooth random batch: ``xc [B, Nc, 1]``, ``yc [B, Nc, Dy]``, ``xt [B, Nt, 1]``."""
    xc = torch.rand(b, nc, 1, generator=gen) * 4 - 2
    xt = torch.rand(b, nt, 1, generator=gen) * 4 - 2
    phase = torch.rand(b, 1, dy, generator=gen) * 6
    yc = torch.sin(2 * xc + phase) + 0.1 * torch.randn(b, nc, dy, generator=gen)
    return xc, yc, xt


def test_close_to_true_hyperparameters() -> None:
    """On data drawn from a known SE GP, the fitted GP is nearly as good as the true one."""
    gen = torch.Generator().manual_seed(0)
    ell, noise_sd, nc, nt = 0.5, 0.1, 50, 100
    x = (torch.rand(nc + nt, 1, generator=gen, dtype=torch.float64) * 4 - 2)
    k = _se(x, x, ell) + 1e-10 * torch.eye(nc + nt, dtype=torch.float64)
    f = torch.linalg.cholesky(k) @ torch.randn(nc + nt, 1, generator=gen, dtype=torch.float64)
    y = f + noise_sd * torch.randn(nc + nt, 1, generator=gen, dtype=torch.float64)
    xc, yc, xt, yt = x[:nc], y[:nc], x[nc:], y[nc:]

    # Reference: exact predictive with the true hyper-parameters (zero mean, unit outputscale).
    kcc = _se(xc, xc, ell) + noise_sd**2 * torch.eye(nc, dtype=torch.float64)
    ktc = _se(xt, xc, ell)
    chol = torch.linalg.cholesky(kcc)
    mean = ktc @ torch.cholesky_solve(yc, chol)
    v = torch.linalg.solve_triangular(chol, ktc.T, upper=False)
    var = 1.0 - (v**2).sum(0) + noise_sd**2
    ref = torch.distributions.Normal(mean.squeeze(-1), var.sqrt()).log_prob(yt.squeeze(-1)).mean()

    model = GPBaseline(dim_x=1, dim_y=1, fit_steps=200)
    dist = model(xc[None].float(), yc[None].float(), xt[None].float())
    fitted = dist.log_prob(yt[None].float()).mean()
    assert dist.loc.dtype == torch.float32
    assert abs(float(fitted) - float(ref)) < 0.15, (float(fitted), float(ref))
    # The predictive itself, not only its score: mean and sigma close to the true GP's.
    gap = (dist.loc[0, :, 0].double() - mean[:, 0]).abs().max().item()
    ratio = dist.scale[0, :, 0].double() / var.sqrt()
    assert gap < 0.1, gap  # measured 0.034
    assert 0.8 < ratio.min().item() and ratio.max().item() < 1.15, ratio  # measured 0.89-0.98


def test_padded_batch_matches_separate_tasks() -> None:
    gen = torch.Generator().manual_seed(1)
    xa, ya, ta = _task(gen, 1, 12, 20)
    xb, yb, tb = _task(gen, 1, 25, 31)
    nc, nt = 25, 31
    pad = float("nan")  # padding may hold anything; NaN makes leaks visible
    xc = torch.full((2, nc, 1), pad)
    yc = torch.full((2, nc, 1), pad)
    xt = torch.full((2, nt, 1), pad)
    xc[0, :12], yc[0, :12], xt[0, :20] = xa[0], ya[0], ta[0]
    xc[1], yc[1], xt[1] = xb[0], yb[0], tb[0]
    mask_c = torch.arange(nc)[None] < torch.tensor([[12], [25]])
    mask_t = torch.arange(nt)[None] < torch.tensor([[20], [31]])

    model = GPBaseline(dim_x=1, dim_y=1, fit_steps=30)
    both = model(xc, yc, xt, mask_c, mask_t)
    a, b = model(xa, ya, ta), model(xb, yb, tb)
    torch.testing.assert_close(both.loc[0, :20], a.loc[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(both.scale[0, :20], a.scale[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(both.loc[1], b.loc[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(both.scale[1], b.scale[0], atol=1e-4, rtol=0)
    # Padded targets: finite placeholders.
    assert torch.isfinite(both.loc).all() and (both.scale > 0).all()


def test_translation_equivariance() -> None:
    gen = torch.Generator().manual_seed(2)
    xc, yc, xt = _task(gen, 2, 20, 15)
    model = GPBaseline(dim_x=1, dim_y=1, fit_steps=50)
    assert model.translation_equivariant
    d0 = model(xc, yc, xt)
    d1 = model(xc + 5.0, yc, xt + 5.0)
    tol = 1e-3 * float(yc.std())
    torch.testing.assert_close(d1.loc, d0.loc, atol=tol, rtol=0)
    torch.testing.assert_close(d1.scale, d0.scale, atol=tol, rtol=1e-3)


def test_no_grad_and_no_trainable_parameters() -> None:
    gen = torch.Generator().manual_seed(3)
    xc, yc, xt = _task(gen, 2, 15, 10)
    model = GPBaseline(dim_x=1, dim_y=1, fit_steps=20)
    assert not model.trainable
    with torch.no_grad():
        d = model(xc, yc, xt)
    assert list(model.parameters()) == [] and len(model.state_dict()) == 0
    assert not d.loc.requires_grad
    # Deterministic, and the same with autograd on.
    d2 = model(xc, yc, xt)
    torch.testing.assert_close(d.loc, d2.loc, atol=0, rtol=0)
    torch.testing.assert_close(d.scale, d2.scale, atol=0, rtol=0)


def test_multi_output_shape_and_degenerate_contexts() -> None:
    gen = torch.Generator().manual_seed(4)
    xc, yc, xt = _task(gen, 3, 10, 7, dy=2)
    xc2 = torch.cat([xc, xc + 1.0], -1)  # Dx = 2 exercises the ARD lengthscales
    xt2 = torch.cat([xt, xt - 1.0], -1)
    model = GPBaseline(dim_x=2, dim_y=2, fit_steps=10)
    d = model(xc2, yc, xt2)
    assert d.loc.shape == d.scale.shape == (3, 7, 2)

    # Task 0: a single context point; task 1: constant y (std 0); task 2: normal.
    mask_c = torch.ones(3, 10, dtype=torch.bool)
    mask_c[0, 1:] = False
    yc = yc.clone()
    yc[1] = 3.0
    d = model(xc2, yc, xt2, mask_c)
    assert torch.isfinite(d.loc).all() and torch.isfinite(d.scale).all() and (d.scale > 0).all()
    assert math.isclose(float(d.loc[1].mean()), 3.0, abs_tol=1e-2)


def test_registered() -> None:
    assert GPBaseline.registry_name == "gp"


def test_max_context_fits_on_the_nearest_points() -> None:
    """With a cap, the GP equals the uncapped GP given only the ``max_context`` points nearest the targets."""
    gen = torch.Generator().manual_seed(5)
    xc, yc, _ = _task(gen, 1, 40, 1)
    xt = torch.tensor([[[1.5], [1.7]]])
    capped = GPBaseline(dim_x=1, dim_y=1, fit_steps=20, max_context=10)(xc, yc, xt)
    near = torch.argsort((xc[0, :, 0] - 1.6).abs())[:12]  # the 10 nearest to a target are among these
    dist = torch.minimum((xc[0, :, 0] - 1.5).abs(), (xc[0, :, 0] - 1.7).abs())
    keep = torch.sort(torch.argsort(dist)[:10]).values
    assert set(keep.tolist()) <= set(near.tolist())
    ref = GPBaseline(dim_x=1, dim_y=1, fit_steps=20)(xc[:, keep], yc[:, keep], xt)
    torch.testing.assert_close(capped.loc, ref.loc, atol=0, rtol=0)
    torch.testing.assert_close(capped.scale, ref.scale, atol=0, rtol=0)
    everything = GPBaseline(dim_x=1, dim_y=1, fit_steps=20)(xc, yc, xt)
    assert not torch.equal(everything.loc, capped.loc)


def test_presets_cap_the_context() -> None:
    from geonp.models import build

    assert build("gp", 3, 1, preset="small").max_context == 256
    assert build("gp", 3, 1).max_context is None
    for bad in (0, 2.5, True):
        try:
            GPBaseline(dim_x=1, dim_y=1, max_context=bad)
        except ValueError as err:
            assert "max_context" in str(err)
        else:
            raise AssertionError(f"max_context={bad!r} accepted")
