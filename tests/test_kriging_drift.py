"""Kriging with external drift in te-pt-tnp's local kriging head (``kriging={"covariates": P}``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geonp.models import build
from geonp.models import local_kriging as lk
from geonp.models.local_attention import nearest_neighbours
from geonp.models.local_kriging import INIT_LENGTHSCALES, INIT_NUGGET, INIT_SILL, LocalKriging


def scene(n_c: int = 40, n_t: int = 6, seed: int = 0):
    """Locations, a rough covariate, and a field that is an affine function of it plus a smooth part."""
    g = torch.Generator().manual_seed(seed)
    xc, xt = torch.rand(1, n_c, 2, generator=g) * 3, torch.rand(1, n_t, 2, generator=g) * 3
    dc, dt = torch.randn(1, n_c, 1, generator=g), torch.randn(1, n_t, 1, generator=g)
    smooth = lambda x: 0.3 * torch.sin(x[..., :1]) * torch.cos(x[..., 1:])  # noqa: E731
    return xc, xt, dc, dt, 3.0 + 2.0 * dc + smooth(xc), 3.0 + 2.0 * dt + smooth(xt)


def reference_ked(xc, yc, dc, xt, dt) -> tuple[np.ndarray, np.ndarray]:
    """Universal kriging with external drift by the bordered system, exponential covariance at the
    head's initial parameters (nugget plus jitter on the diagonal only)."""
    xc, yc, dc, xt, dt = (a[0].double().numpy() for a in (xc, yc, dc, xt, dt))
    ell, sill, nugget = INIT_LENGTHSCALES["exponential"], INIT_SILL, INIT_NUGGET + 1e-4
    cov = lambda a, b: sill * np.exp(-np.linalg.norm(a[:, None] - b[None], axis=-1) / ell)  # noqa: E731
    n = len(xc)
    big = np.zeros((n + 2, n + 2))
    big[:n, :n] = cov(xc, xc) + nugget * np.eye(n)
    big[:n, n], big[n, :n] = 1.0, 1.0
    big[:n, n + 1], big[n + 1, :n] = dc[:, 0], dc[:, 0]
    means, variances = [], []
    for x, d in zip(xt, dt):
        rhs = np.concatenate([cov(x[None], xc)[0], [1.0, d[0]]])
        sol = np.linalg.solve(big, rhs)
        means.append(sol[:n] @ yc[:, 0])
        variances.append(sill + nugget - sol @ rhs)
    return np.array(means), np.array(variances)


def head_prediction(xc, yc, dc, xt, dt, k=None, ridge=lk.DRIFT_RIDGE):
    head = LocalKriging(8, 2, "exponential")
    head.drift_ridge = ridge
    index, valid = nearest_neighbours(xt, xc, torch.ones(1, xc.shape[1], dtype=torch.bool), k or xc.shape[1])
    with torch.no_grad():
        return head(torch.zeros(1, xt.shape[1], 8), xt, xc, yc, index, valid,
                    dt if dc is not None else None, dc)


def test_the_head_is_universal_kriging_with_external_drift():
    xc, xt, dc, dt, yc, _ = scene()
    mean, logvar = head_prediction(xc, yc, dc, xt, dt, ridge=0.0)  # the textbook system has no ridge
    ref_mean, ref_var = reference_ked(xc, yc, dc, xt, dt)
    np.testing.assert_allclose(mean[0, :, 0].numpy(), ref_mean, atol=2e-4)
    np.testing.assert_allclose(logvar[0, :, 0].exp().numpy(), ref_var, rtol=2e-3, atol=1e-4)


def test_a_field_the_covariate_explains_is_recovered_and_ordinary_kriging_misses_it():
    xc, xt, dc, dt, yc, yt = scene()
    drift, _ = head_prediction(xc, yc, dc, xt, dt)
    plain, _ = head_prediction(xc, yc, None, xt, dt)
    err_drift = (drift - yt).abs().max().item()
    err_plain = (plain - yt).abs().max().item()
    assert err_drift < 0.15 and err_plain > 10 * err_drift  # the smooth part (0.3) is kriged, not drift


def test_a_flat_covariate_changes_nothing():
    xc, xt, _, _, yc, _ = scene()
    flat_c, flat_t = torch.full((1, xc.shape[1], 1), 4.0), torch.full((1, xt.shape[1], 1), 4.0)
    drift = head_prediction(xc, yc, flat_c, xt, flat_t, k=16)
    plain = head_prediction(xc, yc, None, xt, flat_t, k=16)
    torch.testing.assert_close(drift[0], plain[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(drift[1], plain[1], atol=1e-3, rtol=1e-3)


def drift_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 4},
                 kriging={"neighbours": 8, "covariates": 1}).eval()


def test_covariates_add_no_weight_and_keep_the_model_equivariant():
    plain = build("te-pt-tnp", 2, 1, preset="tiny", local_attention={"neighbours": 4}, kriging={"neighbours": 8})
    model = drift_model()
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    xc, xt, dc, dt, yc, _ = scene(n_c=30, n_t=7)
    base = model(torch.cat([xc, dc], -1), yc, torch.cat([xt, dt], -1))
    shift = torch.tensor([0.7, -1.3, 5.0])  # locations moved, the covariate offset by a constant
    moved = model(torch.cat([xc, dc], -1) + shift, yc, torch.cat([xt, dt], -1) + shift)
    torch.testing.assert_close(base.loc, moved.loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(base.scale, moved.scale, atol=1e-4, rtol=1e-4)
    # The same weights without the covariate are the ordinary-kriging model, which a flat covariate equals.
    plain.load_state_dict(model.state_dict())
    flat = model(torch.cat([xc, torch.zeros_like(dc)], -1), yc, torch.cat([xt, torch.zeros_like(dt)], -1))
    torch.testing.assert_close(flat.loc, plain.eval()(xc, yc, xt).loc, atol=1e-4, rtol=1e-4)


def test_covariates_leave_the_model_a_location():
    with pytest.raises(ValueError, match="kriging covariates must be in 0..2, got 3"):
        build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 4}, kriging={"covariates": 3})


# -- the slopes' prior (kriging slope_prior) ----------------------------------------------------------

def prior_prediction(prior: str | float, xc, yc, dc, xt, dt, k: int = 16):
    head = LocalKriging(8, 2, "exponential", slope_prior=prior)
    index, valid = nearest_neighbours(xt, xc, torch.ones(1, xc.shape[1], dtype=torch.bool), k)
    with torch.no_grad():
        return head(torch.zeros(1, xt.shape[1], 8), xt, xc, yc, index, valid, dt, dc)


def test_a_strong_prior_gives_every_target_the_window_slope_and_none_its_own():
    """With a prior far stronger than any target's data, the head is ordinary kriging of
    ``y - d . c`` plus ``d_* . c``, ``c`` the precision-weighted mean of the targets' own slopes."""
    xc, xt, dc, dt, yc, _ = scene(n_c=60, n_t=9, seed=2)
    yc = yc + 0.5 * torch.randn(yc.shape, generator=torch.Generator().manual_seed(3)) * dc  # slopes vary
    head = LocalKriging(8, 2, "exponential", slope_prior=1e7)
    index, valid = nearest_neighbours(xt, xc, torch.ones(1, xc.shape[1], dtype=torch.bool), 16)
    with torch.no_grad():
        zt = torch.zeros(1, xt.shape[1], 8)
        parts = head._sliced(zt, xt, xc, yc, index, valid, dt, dc)
        _, centre = head._slope_prior(parts, None)  # [1, P, Dy]
        strong, _ = head(zt, xt, xc, yc, index, valid, dt, dc)
    plain, _ = head_prediction(xc, yc - dc @ centre, None, xt, dt, k=16)
    torch.testing.assert_close(strong, plain + dt @ centre, atol=2e-3, rtol=0)
    weak, _ = prior_prediction("none", xc, yc, dc, xt, dt)  # no prior: each target's own slope
    assert (strong - weak).abs().max() > 0.05


def empirical(relation, seed: int = 0, n_c: int = 300, n_t: int = 120):
    """Targets and context over a 6 x 6 field whose relation to the covariate is ``relation(x)``
    (a slope per place), plus white noise: the empirical-Bayes prior against each target alone."""
    g = torch.Generator().manual_seed(seed)
    xc, xt = torch.rand(1, n_c, 2, generator=g) * 6, torch.rand(1, n_t, 2, generator=g) * 6
    dc, dt = torch.randn(1, n_c, 1, generator=g), torch.randn(1, n_t, 1, generator=g)
    yc = relation(xc) * dc + 0.3 * torch.randn(1, n_c, 1, generator=g)
    yt = relation(xt) * dt
    return [((prior_prediction(p, xc, yc, dc, xt, dt)[0] - yt) ** 2).mean().sqrt().item()
            for p in ("empirical", "none")]


def test_empirical_bayes_pools_a_relation_that_holds_everywhere_and_keeps_one_that_changes():
    # One slope everywhere: pooling it beats 16 noisy neighbours' own estimate.
    eb, own = empirical(lambda x: torch.full_like(x[..., :1], 2.0))
    assert eb < 0.93 * own
    # The slope changes sign across the field (a front): the prior stands back, as good as each target's own.
    eb, own = empirical(lambda x: torch.where(x[..., :1] < 3, 2.0, -2.0))
    assert eb < 1.01 * own


def test_the_prior_keeps_a_padded_batch_equal_to_its_tasks_one_by_one():
    torch.manual_seed(0)
    model = build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 4},
                  kriging={"neighbours": 8, "covariates": 1, "slope_prior": "empirical"}).eval()
    tasks = [scene(n_c=n_c, n_t=n_t, seed=s) for s, (n_c, n_t) in enumerate([(30, 7), (22, 4)])]
    inputs = [(torch.cat([xc, dc], -1), yc, torch.cat([xt, dt], -1)) for xc, xt, dc, dt, yc, _ in tasks]
    xc = torch.zeros(2, 30, 3)
    yc = torch.zeros(2, 30, 1)
    xt = torch.zeros(2, 7, 3)
    mask_c, mask_t = torch.zeros(2, 30, dtype=torch.bool), torch.zeros(2, 7, dtype=torch.bool)
    for i, (c, y, t) in enumerate(inputs):
        xc[i, :c.shape[1]], yc[i, :c.shape[1]], xt[i, :t.shape[1]] = c[0], y[0], t[0]
        mask_c[i, :c.shape[1]], mask_t[i, :t.shape[1]] = True, True
    xc[1, 22:], yc[1, 22:], xt[1, 4:] = 50.0, -50.0, 50.0  # padding holding anything
    with torch.no_grad():
        batch = model(xc, yc, xt, mask_c, mask_t)
        for i, (c, y, t) in enumerate(inputs):
            one = model(c, y, t)
            torch.testing.assert_close(batch.loc[i, :t.shape[1]], one.loc[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(batch.scale[i, :t.shape[1]], one.scale[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad", ["strong", 0.0, -1.0, float("nan"), True])
def test_an_unknown_slope_prior_is_refused_at_build_time(bad):
    with pytest.raises(ValueError, match="kriging slope prior must be one of none, empirical or a positive number"):
        LocalKriging(8, 2, slope_prior=bad)


def test_targets_on_a_flat_covariate_take_no_part_in_the_prior():
    """Where a history map holds one value (the field's mean where a cell has no other steps), a
    target's slope is unknown, not zero-variance evidence: it must not make the window pool."""
    g = torch.Generator().manual_seed(5)
    relation = lambda x: torch.where(x[..., :1] < 3, 2.0, -2.0)  # noqa: E731 - a front: no pooling wanted
    xc, xt = torch.rand(1, 300, 2, generator=g) * 6, torch.rand(1, 120, 2, generator=g) * 6
    dc, dt = torch.randn(1, 300, 1, generator=g), torch.randn(1, 120, 1, generator=g)
    corner_c = torch.rand(1, 40, 2, generator=g) * 0.5 + 5.5  # a patch whose covariate is flat
    xc, dc = torch.cat([xc, corner_c], 1), torch.cat([dc, torch.zeros(1, 40, 1)], 1)
    dc[(xc > 5.5).all(-1)] = 0.5  # every context point in the patch
    xt[0, :2], dt[0, :2] = torch.tensor([[5.7, 5.7], [5.8, 5.6]]), 0.5
    yc = relation(xc) * dc + 0.3 * torch.randn(1, xc.shape[1], 1, generator=g)
    yt = relation(xt) * dt
    eb, own = [((prior_prediction(p, xc, yc, dc, xt, dt)[0] - yt) ** 2).mean().sqrt().item()
               for p in ("empirical", "none")]
    assert eb < 1.01 * own, (eb, own)


def test_a_flat_second_covariate_leaves_the_empirical_prior_as_with_one():
    xc, xt, dc, dt, yc, _ = scene(n_c=80, n_t=12, seed=6)
    one = prior_prediction("empirical", xc, yc, dc, xt, dt)
    two = prior_prediction("empirical", xc, yc, torch.cat([dc, torch.full_like(dc, 3.0)], -1), xt,
                           torch.cat([dt, torch.full_like(dt, 3.0)], -1))
    torch.testing.assert_close(two[0], one[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(two[1], one[1], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("seed", range(8))
def test_a_target_off_its_neighbours_one_covariate_value_is_kriged_as_without_a_prior(seed):
    """Every neighbour on one covariate value, the target on another: the slope is collinear with
    the intercept and says nothing (no singular system, no slope from float32 rounding); alone in
    its window the empirical prior pools nothing and predicts as no prior does, which is ordinary
    kriging (it once gave |mean| 95)."""
    xc, xt, dc, dt, yc, _ = scene(n_c=40, n_t=1, seed=seed)
    dc, dt = torch.full_like(dc, 0.5), torch.full_like(dt, 0.6 + 0.1 * seed)
    eb = prior_prediction("empirical", xc, yc, dc, xt, dt)
    own = prior_prediction("none", xc, yc, dc, xt, dt)
    plain = head_prediction(xc, yc, None, xt, None, k=16)
    torch.testing.assert_close(eb[0], own[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(eb[0], plain[0], atol=2e-2, rtol=0)


@pytest.mark.parametrize("bf16", [False, True])
def test_a_collinear_target_does_not_count_towards_a_windows_prior(bf16):
    """One target that can estimate a slope and one whose neighbours all sit on one covariate value
    (its raw entry of F^T K^-1 F large, its information on the slope none): fewer than two take
    part, so the window gets no prior and both are kriged as with "none", under bf16 autocast
    (training on a GPU) as well."""
    g = torch.Generator().manual_seed(11)
    xc, dc = torch.rand(1, 300, 2, generator=g) * 6, torch.randn(1, 300, 1, generator=g)
    patch = torch.rand(1, 40, 2, generator=g) * 0.6 + 7.0  # beyond the field: 16 neighbours all in it
    xc, dc = torch.cat([xc, patch], 1), torch.cat([dc, torch.full((1, 40, 1), 0.5)], 1)
    yc = 2.0 * dc + 0.3 * torch.randn(1, xc.shape[1], 1, generator=g)
    xt, dt = torch.tensor([[[3.0, 3.0], [7.3, 7.3]]]), torch.tensor([[[0.2], [2.5]]])
    index, valid = nearest_neighbours(xt, xc, torch.ones(1, xc.shape[1], dtype=torch.bool), 16)
    heads = {p: LocalKriging(8, 2, "exponential", slope_prior=p) for p in ("empirical", "none")}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        parts = heads["empirical"]._sliced(torch.zeros(1, 2, 8), xt, xc, yc, index, valid, dt, dc)
        precision, centre = heads["empirical"]._slope_prior(parts, None)
        eb, own = (heads[p](torch.zeros(1, 2, 8), xt, xc, yc, index, valid, dt, dc)[0] for p in heads)
    assert precision.abs().max().item() == 0 and centre.abs().max().item() == 0
    torch.testing.assert_close(eb, own, atol=1e-5, rtol=0)
