"""The weights shipped in geonp/weights: one per bundled config, built from that config, usable by infill."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import smooth_cube

import geonp
from geonp.checkpoint import read_checkpoint
from geonp.fill.predictor import bundled_checkpoint
from geonp.models import build, save

#: The shipped weights must beat their own architecture at random initialisation on smooth_cube's
#: gaps by this factor (RMSE). Measured (bundled / random): te-pt-tnp 0.08 / 0.65, convcnp 0.13 /
#: 0.43, tnp-kr 0.19 / 0.72, te-tnp 0.21 / 0.67, pt-tnp 0.22 / 0.65, cnp 0.59 / 0.71 (a global
#: mean model); kriging scores 0.02, linear 0.10.
TRAINED_FACTOR = 0.9
#: The default model of `geonp infill` and the demo is held to an absolute bar as well.
TE_PT_TNP_RMSE = 0.3
CONFIGS = sorted((Path(__file__).resolve().parents[1] / "pipelines" / "configs" / "bundled").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_each_bundled_config_has_weights_trained_from_it(config):
    cfg = yaml.safe_load(config.read_text())
    path = bundled_checkpoint(cfg["model"])
    assert path is not None, f"geonp/weights/{cfg['model']}.safetensors missing: python -m pipelines.release.pretrain"
    _, meta = read_checkpoint(path)
    from geonp.models.registry import same_model
    from pipelines.checkpoint_variants import merged
    from pipelines.release.pretrain import AT_INFERENCE, COVARIATES_AT_INFERENCE

    expected = merged(cfg.get("model_args", {}), AT_INFERENCE.get(cfg["model"], {}))
    if cfg["model"] in COVARIATES_AT_INFERENCE:  # the release's choice of drift covariates, no weight
        covariates = COVARIATES_AT_INFERENCE[cfg["model"]]
        expected["kriging"]["covariates"] = len(covariates)
        assert meta["infill"]["covariates"] == covariates
    trained = {**meta["model"], "preset": cfg["preset"], "kwargs": expected}
    assert meta["model"]["name"] == cfg["model"] and same_model(meta["model"], trained)
    assert meta["infill"]["cells_per_unit"] > 0  # trained on infill windows, scaling recorded


def test_the_shipped_te_pt_tnp_is_the_class_default():
    """build("te-pt-tnp") is the model the bundled weights are: the same header, to the letter, and
    the same tensors fit it; the class has at most 12 constructor arguments (issue 56)."""
    import inspect

    from geonp.models import build
    from geonp.models.tnp import TEPTTNP

    tensors, meta = read_checkpoint(bundled_checkpoint("te-pt-tnp"))
    shipped = build("te-pt-tnp", meta["model"]["dim_x"], meta["model"]["dim_y"])
    assert shipped.config == meta["model"] and meta["model"]["preset"] == "shipped"
    shipped.load_state_dict(tensors, strict=True)
    direct = TEPTTNP(meta["model"]["dim_x"], meta["model"]["dim_y"])  # the class's own defaults
    assert {k: v.shape for k, v in direct.state_dict().items()} == {k: v.shape for k, v in tensors.items()}
    assert direct.kriging_nugget_input and direct.kriging_quadrant_dims == (1, 2)
    assert len(inspect.signature(TEPTTNP).parameters) <= 12


def _gap_rmse(name: str, checkpoint: str | None = None) -> float:
    """RMSE of ``name``'s infill on smooth_cube's gaps, whose field is known in closed form."""
    out = geonp.infill(smooth_cube(), "sst", model=name, checkpoint=checkpoint, fit_steps=0)
    hole = out["sst_flag"].values == 1
    assert hole.any() and out.attrs["geonp_model"] == name
    assert np.isfinite(out["sst"].values[hole]).all() and (out["sst_std"].values[hole] > 0).all()
    t, r, c = np.nonzero(hole)
    truth = 15 + np.sin(r / 5.0) + np.cos(c / 7.0) + 0.2 * t
    return float(np.sqrt(np.mean((out["sst"].values[hole] - truth) ** 2)))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_bundled_weights_fill_a_cube_better_than_untrained_ones(config, tmp_path):
    name = yaml.safe_load(config.read_text())["model"]
    _, meta = read_checkpoint(bundled_checkpoint(name))
    cfg = meta["model"]
    torch.manual_seed(0)
    untrained = build(cfg["name"], cfg["dim_x"], cfg["dim_y"], preset=cfg["preset"], **cfg["kwargs"])
    save(untrained, tmp_path / "untrained.safetensors", extra={"infill": meta["infill"]})
    trained, random = _gap_rmse(name), _gap_rmse(name, str(tmp_path / "untrained.safetensors"))
    assert trained < TRAINED_FACTOR * random, f"{name}: RMSE {trained:.3f} bundled vs {random:.3f} untrained"
    if name == "te-pt-tnp":
        assert trained < TE_PT_TNP_RMSE


def test_demo_runs_with_the_bundled_te_pt_tnp(tmp_path):
    from geonp.demo import run_demo

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run_demo(tmp_path / "demo", fit_steps=2, verbose=False)
    # HadISST's "days since 1-1-1" units are read right; xarray's warning about them is not the user's
    assert not [w for w in caught if "Ambiguous reference date" in str(w.message)]
    assert list(summary["models"]) == ["te-pt-tnp", "linear", "kriging"]
    assert (tmp_path / "demo" / "sst_map.png").stat().st_size > 10_000
    assert (tmp_path / "demo" / "sst_filled.zarr" / "zarr.json").exists()
