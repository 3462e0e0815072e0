"""The local kriging head's solver: robust to covariances float rounding leaves not quite positive definite."""

import pytest
import torch

from geonp.models import cpu_build, kriging_linalg
from geonp.models.kriging_linalg import robust_cholesky, spd_solve


def test_spd_solve_jitters_a_matrix_rounding_left_not_positive_definite():
    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    bad = torch.tensor([[1.0, 1.0], [1.0, 1.0 - 1e-7]])  # two identical neighbours, no nugget
    k = torch.stack([good, bad])  # [2, 2, 2]
    chol = robust_cholesky(k)
    torch.testing.assert_close(chol[0], torch.linalg.cholesky(good))  # untouched
    assert torch.isfinite(chol).all() and (chol[1].diagonal() > 0).all()
    x = spd_solve(k, torch.ones(2, 2, 1))
    assert torch.isfinite(x).all()
    with pytest.raises(torch.linalg.LinAlgError, match="not positive definite"):
        robust_cholesky(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))


needs_spd_kernel = pytest.mark.skipif(not cpu_build.can_build(), reason="no C++ compiler or ninja to build the kernel")


def spd_batch(s: int, n: int, seed: int = 0) -> torch.Tensor:
    """``[s, n, n]`` kriging-like covariances: exponential correlation of random points plus a nugget."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(s, n, 2, generator=g) * 10
    return torch.exp(-torch.cdist(x, x) / 3) + 0.01 * torch.eye(n)


@needs_spd_kernel
@pytest.mark.parametrize("s, n, m", [(1, 1, 1), (7, 5, 2), (17, 13, 5), (9, 64, 5)])
def test_the_spd_kernel_solves_as_float64_cholesky_does(s, n, m):
    """Eight systems to a vector, so batches that leave a group part-filled are included."""
    k = spd_batch(s, n)
    r = torch.randn(s, n, m, generator=torch.Generator().manual_seed(1))
    x, info, packed = cpu_build.kernel("spd").factor_solve(k, r, True)
    truth = torch.cholesky_solve(r.double(), torch.linalg.cholesky(k.double()))
    assert not info.any()
    assert float((x.double() - truth).norm() / truth.norm()) < 1e-5
    again = cpu_build.kernel("spd").factor_substitute(packed, r)  # the backward pass's solve
    torch.testing.assert_close(again, x, rtol=0, atol=0)


@needs_spd_kernel
def test_the_spd_kernel_names_the_system_that_is_not_positive_definite():
    k = spd_batch(10, 6)
    k[3, 2, 2] = -1.0
    info = cpu_build.kernel("spd").factor_solve(k, torch.ones(10, 6, 1), False)[1]
    assert info.tolist() == [0, 0, 0, 3, 0, 0, 0, 0, 0, 0]  # LAPACK's convention: the 1-based row


@needs_spd_kernel
def test_spd_solve_runs_on_the_kernel_in_float32_with_autograd_s_gradients(monkeypatch):
    """The kernel's forward and backward against autograd through float64 Cholesky; torch's
    factor is never called (the kernel is in use)."""
    def refuse(*args):
        raise AssertionError("the torch path ran")

    monkeypatch.setattr(kriging_linalg, "robust_cholesky", refuse)
    k = spd_batch(4, 20)[None].requires_grad_()  # [1, 4, 20, 20]: each matrix for three right-hand sides
    r = torch.randn(3, 4, 20, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
    g = torch.randn(3, 4, 20, 3, generator=torch.Generator().manual_seed(3))
    sym = lambda m: 0.5 * (m + m.transpose(-1, -2))  # noqa: E731 - gradients of a symmetric K compared
    ours = torch.autograd.grad(spd_solve(sym(k), r), (k, r), g)
    assert ours[0].shape == k.shape  # summed over the broadcast
    k64, r64 = k.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    theirs = torch.autograd.grad(torch.cholesky_solve(r64, torch.linalg.cholesky(sym(k64))), (k64, r64), g.double())
    for x, y in zip(ours, theirs):
        assert float((x.double() - y).norm() / y.norm()) < 1e-4


needs_covariance_kernel = pytest.mark.skipif(not cpu_build.can_build(),
                                             reason="no C++ compiler or ninja to build the kernel")


@needs_covariance_kernel
@pytest.mark.parametrize("kernel", ["gaussian", "exponential", "matern32"])
@pytest.mark.parametrize("k", [13, 64])
def test_the_covariance_kernel_builds_and_differentiates_as_float64_autograd(kernel, k):
    """The kriging head's neighbour covariances on the compiled kernel (float32): the matrices and
    their gradients against autograd through the plain chain of steps in float64, absent
    neighbours included, a neighbour count that is not a multiple of the kernel's eight lanes and a
    sill broadcast over the tasks too."""
    from geonp.models.kriging_linalg import JITTER, NeighbourCovariance, correlation

    g = torch.Generator().manual_seed(4)
    ok = (torch.rand(2, 9, k, generator=g) > 0.2).float()
    scaled = torch.randn(2, 9, k, 3, generator=g) * ok[..., None]
    # sill [1, 9] broadcast over the tasks, as a head's parameters for a batch can be
    sill, nugget = torch.rand(1, 9, generator=g) + 0.5, torch.rand(2, 9, generator=g) * 0.1
    grad = torch.randn(2, 9, k, k, generator=g)

    def plain(scaled, sill, nugget):
        diff = scaled[..., :, None, :] - scaled[..., None, :, :]
        pair = ok.double()[..., :, None] * ok.double()[..., None, :]
        cov = sill[..., None, None] * correlation(diff.square().sum(-1), kernel) * pair
        return cov + torch.diag_embed((nugget[..., None] + JITTER) * ok.double() + (1 - ok.double()))

    assert kriging_linalg._covariance_kernel(scaled, sill, nugget, ok) is not None  # float32 runs compiled
    ours_in = [t.clone().requires_grad_() for t in (scaled, sill, nugget)]
    ours = NeighbourCovariance.apply(*ours_in, ok, kernel)
    ours_grads = torch.autograd.grad(ours, ours_in, grad)
    theirs_in = [t.double().requires_grad_() for t in (scaled, sill, nugget)]
    theirs = plain(*theirs_in)
    theirs_grads = torch.autograd.grad(theirs, theirs_in, grad.double())
    assert float((ours.double() - theirs).abs().max()) < 1e-5
    for x, y in zip(ours_grads, theirs_grads):
        assert float((x.double() - y).norm() / y.norm()) < 1e-5


@pytest.mark.parametrize("drift, prior", [(False, "none"), (True, "none"), (True, "empirical")])
def test_the_head_solves_the_real_targets_alone_as_each_window_alone(drift, prior):
    """``mask_t`` with padding: the head packs the real targets of every window into one task (keys
    of all windows, indices shifted) and solves only theirs, each window's slope prior pooled over
    its own real targets; their mean, log variance and the gradients of a loss on them match those
    of each window alone without padding (rounding only), a window without real targets beside
    them, and padding rows hold finite copies."""
    from geonp.models.local_attention import nearest_neighbours
    from geonp.models.local_kriging import LocalKriging

    g = torch.Generator().manual_seed(3)
    xc, xt = torch.rand(4, 25, 2, generator=g) * 5, torch.rand(4, 9, 2, generator=g) * 5
    drift_c, drift_t = (xc[..., :1].cos(), xt[..., :1].cos()) if drift else (None, None)
    yc = torch.sin(xc.sum(-1, keepdim=True))
    if drift:  # each window its own relation to the covariate, so each pools its own prior
        yc = yc + torch.tensor([0.5, -1.0, 2.0, 1.0])[:, None, None] * drift_c
    mask_c = torch.ones(4, 25, dtype=torch.bool)
    mask_c[0, 18:] = False
    mask_t = torch.rand(4, 9, generator=g) < 0.7
    mask_t[1] = False  # a window with no real target
    index, valid = nearest_neighbours(xt, xc, mask_c, 8)
    torch.manual_seed(0)
    head = LocalKriging(8, 2, "exponential", slope_prior=prior)
    with torch.no_grad():
        head.covariance[-1].weight.normal_(std=0.3)
    zt = torch.randn(4, 9, 8)

    def run(windows):
        z = zt.clone().requires_grad_()
        head.zero_grad()
        outs = []
        for b, real in windows:  # one call per entry: (window slice, target selection)
            args = [z[b][:, real], xt[b][:, real], xc[b], yc[b], index[b][:, real], valid[b][:, real]]
            args += [None, None] if not drift else [drift_t[b][:, real], drift_c[b]]
            mean, log_var = head(*args, mask_t[b][:, real] if real is Ellipsis else None)
            assert torch.isfinite(mean).all() and torch.isfinite(log_var).all()
            keep = mask_t[b][:, real]
            outs.append((mean[keep], log_var[keep]))
        mean, log_var = (torch.cat(o) for o in zip(*outs))
        (mean.square().sum() + log_var.sum()).backward()
        return [mean, log_var, z.grad] + [p.grad.clone() for p in head.parameters()]

    alone = run([(slice(b, b + 1), mask_t[b]) for b in range(4) if mask_t[b].any()])
    batched = run([(slice(None), ...)])
    for a, b in zip(alone, batched):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
