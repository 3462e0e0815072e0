"""Which nugget te-pt-tnp's kriging head uses on an input (``--nugget``, :mod:`geonp.fill.nugget`):
a negative share is the network's own, ``auto`` picks per field by CRPS on the input's own hidden
cells, and the choice is recorded and refused for weights that take no nugget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

import geonp.fill.nugget as nugget_module
from geonp.checkpoint import read_checkpoint
from geonp.fill.engine import infill
from geonp.fill.predictor import bundled_checkpoint
from geonp.models import build
from geonp.tasks.covariate_maps import OWN_NUGGET
from pipelines.checkpoint_variants import variant_checkpoint


@pytest.fixture(scope="module")
def nugget_weights() -> str:
    """The bundled te-pt-tnp, whose kriging head takes the scene's nugget."""
    path = bundled_checkpoint("te-pt-tnp")
    assert read_checkpoint(path)[1]["model"]["kwargs"]["kriging"]["nugget_input"]
    return str(path)


@pytest.fixture(scope="module")
def plain_weights(tmp_path_factory) -> str:
    """The same tensors without the nugget input (its own nugget only)."""
    out = tmp_path_factory.mktemp("plain") / "plain.safetensors"
    return str(variant_checkpoint(bundled_checkpoint("te-pt-tnp"), out, covariates=["dineof", "spread"],
                                  model_args={"kriging": {"nugget_input": False}}))


def cube(noise: float, seed: int = 0) -> xr.Dataset:
    """Four steps of a smooth moving pattern plus white noise of s.d. ``noise``, two with a square gap."""
    rng = np.random.default_rng(seed)
    r, c = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    values = np.stack([np.sin(r / 7.0 + t) + np.cos(c / 9.0 - 0.5 * t) for t in range(4)])
    values = values + noise * rng.standard_normal(values.shape)
    values[1, 8:20, 8:20] = np.nan
    values[3, 14:28, 4:16] = np.nan
    return xr.Dataset({"v": (("time", "lat", "lon"), values)},
                      coords={"time": np.arange(4), "lat": np.arange(32) * 0.1, "lon": np.arange(32) * 0.1})


def test_a_negative_share_is_the_networks_own_nugget():
    kwargs = dict(preset="tiny", local_attention={"neighbours": 4})
    takes = build("te-pt-tnp", dim_x=5, dim_y=1, kriging={"neighbours": 4, "covariates": 2, "nugget_input": True},
                  **kwargs).eval()
    plain = build("te-pt-tnp", dim_x=4, dim_y=1, kriging={"neighbours": 4, "covariates": 1}, **kwargs).eval()
    plain.load_state_dict(takes.state_dict())  # covariates hold no weights: the same network
    g = torch.Generator().manual_seed(1)
    xc, yc, xt = torch.rand(2, 16, 5, generator=g), torch.randn(2, 16, 1, generator=g), torch.rand(2, 5, 5, generator=g)
    mask_c, mask_t = torch.ones(2, 16, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    xc[..., -1], xt[..., -1] = OWN_NUGGET, OWN_NUGGET
    with torch.no_grad():
        own = takes(xc, yc, xt, mask_c, mask_t)
        ref = plain(xc[..., :-1], yc, xt[..., :-1], mask_c, mask_t)
        scene = takes(xc, yc, xt.clone().index_fill_(-1, torch.tensor([4]), 0.5), mask_c, mask_t)
    assert torch.allclose(own.loc, ref.loc, atol=1e-6) and torch.allclose(own.scale, ref.scale, atol=1e-6)
    assert not torch.allclose(scene.loc, ref.loc)


def test_both_nuggets_from_one_pass_equal_two_calls():
    """The nugget check scores both options from one transformer pass (predict_per_nugget): the
    same numbers, to the bit, as two calls with the targets' nugget share changed."""
    kwargs = dict(preset="tiny", local_attention={"neighbours": 4})
    model = build("te-pt-tnp", dim_x=5, dim_y=1, kriging={"neighbours": 4, "covariates": 2, "nugget_input": True},
                  **kwargs).eval()
    g = torch.Generator().manual_seed(2)
    xc, yc, xt = torch.rand(2, 16, 5, generator=g), torch.randn(2, 16, 1, generator=g), torch.rand(2, 5, 5, generator=g)
    mask_c = torch.ones(2, 16, dtype=torch.bool)
    mask_c[1, 12:] = False
    own_xt = xt.clone()
    own_xt[..., -1] = OWN_NUGGET
    with torch.no_grad():
        pair = model.predict_per_nugget(xc, yc, xt, mask_c, None, [None, OWN_NUGGET])
        calls = model(xc, yc, xt, mask_c), model(xc, yc, own_xt, mask_c)
    for one, call in zip(pair, calls):
        assert torch.equal(one.loc, call.loc) and torch.equal(one.scale, call.scale)
    assert not torch.equal(pair[0].loc, pair[1].loc)
    with pytest.raises(ValueError, match="kriging nugget_input"):
        build("te-pt-tnp", dim_x=4, dim_y=1, kriging={"neighbours": 4, "covariates": 1}, **kwargs).predict_per_nugget(
            xc[..., :-1], yc, xt[..., :-1], mask_c, None, [None])


@pytest.fixture(scope="module")
def noisy_fills(nugget_weights) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """A noisy cube and its fills with each ``nugget`` choice (auto on 16 windows)."""
    ds = cube(noise=0.6)
    return ds, {choice: infill(ds, "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, nugget=choice,
                               check_windows=16) for choice in ("auto", "scene", "model")}


def test_auto_takes_the_scenes_nugget_where_the_field_is_noisy(noisy_fills):
    ds, out = noisy_fills
    chosen = out["auto"].attrs["geonp_nugget"]
    assert chosen.startswith("v: the scene's (CRPS with the scene's nugget ") and "hidden cells" in chosen
    scene, own = (float(x) for x in chosen.split("nugget ")[1].split(" on ")[0].split(" against the network's "))
    gain, error = (float(x) for x in chosen.split("difference ")[1].rstrip(")").split(" +- "))
    assert scene < own and np.isclose(gain, own - scene, rtol=0.05) and gain > nugget_module.CHOICE_Z * error > 0
    assert out["scene"].attrs["geonp_nugget"] == "v: the scene's (asked)"
    gap = np.isnan(ds["v"].values)
    assert np.allclose(out["auto"]["v"].values[gap], out["scene"]["v"].values[gap])  # auto filled as "scene"


def test_model_gives_the_networks_nugget_and_a_fill_that_differs(noisy_fills):
    ds, out = noisy_fills
    own = out["model"]
    assert own.attrs["geonp_nugget"] == "v: the network's (asked)"
    gap = np.isnan(ds["v"].values)
    assert np.isfinite(own["v"].values[gap]).all() and (own["v_std"].values[gap] > 0).all()
    assert not np.allclose(own["v"].values[gap], out["scene"]["v"].values[gap])


def test_nugget_is_refused_where_it_means_nothing_or_is_misspelt(nugget_weights, plain_weights):
    ds = cube(noise=0.0)
    with pytest.raises(ValueError, match="--nugget scene: model 'te-pt-tnp' takes no scene nugget"):
        infill(ds, "v", "te-pt-tnp", checkpoint=plain_weights, fit_steps=0, nugget="scene")
    with pytest.raises(ValueError, match="--nugget must be one of auto, scene, model"):
        infill(ds, "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, nugget="fitted")
    out = infill(ds, "v", "te-pt-tnp", checkpoint=plain_weights, fit_steps=0)  # auto: silent without the input
    assert "geonp_nugget" not in out.attrs and np.isfinite(out["v"].values).all()


def test_the_networks_nugget_leaves_the_other_covariates_alone():
    from geonp.fill.field import Field

    values = cube(noise=0.0)["v"]
    f = Field("v", values, np.ones(values.shape[1:], bool))
    f.history = np.stack([np.full(values.shape, 3.0, np.float32), np.full(values.shape, 0.4, np.float32)])
    nugget_module.use_network_nugget([f], ["elsewhere"])
    assert np.all(f.history[1] == np.float32(0.4))  # another field's label: untouched
    nugget_module.use_network_nugget([f], [f.label])
    assert np.all(f.history[0] == 3.0) and np.all(f.history[1] == OWN_NUGGET)


def test_a_resumed_store_repeats_the_choice_it_made(nugget_weights, tmp_path, monkeypatch):
    from geonp.fill import prepare
    from geonp.fill.plan import plan

    ds = cube(noise=0.6)
    first = plan(ds, "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, nugget="model", check_windows=8)
    prepare._choose_nugget(first, tmp_path, None)
    assert (tmp_path / "geonp_nugget.json").exists() and first.nugget_chosen == "v: the network's (asked)"

    def never(*args, **kwargs):
        raise AssertionError("a resumed run must not choose again")

    monkeypatch.setattr(prepare, "choose_nugget", never)
    again = plan(ds, "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, nugget="model", check_windows=8)
    assert float(again.fields[0].history[-1].flat[0]) >= 0  # the scene's share, before the saved choice
    prepare._choose_nugget(again, tmp_path, None)
    assert again.nugget_chosen == first.nugget_chosen and np.all(again.fields[0].history[-1] == OWN_NUGGET)


def test_the_gain_and_its_error_are_clustered_by_window():
    scene, own = np.array([1.0, 1.0, 2.0, 2.0]), np.full(4, 2.0)
    gain, error = nugget_module.paired_gain(scene, own, np.array([0, 0, 1, 1]))
    assert gain == 0.5 and np.isclose(error, np.sqrt(2.0 * 2) / 4)  # deviations +1 and -1, G / (G - 1) = 2
    _, independent = nugget_module.paired_gain(scene, own, np.arange(4))
    assert independent < error  # the same cells, each its own window: the error shrinks
    assert nugget_module.paired_gain(scene, own, np.zeros(4, int))[1] == np.inf  # one window tells nothing


@pytest.mark.parametrize("spread, looks", [(0.1, 1), (0.176, 2), (3.0, 3)])
def test_a_close_call_draws_more_windows_and_a_clear_one_does_not(monkeypatch, spread, looks):
    """Every window gains 0.1 +- ``spread``: 2.6 standard errors after the first draw, clear of
    the threshold (one look); 1.5, within its margin though above it (a second look, at 2.2
    clear); or near zero at every draw (doubling up to CHOICE_MORE times the first)."""
    calls = []

    def fake(windows, first):
        calls.append((first, windows))
        ids = np.arange(first, first + windows)
        gain = 0.1 + spread * np.where(ids % 2, 1.0, -1.0)  # alternating: mean 0.1 exactly
        return np.zeros(windows), gain, ids

    scene, own, window = nugget_module.settled_crps(fake, 8)
    assert len(calls) == looks and calls[0] == (0, 8)
    assert calls == [(0, 8), (8, 8), (16, 16)][:looks]  # windows numbered on: none scored twice
    assert np.array_equal(window, np.arange(8 * 2 ** (looks - 1))) and scene.size == own.size == window.size


def test_windows_of_a_later_draw_are_numbered_after_the_earlier_ones(monkeypatch):
    """The real paired_crps, on a stand-in source and model: ``first`` shifts the window ids."""
    from types import SimpleNamespace

    from torch.distributions import Normal

    monkeypatch.setattr(nugget_module, "crps_normal", lambda y, mu, sigma: np.abs(y - mu))

    class Source:
        def sample(self, batch):
            t = torch.zeros(batch, 3, 5)
            b = SimpleNamespace(xc=t, yc=t[..., :1], xt=t, yt=t[..., :1], mask_c=torch.ones(batch, 3, dtype=torch.bool),
                                mask_t=torch.ones(batch, 3, dtype=torch.bool))
            b.to = lambda device: b
            return b

    def predict_per_nugget(xc, yc, xt, mask_c, mask_t, nuggets):
        return [Normal(torch.zeros(xt.shape[:-1] + (1,)), torch.ones(xt.shape[:-1] + (1,))) for _ in nuggets]

    model = SimpleNamespace(predict_per_nugget=predict_per_nugget)
    _, _, first = nugget_module.paired_crps(model, Source(), "cpu", windows=16)
    _, _, later = nugget_module.paired_crps(model, Source(), "cpu", windows=16, first=16)
    assert np.array_equal(np.unique(first), np.arange(16)) and np.array_equal(np.unique(later), np.arange(16, 32))


def test_a_field_without_a_nugget_at_any_step_keeps_the_scenes_unchecked(nugget_weights, monkeypatch):
    """Where the variogram finds no nugget (the noise-free cube: shares under SMOOTH_SHARE at every
    step), auto takes the scene's without predicting a window; a noisy cube is still checked."""
    def no_check(*args, **kwargs):
        raise AssertionError("the check ran on a field without a nugget")

    monkeypatch.setattr(nugget_module, "paired_crps", no_check)
    out = infill(cube(noise=0.0), "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, check_windows=8)
    assert out.attrs["geonp_nugget"].startswith("v: the scene's (its variogram's nugget under 0.1% of the variance")
    with pytest.raises(AssertionError, match="the check ran"):
        infill(cube(noise=0.6), "v", "te-pt-tnp", checkpoint=nugget_weights, fit_steps=0, check_windows=8)
