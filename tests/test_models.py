"""Properties every registry model must have: the calling convention, symmetries,
padding, save/load, and clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_tasks

from geonp.models import available, build, load, save

NAMES = ["tnp", "pt-tnp", "te-tnp", "te-pt-tnp", "cnp", "rcnp", "gp", "tnp-kr", "tnp-kr-fast", "convcnp"]
TE_NAMES = ["te-tnp", "te-pt-tnp", "rcnp", "gp"]
NON_TE_NAMES = ["tnp", "pt-tnp", "cnp", "tnp-kr", "tnp-kr-fast"]


def tiny(name: str, dx: int = 1, dy: int = 1):
    torch.manual_seed(0)
    return build(name, dim_x=dx, dim_y=dy, preset="tiny").eval()


def predict(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


def test_registry_lists_every_issue_model():
    assert set(NAMES) <= set(available())


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_positive_scale(name):
    xc, yc, xt, mask_c = random_tasks(dx=2, dy=2)
    dist = predict(tiny(name, 2, 2), xc, yc, xt, mask_c)
    assert dist.loc.shape == dist.scale.shape == (3, 9, 2)
    assert torch.isfinite(dist.loc).all() and (dist.scale > 0).all()


@pytest.mark.parametrize("name", TE_NAMES)
def test_translation_equivariant_models_ignore_shifts(name):
    xc, yc, xt, mask_c = random_tasks(dx=2)
    model = tiny(name, 2)
    tau = torch.tensor([3.7, -1.3])
    a, b = predict(model, xc, yc, xt, mask_c), predict(model, xc + tau, yc, xt + tau, mask_c)
    tol = 2e-3 if name == "gp" else 1e-4  # the GP refits its hyper-parameters numerically
    torch.testing.assert_close(a.loc, b.loc, atol=tol, rtol=tol)
    torch.testing.assert_close(a.scale, b.scale, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", NON_TE_NAMES)
def test_other_models_do_see_shifts(name):
    xc, yc, xt, mask_c = random_tasks(dx=2)
    model = tiny(name, 2)
    tau = torch.tensor([3.7, -1.3])
    a, b = predict(model, xc, yc, xt, mask_c), predict(model, xc + tau, yc, xt + tau, mask_c)
    assert (a.loc - b.loc).abs().max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_context_permutation_invariance_and_target_equivariance(name):
    xc, yc, xt, mask_c = random_tasks()
    model = tiny(name)
    pc, pt = torch.randperm(xc.shape[1]), torch.randperm(xt.shape[1])
    a = predict(model, xc, yc, xt, mask_c)
    b = predict(model, xc[:, pc], yc[:, pc], xt[:, pt], mask_c[:, pc])
    torch.testing.assert_close(a.loc[:, pt], b.loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.scale[:, pt], b.scale, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_padded_batch_equals_tasks_one_by_one(name):
    xc, yc, xt, mask_c = random_tasks()
    mask_t = torch.ones(xt.shape[:2], dtype=torch.bool)
    mask_t[1, 5:] = False
    xt[1, 5:] = float("nan")
    model = tiny(name)
    batched = predict(model, xc, yc, xt, mask_c, mask_t)
    for i in range(xc.shape[0]):
        mc, mt = mask_c[i], mask_t[i]
        single = predict(model, xc[i, mc][None], yc[i, mc][None], xt[i, mt][None])
        torch.testing.assert_close(batched.loc[i, mt], single.loc[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(batched.scale[i, mt], single.scale[0], atol=1e-5, rtol=1e-4)
    assert torch.isfinite(batched.loc).all()


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip_is_exact(name, tmp_path):
    xc, yc, xt, mask_c = random_tasks()
    model = tiny(name)
    save(model, tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors").eval()
    a, b = predict(model, xc, yc, xt, mask_c), predict(again, xc, yc, xt, mask_c)
    assert torch.equal(a.loc, b.loc) and torch.equal(a.scale, b.scale)
    assert again.config == model.config


def test_pickle_checkpoints_are_refused(tmp_path):
    model = tiny("cnp")
    path = tmp_path / "evil.pt"
    torch.save(model.state_dict(), path)  # a zip archive holding a pickle
    with pytest.raises(ValueError, match="pickle"):
        load(path)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(b"\x80\x04\x95" + b"\x00" * 32)
    with pytest.raises(ValueError, match="pickle"):
        load(raw)


def test_weights_of_another_model_are_refused(tmp_path):
    save(tiny("cnp"), tmp_path / "cnp.safetensors")
    from geonp.checkpoint import read_checkpoint, write_checkpoint

    tensors, meta = read_checkpoint(tmp_path / "cnp.safetensors")
    meta["model"] = tiny("rcnp").config  # header claims rcnp, weights are cnp's
    write_checkpoint(tmp_path / "mixed.safetensors", tensors, meta)
    with pytest.raises(ValueError, match="do not fit"):
        load(tmp_path / "mixed.safetensors")


@pytest.mark.parametrize("name", ["te-pt-tnp", "tnp", "cnp"])
def test_bad_arguments_raise_value_errors_naming_the_problem(name):
    model = tiny(name)
    xc, yc, xt, mask_c = random_tasks()
    with pytest.raises(ValueError, match="dim_x"):
        model(torch.zeros(1, 4, 2), torch.zeros(1, 4, 1), torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match="dim_y"):
        model(torch.zeros(1, 4, 1), torch.zeros(1, 4, 3), torch.zeros(1, 3, 1))
    with pytest.raises(ValueError, match="context length"):
        model(torch.zeros(1, 4, 1), torch.zeros(1, 5, 1), torch.zeros(1, 3, 1))
    bad = yc.clone()
    bad[1, 2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"yc contains NaN or inf .*task 1, point 2"):
        model(xc, bad, xt, mask_c)
    with pytest.raises(ValueError, match="xt contains NaN"):
        model(xc, yc, xt.clone().fill_(float("nan")), mask_c)
    empty = mask_c.clone()
    empty[2] = False
    with pytest.raises(ValueError, match=r"empty context in task\(s\) \[2\]"):
        model(xc, yc, xt, empty)
    with pytest.raises(ValueError, match="mask_c"):
        model(xc, yc, xt, mask_c.float())
    with pytest.raises(ValueError, match="shape"):
        model(xc[0], yc[0], xt[0])


def test_unknown_names_and_presets():
    with pytest.raises(ValueError, match="unknown model name 'kriging-xl'"):
        build("kriging-xl", 1, 1)
    with pytest.raises(ValueError, match="unknown preset"):
        build("tnp", 1, 1, preset="huge")
    with pytest.raises(ValueError, match="bad argument"):
        build("tnp", 1, 1, num_pseudo=4)


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "geonp/weights").glob("*.safetensors"))
                         + sorted((REPO / "pipelines/weights").glob("*.safetensors")), ids=lambda p: p.name)
def test_every_committed_checkpoint_loads_as_it_is(path):
    """Shipped and candidate weights alike load strictly, with no translation of old arguments."""
    model = load(path)
    assert model.config["name"] == path.stem.split("-")[0] or path.stem.startswith(model.config["name"])


def test_a_variant_that_lost_is_not_an_argument():
    """The learned gate between decoder and kriging means lost (accuracy_ablation.md, commit 3ab7466): no
    switch of the shipped class asks for it, and a config that names it gets one line."""
    with pytest.raises(ValueError, match="bad argument for model 'te-pt-tnp'.*kriging_mix"):
        build("te-pt-tnp", 2, 1, preset="tiny", kriging_mix="gate")


def test_memory_knobs_do_not_make_a_different_model():
    from geonp.models.registry import same_model

    a = build("te-tnp", 1, 1, preset="tiny").config
    b = build("te-tnp", 1, 1, preset="tiny", max_block_elems=1000).config
    c = build("te-tnp", 1, 1, preset="tiny", num_layers=3).config
    assert same_model(a, b) and not same_model(a, c)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_blocks_follow_the_device_the_model_is_on(device):
    """for_prediction / for_training size the attention blocks and the kriging head's slices for
    the device the weights are on: cache-sized on a CPU, a few launches a window on a GPU."""
    from geonp.models import local_kriging, te_attention

    model = build("te-pt-tnp", dim_x=6, dim_y=1).to(device)  # the shipped model: 3 locations, 3 covariates
    gpu = device == "cuda"

    def sizes():
        attention = {m.max_block_elems for m in model.modules() if isinstance(m, te_attention.TEAttention)}
        kriging = {m.cache_elems for m in model.modules() if isinstance(m, local_kriging.LocalKriging)}
        return attention, kriging

    slices = local_kriging.GPU_CACHE_ELEMS if gpu else local_kriging.CACHE_ELEMS
    assert model.for_training() is model and model.training
    assert sizes() == ({te_attention.TRAIN_BLOCK_ELEMS}, {slices})
    model.for_prediction()
    assert sizes() == ({te_attention.GPU_PREDICT_BLOCK_ELEMS if gpu else te_attention.PREDICT_BLOCK_ELEMS}, {slices})
    assert not model.training


def test_gpu_block_sizes_give_the_cpu_answer():
    """The GPU's larger blocks, run on the CPU, predict what the CPU's blocks do (float sums aside)."""
    from geonp.models import local_kriging, te_attention

    torch.manual_seed(0)
    model = build("te-pt-tnp", dim_x=6, dim_y=1).for_prediction()
    xc, xt = torch.rand(2, 300, 6) * 4, torch.rand(2, 200, 6) * 4
    yc = torch.randn(2, 300, 1)
    with torch.no_grad():
        small = model(xc, yc, xt)
        for m in model.modules():
            if isinstance(m, te_attention.TEAttention):
                m.max_block_elems = te_attention.GPU_PREDICT_BLOCK_ELEMS
            if isinstance(m, local_kriging.LocalKriging):
                m.cache_elems = local_kriging.GPU_CACHE_ELEMS
        large = model(xc, yc, xt)
    torch.testing.assert_close(large.loc, small.loc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(large.scale, small.scale, atol=1e-5, rtol=1e-5)
