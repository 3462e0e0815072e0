"""Property tests (issue #16 §5, hypothesis): what must hold for any shapes, masks and sizes.

- Models: finite inputs of random sizes and padding give finite means, positive scales, the
  right shapes, and a padded batch equals its tasks one by one.
- Windows: along any axis the blending weights of the windows sum to one on every cell; a fill
  whose windows all say (c, s) gives exactly c and s at every gap cell whatever the cube, window
  and chunking; the output does not depend on the chunking.
- Sampler: context and targets are disjoint, inside the window's view, and finite.
- Normalisation: values and inputs round-trip.
"""

from __future__ import annotations

from functools import cache
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import geonp
from geonp.fill.output import FLAG_INFILLED
from geonp.models import build
from geonp.tasks.training import training_window
from geonp.tasks.windows import Axis, WindowSpec

MODELS = {name: {} for name in ["tnp", "pt-tnp", "te-tnp", "te-pt-tnp", "cnp", "rcnp", "tnp-kr", "tnp-kr-fast",
                                "convcnp"]}
# The flagship's configuration: local attention and local kriging with quadrant neighbours.
MODELS["te-pt-tnp+kriging"] = {"local_attention": {"neighbours": 4},
                               "kriging": {"neighbours": 8, "quadrant_dims": [0, 1]}}
QUICK = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def model(key: str, dx: int, dy: int):
    torch.manual_seed(0)
    return build(key.split("+")[0], dim_x=dx, dim_y=dy, preset="tiny", **MODELS[key]).eval()


@st.composite
def padded_tasks(draw):
    """``(xc, yc, xt, mask_c, mask_t, sizes)``: tasks of different sizes padded with NaN."""
    b = draw(st.integers(1, 3))
    dx, dy = draw(st.sampled_from([(2, 1), (2, 2)]))
    sizes = [(draw(st.integers(4, 14)), draw(st.integers(1, 8))) for _ in range(b)]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    nc, nt = max(s[0] for s in sizes), max(s[1] for s in sizes)
    xc, yc = torch.rand(b, nc, dx, generator=g) * 4 - 2, torch.randn(b, nc, dy, generator=g)
    xt = torch.rand(b, nt, dx, generator=g) * 5 - 2.5
    mask_c = torch.arange(nc)[None] < torch.tensor([s[0] for s in sizes])[:, None]
    mask_t = torch.arange(nt)[None] < torch.tensor([s[1] for s in sizes])[:, None]
    xc[~mask_c], yc[~mask_c], xt[~mask_t] = float("nan"), float("nan"), float("nan")
    return xc, yc, xt, mask_c, mask_t, sizes


@pytest.mark.parametrize("key", sorted(MODELS))
@QUICK
@given(task=padded_tasks())
def test_models_finite_positive_and_padding_free(key, task) -> None:
    xc, yc, xt, mask_c, mask_t, sizes = task
    net = model(key, xc.shape[-1], yc.shape[-1])
    with torch.no_grad():
        out = net(xc, yc, xt, mask_c, mask_t)
        assert out.loc.shape == out.scale.shape == (*xt.shape[:2], yc.shape[-1])
        for i, (nc, nt) in enumerate(sizes):
            assert torch.isfinite(out.loc[i, :nt]).all() and (out.scale[i, :nt] > 0).all()
            alone = net(xc[i:i + 1, :nc], yc[i:i + 1, :nc], xt[i:i + 1, :nt])
            torch.testing.assert_close(out.loc[i:i + 1, :nt], alone.loc, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(out.scale[i:i + 1, :nt], alone.scale, atol=1e-4, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 80), core=st.integers(1, 20), overlap=st.integers(0, 20), halo=st.integers(0, 10))
def test_window_weights_sum_to_one_on_every_cell(n, core, overlap, halo) -> None:
    assume(overlap <= core)
    axis = Axis(n, core, overlap, halo)
    total = np.zeros(n)
    for k in range(axis.count):
        start, stop = axis.predicted(k)
        assert 0 <= start < stop <= n
        assert list(axis.touching(start, stop)).count(k) == 1
        total[start:stop] += axis.weights(k)
    np.testing.assert_allclose(total, 1.0, atol=1e-12)


def _cube(t: int, r: int, c: int, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    tt, rr, cc = np.meshgrid(np.arange(t), np.arange(r), np.arange(c), indexing="ij")
    f = (10 + np.sin(rr / 4.0) + np.cos(cc / 5.0) + 0.1 * tt).astype(np.float32)
    f[rng.random(f.shape) < rng.uniform(0.1, 0.6)] = np.nan
    f[:, 0, 0] = 10.0  # at least one observation
    return xr.Dataset({"v": (("time", "lat", "lon"), f)},
                      coords={"time": pd.date_range("2020", periods=t), "lat": np.arange(r) * 0.1,
                              "lon": np.arange(c) * 0.1})


def _chunking(draw, shape):
    """Any chunk size along time; at least a quarter of the axis along rows and columns, so a cube
    has at most ``T * 16`` blocks. Each block costs tens of milliseconds of windows and reads
    whatever its size: chunks of one cell (3888 blocks for 3 x 36 x 36) took 534 s per fill."""
    return {d: draw(st.integers(1 if d == "time" else -(-n // 4), n)) for d, n in zip(("time", "lat", "lon"), shape)}


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_gap_cell_gets_exactly_the_windows_answer_whatever_the_chunking(data) -> None:
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(4, 40)), data.draw(st.integers(4, 40)))
    core = tuple(data.draw(st.integers(1, n)) for n in shape)
    spec = WindowSpec(core=core, overlap=tuple(data.draw(st.integers(0, c - 1 if c > 1 else 0)) for c in core),
                      halo=tuple(data.draw(st.integers(0, 4)) for _ in core))
    ds = _cube(*shape, data.draw(st.integers(0, 99))).chunk(_chunking(data.draw, shape))

    def every_window_says(net, tasks, *args, **kwargs):  # each window: mean 3.25, sigma 0.5
        return [(np.full(t.targets.size, 3.25), np.full(t.targets.size, 0.5)) for t in tasks]

    with mock.patch("geonp.fill.blocks.predict_windows", every_window_says):
        out = geonp.infill(ds, "v", model="linear", window=spec, fit_steps=0)
    gaps = out.v_flag.values == FLAG_INFILLED
    assert gaps.sum() == int(np.isnan(ds.v.values).sum())
    np.testing.assert_allclose(out.v.values[gaps], 3.25, atol=1e-6)
    np.testing.assert_allclose(out.v_std.values[gaps], 0.5, atol=1e-6)
    observed = ~np.isnan(ds.v.values)
    np.testing.assert_array_equal(out.v.values[observed], ds.v.values[observed])


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_the_output_does_not_depend_on_the_chunking(data) -> None:
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(8, 36)), data.draw(st.integers(8, 36)))
    ds = _cube(*shape, data.draw(st.integers(0, 99)))
    spec = WindowSpec(core=(1, 8, 8), overlap=(0, 4, 4), halo=(1, 4, 4))
    a = geonp.infill(ds.chunk(_chunking(data.draw, shape)), "v", model="linear", window=spec, fit_steps=0)
    b = geonp.infill(ds.chunk(_chunking(data.draw, shape)), "v", model="linear", window=spec, fit_steps=0)
    for v in ("v", "v_std", "v_flag"):
        np.testing.assert_array_equal(a[v].values, b[v].values)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 4), r=st.integers(6, 30), c=st.integers(6, 30), seed=st.integers(0, 10**6),
       real_clouds=st.sampled_from([0.0, 1.0]))
def test_sampled_windows_keep_context_and_targets_apart(t, r, c, seed, real_clouds) -> None:
    values = _cube(t, r, c, seed).v.values.astype(float)
    spec = WindowSpec(core=(1, 8, 8), overlap=(0, 4, 4), halo=(1, 4, 4), max_context=64)
    rng = np.random.default_rng(seed)
    task = training_window(values, np.ones(values.shape, bool), spec, rng, spread=1.0, real_clouds=real_clouds)
    assume(task is not None)  # None: too few observed cells in the window drawn
    for a in (task.xc, task.yc, task.xt, task.yt):
        assert np.isfinite(a).all()
    assert len(task.xc) <= spec.max_context and len(task.xt) == len(task.yt) == len(task.targets)
    context = {tuple(x) for x in np.round(task.xc, 5)}
    assert not context & {tuple(x) for x in np.round(task.xt, 5)}
    # Offsets from the window centre (a whole cell) reach at most half the region plus the halo.
    reach = [((v + 1) / 2 + h) / u for v, h, u in zip((1, 12, 12), spec.halo, (spec.steps_per_unit, 8.0, 8.0))]
    for points in (task.xc, task.xt):
        assert (np.abs(points) <= np.array(reach)).all()
