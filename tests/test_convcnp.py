"""ConvCNP properties: exact equivariance for whole grid-step shifts, the gridded fast path
against the off-grid path, padding, covariates, chunking, truncation, training, save/load.

Tolerances (float32, ``atol = rtol = 1e-5`` unless said): whole grid-step shifts measured at
most 4e-7; the gridded path against the off-grid path measured at most 9e-6 absolute on
outputs of magnitude up to ~10 (~1e-6 relative); a half-step shift, which the model only
approximates, must change predictions by more than 1e-4 and at most 0.15 (measured 0.02-0.11
on outputs of spread 0.16-0.31, untrained weights).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import random_tasks
from torch import nn

from geonp.models import build, load, save
from geonp.models.setconv import _window, task_grids, window_radius

EXACT = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")


def lively(model):
    """Re-draw weights He-style so untrained outputs vary O(1) (default init makes them ~flat)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / mod.weight[0].numel()) ** 0.5)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
    return model.eval()


def convcnp(dx: int = 1, dy: int = 1, **kwargs):
    torch.manual_seed(0)
    return lively(build("convcnp", dx, dy, preset="tiny", **kwargs))


def predict(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


def assert_same(a, b, **tol):
    torch.testing.assert_close(a.loc, b.loc, **(tol or EXACT))
    torch.testing.assert_close(a.scale, b.scale, **(tol or EXACT))


@pytest.mark.parametrize("dx", [1, 2])
def test_whole_grid_step_shifts_are_exactly_equivariant(dx):
    model = convcnp(dx)  # 16 points per unit: one grid step is 1/16
    xc, yc, xt, mask_c = random_tasks(dx=dx)
    base = predict(model, xc, yc, xt, mask_c)
    assert base.loc.std() > 0.1  # predictions vary, so equality below means something
    for steps in ([3, -2], [1, 1], [-7, 5], [40, -33]):  # odd steps too: pooling blocks move with the data
        tau = torch.tensor(steps[:dx]) / 16.0
        assert_same(base, predict(model, xc + tau, yc, xt + tau, mask_c))


@pytest.mark.parametrize("dx", [1, 2])
def test_half_step_shifts_are_only_approximately_equivariant(dx):
    model = convcnp(dx)
    xc, yc, xt, mask_c = random_tasks(dx=dx)
    base = predict(model, xc, yc, xt, mask_c)
    shifted = predict(model, xc + 0.5 / 16, yc, xt + 0.5 / 16, mask_c)
    diff = max((base.loc - shifted.loc).abs().max(), (base.scale - shifted.scale).abs().max())
    assert 1e-4 < diff < 0.15


def grid_task(shape, ppu, origin, dy=1, cov=0, b=2, seed=1):
    """Data on cells ``(origin + i) / ppu``: gridded tensors and the equivalent point sets."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(b, *shape, dy, generator=g)
    mask = torch.rand(b, *shape, generator=g) < 0.35
    y[~mask] = float("nan")  # unobserved cells may hold anything
    covariates = torch.randn(b, *shape, cov, generator=g)
    axes = [(torch.arange(n) + o) / p for n, o, p in zip(shape, origin, ppu)]
    cells = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))  # [G, D]
    x = torch.cat([cells.expand(b, -1, -1), covariates.reshape(b, cells.shape[0], cov)], -1)  # [B, G, Dx]
    return y, mask, covariates, x, y.reshape(b, -1, dy), mask.reshape(b, -1)


@pytest.mark.parametrize("case", [
    {"shape": (9, 14), "ppu": (16.0, 16.0), "origin": (3, -21), "kwargs": {}},
    {"shape": (7, 6), "ppu": (10.0, 10.0), "origin": (-4, 5), "kwargs": {"points_per_unit": 10.0}},
    {"shape": (3, 6, 7), "ppu": (1.0, 4.0, 4.0), "origin": (2, -3, 1), "cov": 1,
     "kwargs": {"points_per_unit": (1, 4, 4), "downsample": (False, True, True), "lengthscale_init": (1, 2, 2)}},
], ids=["2d", "2d-ppu10", "3d-covariate"])
def test_gridded_path_matches_off_grid_path(case):
    cov = case.get("cov", 0)
    dims = len(case["shape"])
    model = convcnp(dims + cov, 2, **case["kwargs"])
    y, mask, covariates, x, yflat, mflat = grid_task(case["shape"], case["ppu"], case["origin"], dy=2, cov=cov)
    gridded = model.predict_gridded(y, mask, covariates if cov else None)
    assert gridded.loc.shape == (2, *case["shape"], 2)
    off_grid = predict(model, x, yflat, x, mflat)  # context = observed cells (others masked), targets = all
    assert off_grid.loc.std() > 0.1
    torch.testing.assert_close(gridded.loc.reshape(off_grid.loc.shape), off_grid.loc, **EXACT)
    torch.testing.assert_close(gridded.scale.reshape(off_grid.scale.shape), off_grid.scale, **EXACT)


def test_gridded_path_checks_its_inputs():
    model = convcnp(4, 1, points_per_unit=(1, 4, 4))
    y, mask, covariates, *_ = grid_task((2, 4, 4), (1, 4, 4), (0, 0, 0), cov=1)
    with pytest.raises(ValueError, match="covariates"):
        model.predict_gridded(y, mask)
    with pytest.raises(ValueError, match="empty context"):
        model.predict_gridded(y, torch.zeros_like(mask), covariates)
    with pytest.raises(ValueError, match="mask"):
        model.predict_gridded(y, mask.float(), covariates)


def test_padded_batch_with_different_extents_equals_tasks_one_by_one():
    model = convcnp(2, 2)
    xc, yc, xt, mask_c = random_tasks(b=3, nc=15, nt=11, dx=2, dy=2)
    xc[1] = xc[1] * 3 + 5  # a task far away and three times wider: its own grid
    xt[1] = xt[1] * 3 + 5
    mask_t = torch.ones(xt.shape[:2], dtype=torch.bool)
    mask_t[2, 4:] = False
    xt[2, 4:] = float("nan")
    batched = predict(model, xc, yc, xt, mask_c, mask_t)
    for i in range(3):
        mc, mt = mask_c[i], mask_t[i]
        single = predict(model, xc[i, mc][None], yc[i, mc][None], xt[i, mt][None])
        torch.testing.assert_close(batched.loc[i, mt], single.loc[0], **EXACT)
        torch.testing.assert_close(batched.scale[i, mt], single.scale[0], **EXACT)


def test_covariate_beyond_the_grid_dims_changes_predictions():
    model = convcnp(4, 1, grid_dims=3, points_per_unit=(1, 4, 4), downsample=(False, True, True),
                    lengthscale_init=(1, 2, 2))
    assert model.grid_dims == 3 and model.num_covariates == 1
    g = torch.Generator().manual_seed(0)
    xc = torch.cat([torch.randint(0, 3, (2, 20, 1), generator=g).float(), torch.rand(2, 20, 2, generator=g) * 2,
                    torch.rand(2, 20, 1, generator=g)], -1)  # (time, row, col, elevation)
    yc, xt = torch.randn(2, 20, 1, generator=g), xc[:, :8].clone()
    base = predict(model, xc, yc, xt)
    higher_targets = xt.clone()
    higher_targets[..., 3] += 1.0
    higher_context = xc.clone()
    higher_context[..., 3] += 1.0
    assert (predict(model, xc, yc, higher_targets).loc - base.loc).abs().max() > 1e-3
    assert (predict(model, higher_context, yc, xt).loc - base.loc).abs().max() > 1e-3
    # Covariates are not gridded: shifting the grid dims by whole steps is still exact.
    tau = torch.tensor([2.0, 0.25, -0.5, 0.0])
    assert_same(base, predict(model, xc + tau, yc, xt + tau))
    model.train()
    model(xc, yc, xt).log_prob(torch.zeros(2, 8, 1)).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_target_chunks_give_the_same_answer_as_one_chunk():
    xc, yc, xt, mask_c = random_tasks(nc=12, nt=23, dx=2)
    whole = convcnp(2, target_chunk=4096)
    for chunks in ({"target_chunk": 5}, {"max_block_elems": 1}):  # 5 points per call; 1 point per call
        chunked = convcnp(2, **chunks)
        chunked.load_state_dict(whole.state_dict())
        assert_same(predict(whole, xc, yc, xt, mask_c), predict(chunked, xc, yc, xt, mask_c), atol=1e-6, rtol=1e-6)


def test_truncated_setconv_stays_within_the_stated_bound():
    """Dropped RBF terms weigh < exp(-cutoff^2 / 2) each (see geonp.models.setconv)."""
    cutoff, ell = 2.5, torch.tensor([1.7])  # a coarse cutoff, so the truncation is visible
    u = torch.rand(1, 30, 1) * 40
    mask = torch.ones(1, 30, dtype=torch.bool)
    radius = window_radius(ell, cutoff)
    origin, size, shape = task_grids([(u, mask)], [radius[0]], [1])
    index, weight = _window(u, mask, origin, shape, ell, radius, normalise=False)
    truncated = torch.zeros(shape[0]).index_add_(0, index.flatten(), weight.flatten())
    cells = origin[0, 0] + torch.arange(shape[0])
    full = torch.exp(-0.5 * ((cells[:, None] - u[0, :, 0]) / ell) ** 2).sum(1)
    error = (full - truncated).abs().max()
    assert 0 < error <= 30 * math.exp(-(cutoff**2) / 2)


def sine_tasks(b: int, g: torch.Generator):
    nc, nt = 20, 30
    x = torch.rand(b, nc + nt, 1, generator=g) * 4 - 2
    amp, freq, phase = 0.5 + torch.rand(b, 1, 1, generator=g), 1 + 2 * torch.rand(b, 1, 1, generator=g), \
        6.28 * torch.rand(b, 1, 1, generator=g)
    y = amp * torch.sin(freq * x + phase) + 0.05 * torch.randn(b, nc + nt, 1, generator=g)
    mask_c = torch.arange(nc)[None] < torch.randint(3, nc + 1, (b, 1), generator=g)
    return x[:, :nc], y[:, :nc], x[:, nc:], y[:, nc:], mask_c


def test_short_training_run_reduces_nll():
    torch.manual_seed(0)
    model = build("convcnp", 1, 1, preset="tiny")
    xc, yc, xt, yt, mask_c = sine_tasks(32, torch.Generator().manual_seed(99))  # held-out tasks

    def nll() -> float:
        return -predict(model, xc, yc, xt, mask_c).log_prob(yt).mean().item()

    start, g = nll(), torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        bxc, byc, bxt, byt, bmask = sine_tasks(16, g)
        loss = -model(bxc, byc, bxt, bmask).log_prob(byt).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert nll() < start - 0.5  # measured 1.15 -> 0.05


def test_save_load_round_trip_with_per_dimension_settings(tmp_path):
    model = convcnp(3, 1, grid_dims=2, points_per_unit=(16, 8), downsample=(True, False), kernel_size=(5, 3))
    xc, yc, xt, mask_c = random_tasks(dx=3)
    save(model, tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors").eval()  # the tuples come back as JSON lists
    assert again.points_per_unit == (16.0, 8.0) and again.multiple == [4, 1]
    a, b = predict(model, xc, yc, xt, mask_c), predict(again, xc, yc, xt, mask_c)
    assert torch.equal(a.loc, b.loc) and torch.equal(a.scale, b.scale)


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match="grid_dims"):
        build("convcnp", 4, 1, preset="tiny", grid_dims=4)
    with pytest.raises(ValueError, match="points_per_unit"):
        build("convcnp", 2, 1, preset="tiny", points_per_unit=(1, 2, 3))
    with pytest.raises(ValueError, match="odd"):
        build("convcnp", 1, 1, preset="tiny", kernel_size=4)


def test_far_targets_give_a_clear_error_not_an_out_of_memory():
    model = convcnp(2)
    xc, yc, xt, mask_c = random_tasks(dx=2)
    with pytest.raises(ValueError, match="max_grid_cells"):
        model(xc, yc, xt + 1e4, mask_c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(monkeypatch):
    # TF32 (on by default for cuDNN convolutions) rounds to ~1e-3; compare in full float32.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = convcnp(2, 2)
    xc, yc, xt, mask_c = random_tasks(dx=2, dy=2)
    cpu = predict(model, xc, yc, xt, mask_c)
    gpu = predict(model.cuda(), xc.cuda(), yc.cuda(), xt.cuda(), mask_c.cuda())
    torch.testing.assert_close(gpu.loc.cpu(), cpu.loc, atol=1e-4, rtol=1e-4)
    y, mask, _, x, yflat, mflat = grid_task((9, 14), (16, 16), (3, -21))
    gridded = model.predict_gridded(y.cuda().expand(-1, -1, -1, 2), mask.cuda())
    assert gridded.loc.is_cuda and torch.isfinite(gridded.loc).all()
