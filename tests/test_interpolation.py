"""Properties of the classical baselines ``linear`` and ``kriging`` (geonp.models.interpolation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial import Delaunay

from geonp.models import available, build, load, presets, save

NAMES = ["linear", "window-kriging"]


def run(model, xc, yc, xt, mask_c=None, mask_t=None):
    as_t = (lambda a: torch.as_tensor(a, dtype=torch.float64)[None]) if isinstance(xc, np.ndarray) else None
    if as_t is not None:  # one task given as numpy [N, D]
        xc, yc, xt = as_t(xc), as_t(yc), as_t(xt)
    with torch.no_grad():
        return model(xc, yc, xt, mask_c, mask_t)


def scene(points: np.ndarray, time: float = 0.0) -> np.ndarray:
    """``[N, 2]`` (row, col) -> ``[N, 3]`` (time, row, col), as the infill engine lays inputs out."""
    return np.c_[np.full(len(points), time), points]


def wavy(p: np.ndarray) -> np.ndarray:
    return np.sin(1.3 * p[:, 0]) + 0.5 * np.cos(0.9 * p[:, 1] + 1.0)


def test_registry_presets_and_no_weights():
    assert set(NAMES) <= set(available())
    for name in NAMES:
        assert {"small", "tiny"} <= set(presets(name))
        model = build(name, dim_x=3, dim_y=1)
        assert model.trainable is False
        assert model.time_input == 0 and model.space_inputs == (1, 2)
        assert len(list(model.parameters())) == 0 and len(model.state_dict()) == 0
    assert build("linear", dim_x=2, dim_y=1).time_input is None
    assert build("window-kriging", dim_x=1, dim_y=1).space_inputs == (0,)
    assert build("linear", dim_x=3, dim_y=1, space_inputs=(1, 2)).time_input is None  # time opted out


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip(name, tmp_path):
    extra = {"variogram_model": "spherical"} if name == "window-kriging" else {"holdout_every": 4}
    model = build(name, dim_x=3, dim_y=2, preset="small", **extra)
    save(model, tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors")
    assert again.config == model.config and type(again) is type(model)
    rng = np.random.default_rng(0)
    xc, xt = scene(rng.random((40, 2)) * 3), scene(rng.random((10, 2)) * 3)
    yc = np.c_[wavy(xc[:, 1:]), rng.standard_normal(40)]
    a, b = run(model, xc, yc, xt), run(again, xc, yc, xt)
    assert torch.equal(a.loc, b.loc) and torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("kwargs, match", [
    ({"time_input": 3}, "time_input"),
    ({"space_inputs": (0, 1), "time_input": 0}, "must not contain time_input"),
    ({"space_inputs": ()}, "space_inputs"),
    ({"space_inputs": (1, 1)}, "distinct"),
    ({"holdout_every": 1}, "holdout_every"),
])
def test_linear_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build("linear", dim_x=3, dim_y=1, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"variogram_model": "cubic"}, "variogram_model"),
    ({"max_points": 5}, "max_points"),
    ({"space_inputs": (0, 1, 2), "time_input": None}, "1 or 2 space_inputs"),
    ({"loo_rescale": "yes"}, "loo_rescale"),
])
def test_kriging_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build("window-kriging", dim_x=3, dim_y=1, **kwargs)


def test_planar_field_is_reproduced():
    rng = np.random.default_rng(1)
    pc, pt = rng.random((80, 2)) * 4, rng.random((60, 2)) * 4
    plane = lambda p: 2.0 + 0.5 * p[:, :1] - 0.3 * p[:, 1:]  # noqa: E731
    inside = Delaunay(pc).find_simplex(pt) >= 0
    assert inside.sum() > 30
    lin = run(build("linear", 3, 1), scene(pc), plane(pc), scene(pt))
    np.testing.assert_allclose(lin.loc[0, inside].numpy(), plane(pt[inside]), atol=1e-9)
    kri = run(build("window-kriging", 3, 1), scene(pc), plane(pc), scene(pt))
    # Ordinary kriging reproduces constants exactly and a trend only approximately (it reverts
    # to the mean when extrapolating), so: close inside the hull; the plane spans 3.2.
    np.testing.assert_allclose(kri.loc[0, inside].numpy(), plane(pt[inside]), atol=0.05)


def test_kriging_interpolates_its_context():
    rng = np.random.default_rng(2)
    pc = rng.random((100, 2)) * 5
    yc = wavy(pc)[:, None] + 0.05 * rng.standard_normal((100, 1))
    dist = run(build("window-kriging", 3, 1), scene(pc), yc, scene(pc[:20]))
    np.testing.assert_allclose(dist.loc[0].numpy(), yc[:20], atol=1e-6)
    assert (dist.scale < 1e-2 * yc.std()).all()


@pytest.mark.parametrize("name", NAMES)
def test_sigma_grows_away_from_the_data(name):
    rng = np.random.default_rng(3)
    pc = rng.random((150, 2)) * 2
    yc = wavy(3 * pc)[:, None] + 0.05 * rng.standard_normal((150, 1))
    ray = np.c_[np.linspace(1.0, 4.0, 13), np.full(13, 1.0)]  # from the middle of the data outwards
    scale = run(build(name, 3, 1), scene(pc), yc, scene(ray)).scale[0, :, 0].numpy()
    assert np.all(np.diff(scale[6:]) >= -1e-12) and scale[-1] > 2 * scale[:4].max()


@pytest.mark.parametrize("name", NAMES)
def test_padded_batch_equals_tasks_one_by_one(name):
    rng = np.random.default_rng(4)
    b, nc, nt = 3, 60, 25
    xc = torch.tensor(np.c_[rng.integers(0, 2, (b, nc, 1)), rng.random((b, nc, 2)) * 3])
    xt = torch.tensor(np.c_[rng.integers(0, 3, (b, nt, 1)), rng.random((b, nt, 2)) * 3])
    yc = torch.tensor(rng.standard_normal((b, nc, 2)))
    mask_c, mask_t = torch.ones(b, nc, dtype=torch.bool), torch.ones(b, nt, dtype=torch.bool)
    mask_c[0, 35:], mask_t[1, 10:] = False, False
    for t, m in ((xc, mask_c), (yc, mask_c), (xt, mask_t)):
        t[~m] = float("nan")
    model = build(name, 3, 2)
    batched = run(model, xc, yc, xt, mask_c, mask_t)
    for i in range(b):
        mc, mt = mask_c[i], mask_t[i]
        single = run(model, xc[i, mc][None], yc[i, mc][None], xt[i, mt][None])
        torch.testing.assert_close(batched.loc[i, mt], single.loc[0], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(batched.scale[i, mt], single.scale[0], rtol=1e-9, atol=1e-9)
    assert torch.equal(batched.loc[1, 10:], torch.zeros(15, 2))
    assert torch.equal(batched.scale[1, 10:], torch.ones(15, 2))


@pytest.mark.parametrize("name", NAMES)
def test_context_order_shifts_and_dtype(name):
    rng = np.random.default_rng(5)
    xc = torch.tensor(scene(rng.random((700, 2)) * 6), dtype=torch.float32)[None]
    yc = torch.tensor(wavy(xc[0, :, 1:].double().numpy())[:, None], dtype=torch.float32)[None]
    xt = torch.tensor(scene(rng.random((50, 2)) * 6), dtype=torch.float32)[None]
    xc.requires_grad_(True)
    model = build(name, 3, 1, preset="tiny")  # kriging: 700 > max_points, so neighbourhoods are used
    a = model(xc, yc, xt)
    assert a.loc.dtype == torch.float32 and not a.loc.requires_grad and not a.scale.requires_grad
    perm = torch.randperm(700, generator=torch.Generator().manual_seed(0))
    b = run(model, xc.detach()[:, perm], yc[:, perm], xt)
    shift = torch.tensor([2.0, 0.5, -1.0])  # time shifts too: slices are found by equality
    c = run(model, xc.detach() + shift, yc, xt + shift)
    for other in (b, c):
        torch.testing.assert_close(a.loc, other.loc, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.scale, other.scale, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_each_time_slice_uses_its_own_context(name):
    p = np.random.default_rng(6).random((20, 2)) * 3
    xc = np.r_[scene(p, 0.0), scene(p, 1.0)]
    yc = np.r_[np.full((20, 1), 1.0), np.full((20, 1), 5.0)]
    xt = np.r_[scene(p[:3] + 0.1, 0.0), scene(p[:3] + 0.1, 1.0), scene(p[:3] + 0.1, 2.0)]
    loc = run(build(name, 3, 1), xc, yc, xt).loc[0, :, 0].numpy()
    # Time 2 has no context: all points, time ignored, each location the mean of its two values.
    np.testing.assert_allclose(loc, [1.0] * 3 + [5.0] * 3 + [3.0] * 3, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_a_slice_without_context_carries_the_change_over_time(name):
    # Targets at time 2 sit exactly on locations seen at times 0 and 1, where the field moved
    # by 4 (values 1 then 5 +- noise): the pooled interpolant is exact there, but the target's
    # time is not, so sigma must be about the spread across times (2), not the floor.
    rng = np.random.default_rng(7)
    p = rng.random((30, 2)) * 3
    xc = np.r_[scene(p, 0.0), scene(p, 1.0)]
    yc = np.r_[1.0 + 0.1 * rng.standard_normal((30, 1)), 5.0 + 0.1 * rng.standard_normal((30, 1))]
    scale = run(build(name, 3, 1), xc, yc, scene(p[:5], 2.0)).scale[0, :, 0].numpy()
    assert np.all(scale > 1.5), scale
    same_time = run(build(name, 3, 1), xc, yc, scene(p[:5] + 0.05, 1.0)).scale[0, :, 0].numpy()
    assert np.all(same_time < 1.0), same_time  # slices with context of their own are unaffected


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dx", [1, 2, 3])
@pytest.mark.parametrize("case", ["one point", "two points", "constant", "colinear"])
def test_degenerate_tasks_give_finite_outputs(name, dx, case):
    rng = np.random.default_rng(7)
    n = {"one point": 1, "two points": 2}.get(case, 12)
    xc = rng.random((n, dx))
    if case == "colinear":
        xc[:, -1] = 0.5
    yc = np.full((n, 1), 2.0) if case == "constant" else rng.standard_normal((n, 1))
    dist = run(build(name, dx, 1), xc, yc, rng.random((7, dx)) * 2)
    assert torch.isfinite(dist.loc).all() and torch.isfinite(dist.scale).all() and (dist.scale > 0).all()
    if case == "constant":
        np.testing.assert_allclose(dist.loc.numpy(), 2.0)


def test_one_space_input_matches_np_interp():
    rng = np.random.default_rng(8)
    xc, xt = np.sort(rng.random(30)) * 5, rng.random(20) * 6 - 0.5
    yc = np.sin(xc)
    lin = run(build("linear", 1, 1), xc[:, None], yc[:, None], xt[:, None])
    np.testing.assert_allclose(lin.loc[0, :, 0].numpy(), np.interp(xt, xc, yc), atol=1e-12)
    kri = run(build("window-kriging", 1, 1), xc[:, None], yc[:, None], xt[:, None])
    assert np.abs(kri.loc[0, :, 0].numpy() - np.sin(xt))[(xt > 0.3) & (xt < 4.7)].max() < 0.1


def sinusoid_field(seed: int, n: int = 30, noise: float = 0.2):
    """A smooth random field on an ``n x n`` grid: four plane waves of 6-15 cells, plus noise."""
    rng = np.random.default_rng(seed)
    r, c = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    f = np.zeros((n, n))
    for _ in range(4):
        k, th, ph = rng.uniform(2 * np.pi / 15, 2 * np.pi / 6), rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi)
        f += np.sin(k * (np.cos(th) * r + np.sin(th) * c) + ph)
    f = (f / f.std() + noise * rng.standard_normal((n, n))).ravel()
    x = scene(np.c_[r.ravel(), c.ravel()] / 10.0)  # cells over a fixed scale, as the engine does
    return x, f, rng.random(n * n) < 0.4


@pytest.mark.parametrize("name", NAMES)
def test_calibration_on_a_smooth_random_field(name):
    x, f, hide = sinusoid_field(seed=0)
    dist = run(build(name, 3, 1), x[~hide], f[~hide, None], x[hide])
    err = dist.loc[0, :, 0].numpy() - f[hide]
    coverage = np.mean(np.abs(err) < 1.645 * dist.scale[0, :, 0].numpy())
    # ~390 hidden cells: one standard error of a 90% coverage is 0.015. Kriging measured 0.89-0.905 over
    # four seeds (+-3 SE band); linear's sigma is a little wide here (0.92-0.97), so its band reaches 0.98.
    low, high = (0.85, 0.95) if name == "window-kriging" else (0.85, 0.98)
    assert low <= coverage <= high, coverage
    assert np.sqrt(np.mean(err**2)) < 0.5 * f.std()


@pytest.mark.parametrize("space", [2, 3])
def test_linear_gives_a_target_the_same_bits_whatever_the_other_targets(space):
    """The infill engine asks a window for different target subsets in different output blocks
    (chunkings); a cell's value must not depend on which other cells were asked. On a lattice
    with holes many targets lie on shared Delaunay faces, where the simplex found (and so the
    rounding) used to depend on the previous target's."""
    rng = np.random.default_rng(3)
    side = 16 if space == 2 else 7
    cells = np.stack(np.meshgrid(*[np.arange(float(side))] * space, indexing="ij"), -1).reshape(-1, space)
    seen = rng.random(len(cells)) < 0.45
    xc, xt = scene(cells[seen]), scene(cells[~seen])
    yc = (10 + wavy(cells[seen]) + (cells[seen, 2:].sum(1) if space == 3 else 0))[:, None]
    model = build("linear", dim_x=space + 1, dim_y=1, space_inputs=list(range(1, space + 1)))
    whole = run(model, xc, yc, xt)
    order = rng.permutation(len(xt))
    for part in np.array_split(order, 9):
        alone = run(model, xc, yc, xt[part])
        assert torch.equal(alone.loc[0], whole.loc[0, part]) and torch.equal(alone.scale[0], whole.scale[0, part])
