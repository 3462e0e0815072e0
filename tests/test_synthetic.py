"""Tests for the synthetic GP and sawtooth task generators."""

from __future__ import annotations

import math

import pytest
import torch

from geonp.tasks.batch import Batch
from geonp.tasks.synthetic import (
    KERNELS,
    GPTaskGenerator,
    SawtoothTaskGenerator,
    fixed_tasks,
    kernel_matrix,
    make_generator,
)

NAMES = ["gp", "gp-se", "gp-matern52", "gp-periodic", "sawtooth"]


def _same(a: Batch, b: Batch) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("xc", "yc", "xt", "yt", "mask_c", "mask_t"))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dim_x", [1, 2])
def test_shapes_masks_and_padding(name: str, dim_x: int) -> None:
    gen = make_generator(name, dim_x=dim_x, min_context=3, max_context=20, num_target=32)
    batch = gen.sample(16, torch.Generator().manual_seed(0))
    nc_max = batch.xc.shape[1]
    assert batch.xc.shape == (16, nc_max, dim_x) and batch.yc.shape == (16, nc_max, 1)
    assert batch.xt.shape == (16, 32, dim_x) and batch.yt.shape == (16, 32, 1)
    assert batch.mask_c.shape == (16, nc_max) and batch.mask_c.dtype == torch.bool
    assert batch.mask_t.shape == (16, 32) and bool(batch.mask_t.all())
    for t in (batch.xc, batch.yc, batch.xt, batch.yt):
        assert t.dtype == torch.float32 and bool(torch.isfinite(t).all())
    nc = batch.mask_c.sum(1)
    assert int(nc.min()) >= 3 and int(nc.max()) <= 20 and int(nc.max()) == nc_max
    # Present points form a prefix, and padding is exactly zero.
    assert torch.equal(batch.mask_c, torch.arange(nc_max)[None] < nc[:, None])
    pad = ~batch.mask_c
    assert bool((batch.xc[pad] == 0).all()) and bool((batch.yc[pad] == 0).all())
    assert bool((batch.yc[batch.mask_c] != 0).all())


def test_context_sizes_cover_range() -> None:
    batch = GPTaskGenerator(min_context=1, max_context=4, num_target=4).sample(200, 0)
    assert set(batch.mask_c.sum(1).tolist()) == {1, 2, 3, 4}


@pytest.mark.parametrize("name", NAMES)
def test_reproducible(name: str) -> None:
    gen = make_generator(name, max_context=16, num_target=16)
    a = gen.sample(8, torch.Generator().manual_seed(123))
    b = gen.sample(8, torch.Generator().manual_seed(123))
    c = gen.sample(8, torch.Generator().manual_seed(124))
    assert _same(a, b)
    assert not _same(a, c)
    assert _same(a, gen.sample(8, 123))  # int seed is equivalent to a fresh seeded generator
    g = torch.Generator().manual_seed(5)
    assert not _same(gen.sample(8, g), gen.sample(8, g))  # the stream advances


@pytest.mark.parametrize("shift", [0.0, 5.0, -7.5])
@pytest.mark.parametrize("name", ["gp", "sawtooth"])
def test_input_ranges_follow_shift(name: str, shift: float) -> None:
    gen = make_generator(name, dim_x=2, max_context=32, num_target=64, shift=shift)
    batch = gen.sample(32, 1)
    xc = batch.xc[batch.mask_c]
    assert float(xc.min()) >= shift - 2 and float(xc.max()) <= shift + 2
    assert float(batch.xt.min()) >= shift - 3 and float(batch.xt.max()) <= shift + 3
    # Targets really use the wider box (fails if both boxes were [-2, 2]).
    assert float(batch.xt.max()) > shift + 2.5 and float(batch.xt.min()) < shift - 2.5


def test_with_shift_returns_modified_copy() -> None:
    gen = GPTaskGenerator(max_context=8, num_target=8)
    moved = gen.with_shift(4.0)
    assert isinstance(moved, GPTaskGenerator) and moved.shift == 4.0 and gen.shift == 0.0
    assert moved.kernels == gen.kernels
    # Same seed: identical inputs up to the translation.
    a, b = gen.sample(4, 9), moved.sample(4, 9)
    assert torch.allclose(b.xt, a.xt + 4.0)
    assert torch.allclose(b.xc[b.mask_c], a.xc[a.mask_c] + 4.0)


@pytest.mark.parametrize("name", ["gp", "gp-se", "gp-matern52", "gp-periodic"])
def test_gp_marginal_variance(name: str) -> None:
    # Many small tasks so the estimate is not dominated by within-task correlation.
    gen = make_generator(name, min_context=4, max_context=4, num_target=12)
    batch = gen.sample(3000, 0)
    y = torch.cat([batch.yc.flatten(), batch.yt.flatten()])
    assert abs(float(y.mean())) < 0.06
    assert float(y.pow(2).mean()) == pytest.approx(1.0 + 0.2**2, abs=0.1)


def test_gp_noise_std_sets_variance() -> None:
    gen = make_generator("gp-se", noise_std=1.0, min_context=4, max_context=4, num_target=12)
    y = gen.sample(2000, 0).yt
    assert float(y.pow(2).mean()) == pytest.approx(2.0, abs=0.2)


def test_se_long_lengthscale_is_smoother() -> None:
    def roughness(lengthscale: float) -> float:
        gen = make_generator(
            "gp-se", lengthscale_range=(lengthscale, lengthscale), noise_std=0.01, max_context=4, num_target=64
        )
        batch = gen.sample(64, 3)
        order = batch.xt[..., 0].argsort(dim=1)
        y = batch.yt[..., 0].gather(1, order)
        return float((y[:, 1:] - y[:, :-1]).abs().mean())

    rough_short, rough_long = roughness(0.25), roughness(4.0)
    assert rough_long * 5 < rough_short


def test_gp_2d_nearby_points_correlated() -> None:
    gen = make_generator("gp-se", dim_x=2, lengthscale_range=(2.0, 2.0), max_context=4, num_target=32)
    batch = gen.sample(256, 4)
    x, y = batch.xt, batch.yt[..., 0]
    d = torch.cdist(x, x)
    near = (d < 0.3) & (d > 0)
    far = d > 4.0
    prod = y[:, :, None] * y[:, None, :]
    assert float(prod[near].mean()) > 0.8 and abs(float(prod[far].mean())) < 0.3


def test_kernel_matrix_properties() -> None:
    dist = torch.tensor([0.0, 0.5, 1.0, 3.0], dtype=torch.float64).reshape(1, 1, 4, 1)
    ls, period = torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    for name in KERNELS:
        k = kernel_matrix(name, dist, ls, period)[0, 0]
        assert float(k[0]) == pytest.approx(1.0)
        assert bool((k <= 1.0 + 1e-12).all()) and bool((k > 0).all())
    se = kernel_matrix("se", dist, ls)[0, 0]
    assert float(se[1]) == pytest.approx(math.exp(-0.125))
    m52 = kernel_matrix("matern52", dist, ls)[0, 0]
    r = math.sqrt(5.0)
    assert float(m52[2]) == pytest.approx((1 + r + 5 / 3) * math.exp(-r))
    per = kernel_matrix("periodic", dist, ls, period)[0, 0]
    assert float(per[2]) == pytest.approx(1.0) and float(per[3]) == pytest.approx(1.0)  # whole periods
    assert float(per[1]) == pytest.approx(math.exp(-2.0))
    with pytest.raises(ValueError, match="periodic"):
        kernel_matrix("periodic", dist, ls)


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_psd_in_2d(name: str) -> None:
    # Exp-sine-squared of the Euclidean distance is indefinite in 2-D; ours must not be.
    x = 6.0 * torch.rand(8, 60, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) - 3.0
    ls = torch.full((8,), 0.25, dtype=torch.float64)
    period = torch.linspace(0.5, 2.0, 8, dtype=torch.float64)
    k = kernel_matrix(name, x[:, :, None] - x[:, None], ls, period)
    assert torch.allclose(k, k.transpose(1, 2))
    assert float(torch.linalg.eigvalsh(k).min()) > -1e-8


def test_periodic_samples_repeat() -> None:
    # With period 1, y(x) and y(x + 1) should agree up to noise: targets shifted by exactly 1.
    gen = make_generator("gp-periodic", period_range=(1.0, 1.0), noise_std=1e-3, max_context=1, num_target=8)
    batch = gen.sample(4, 0)
    x = torch.cat([batch.xt, batch.xt + 1.0], dim=1)
    y = gen._draw_outputs(x, torch.Generator().manual_seed(0))[..., 0]
    assert torch.allclose(y[:, :8], y[:, 8:], atol=0.05)


def test_sawtooth_values_and_slope() -> None:
    gen = SawtoothTaskGenerator(noise_std=1e-6, max_context=8, num_target=128)
    batch = gen.sample(32, 0)
    y = torch.cat([batch.yc[batch.mask_c].flatten(), batch.yt.flatten()])
    assert float(y.min()) >= -0.5 - 1e-4 and float(y.max()) <= 0.5 + 1e-4
    # Between wraps the wave rises linearly with slope f in [3, 5].
    order = batch.xt[..., 0].argsort(dim=1)
    xs, ys = batch.xt[..., 0].gather(1, order), batch.yt[..., 0].gather(1, order)
    dx, dy = xs[:, 1:] - xs[:, :-1], ys[:, 1:] - ys[:, :-1]
    # dx < 1/f_max guarantees a pair with dy > 0 did not straddle a wrap.
    keep = (dy > 0) & (dx > 1e-3) & (dx < 0.15)
    slope = dy[keep] / dx[keep]
    assert float(slope.min()) > 3.0 - 0.05 and float(slope.max()) < 5.0 + 0.05
    assert int((dy < -0.5).sum()) > 32  # wraps happen


def test_sawtooth_2d_and_noise() -> None:
    gen = make_generator("sawtooth", dim_x=2, max_context=8, num_target=64)
    y = gen.sample(64, 2).yt
    assert float(y.min()) >= -0.5 - 0.3 and float(y.max()) <= 0.5 + 0.3
    assert float(y.mean()) == pytest.approx(0.0, abs=0.05)
    # Uniform on [-0.5, 0.5) has variance 1/12; noise 0.05 adds 0.0025.
    assert float(y.var()) == pytest.approx(1 / 12 + 0.0025, abs=0.015)


def test_fixed_tasks_deterministic_and_sized() -> None:
    gen = make_generator("gp", max_context=8, num_target=8)
    torch.manual_seed(0)
    a = fixed_tasks(gen, num_tasks=10, batch_size=4, seed=7)
    torch.manual_seed(1)  # global RNG state must not matter
    b = fixed_tasks(gen, num_tasks=10, batch_size=4, seed=7)
    assert [len(x) for x in a] == [4, 4, 2]
    assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    c = fixed_tasks(gen, num_tasks=10, batch_size=4, seed=8)
    assert not _same(a[0], c[0])
    assert not _same(a[0], a[1])


def test_factory_kernels() -> None:
    assert make_generator("gp").kernels == KERNELS
    assert make_generator("gp-se").kernels == ("se",)
    assert make_generator("gp-periodic").kernels == ("periodic",)
    assert isinstance(make_generator("sawtooth"), SawtoothTaskGenerator)
    assert make_generator("sawtooth").noise_std == 0.05 and make_generator("gp").noise_std == 0.2


def test_factory_unknown_name_lists_valid() -> None:
    with pytest.raises(ValueError) as err:
        make_generator("gp-rbf")
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("name", "kwargs", "arg"),
    [
        ("gp", {"min_context": 10, "max_context": 5}, "min_context"),
        ("gp", {"dim_x": 3}, "dim_x"),
        ("sawtooth", {"dim_x": 0}, "dim_x"),
        ("gp", {"noise_std": 0.0}, "noise_std"),
        ("sawtooth", {"noise_std": -0.1}, "noise_std"),
        ("gp", {"num_target": 0}, "num_target"),
        ("gp", {"lengthscale_range": (2.0, 1.0)}, "lengthscale_range"),
        ("gp", {"kernels": ("se", "rbf")}, "kernels"),
        ("gp-se", {"kernels": ("matern52",)}, "kernels"),
        ("sawtooth", {"freq_range": (0.0, 1.0)}, "freq_range"),
        ("sawtooth", {"lengthscale_range": (1.0, 2.0)}, "lengthscale_range"),
        ("gp", {"bogus": 1}, "bogus"),
    ],
)
def test_factory_bad_kwargs(name: str, kwargs: dict[str, object], arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        make_generator(name, **kwargs)


def test_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        GPTaskGenerator().sample(0)
