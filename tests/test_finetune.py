"""Self-supervised fine-tuning on the cube (``--fit-steps``): deterministic, snapshot-able, and it learns."""

from __future__ import annotations

import copy

import torch
from conftest import smooth_cube

from geonp.fill.finetune import finetune
from geonp.fill.options import FitOptions
from geonp.fill.plan import plan

CPU = torch.device("cpu")


def _plan(checkpoint):
    return plan(smooth_cube(t=3), "sst", "te-pt-tnp", checkpoint=checkpoint, device="cpu", seed=3)


def test_the_first_steps_of_a_longer_run_are_the_shorter_run(tiny_checkpoint, one_thread):
    p = _plan(tiny_checkpoint)
    snaps = {}
    finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=6, batch_size=4), 3,
             on_step=lambda step, m, loss: snaps.__setitem__(step, {k: v.clone() for k, v in m.state_dict().items()}))
    short = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=4, batch_size=4), 3)
    assert sorted(snaps) == [1, 2, 3, 4, 5, 6]
    for k, v in short.state_dict().items():
        torch.testing.assert_close(v, snaps[4][k], atol=0, rtol=0)
    assert any(not torch.equal(v, snaps[6][k]) for k, v in short.state_dict().items())


def test_fine_tuning_lowers_the_loss_on_the_cubes_own_cells(tiny_checkpoint, one_thread):
    from geonp.fill.finetune import FieldWindows
    from geonp.metrics import task_log_likelihood

    p = _plan(tiny_checkpoint)
    held_out = [FieldWindows(p.fields, p.spec, seed=99, dim_x=3).sample(8) for _ in range(4)]  # never trained on

    @torch.no_grad()
    def nll(model) -> float:
        model.eval()
        return -torch.cat([task_log_likelihood(model(b.xc, b.yc, b.xt, b.mask_c, b.mask_t), b.yt, b.mask_t)
                           for b in held_out]).mean().item()

    messages = []
    tuned = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=40, batch_size=4, lr=1e-3), 3,
                     say=messages.append)
    assert len(messages) == 5  # "fine-tuning: step N/40, NLL x" every 8 steps
    before, after = nll(p.choice.model), nll(tuned)
    assert after < before - 0.1, (before, after)


def test_the_cli_and_the_python_api_share_one_fit_steps_default(tiny_checkpoint, one_thread):
    import inspect

    import geonp
    from geonp.cli import _parser
    from geonp.demo import run_demo
    steps = FitOptions().steps
    assert inspect.signature(run_demo).parameters["fit_steps"].default == steps
    for command in (["infill", "in.nc", "-o", "out.zarr"], ["evaluate", "in.nc", "--var", "v", "--model", "m"]):
        assert _parser().parse_args(command).fit_steps == steps
    out = geonp.infill(smooth_cube(t=2, r=20, c=20), "sst", checkpoint=tiny_checkpoint)
    assert out.attrs["geonp_fit_steps"] == steps and f'"steps": {steps}' in out.attrs["geonp_options"]


def test_wide_clouds_change_the_fine_tuning_windows(tiny_checkpoint, one_thread):
    p = _plan(tiny_checkpoint)
    plain = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=2, batch_size=4), 3)
    wide = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=2, batch_size=4, wide_clouds=1.0), 3)
    assert any(not torch.equal(v, wide.state_dict()[k]) for k, v in plain.state_dict().items())


def test_own_gaps_copy_the_cubes_gaps_deterministically(tiny_checkpoint, one_thread):
    from geonp.fill.finetune import FieldWindows

    p = _plan(tiny_checkpoint)
    plain = FieldWindows(p.fields, p.spec, seed=5, dim_x=3, own_gaps=0.0).sample(8)
    own = FieldWindows(p.fields, p.spec, seed=5, dim_x=3, own_gaps=1.0).sample(8)
    again = FieldWindows(p.fields, p.spec, seed=5, dim_x=3, own_gaps=1.0).sample(8)
    torch.testing.assert_close(own.xt, again.xt, atol=0, rtol=0)  # one seed, one set of windows
    assert own.xt.shape != plain.xt.shape or not torch.equal(own.xt, plain.xt)
    # Windows under the cube's own gaps (a 10% scatter and a hole) hide fewer cells than
    # synthetic clouds of 10-70% cover do.
    assert own.mask_t.sum() < plain.mask_t.sum()


def test_windows_cut_from_a_field_in_memory_are_those_read_slab_by_slab(tiny_checkpoint, one_thread, monkeypatch):
    """Small fields are read into memory once (IN_MEMORY_CELLS); larger ones a slab a window: the
    same windows, bit for bit, own gaps included."""
    from geonp.fill import finetune as ft

    p = _plan(tiny_checkpoint)
    memory = ft.FieldWindows(p.fields, p.spec, seed=5, dim_x=3, own_gaps=0.5)
    batches = [memory.sample(8) for _ in range(3)]
    assert memory._in_memory  # the small cube was held in memory
    monkeypatch.setattr(ft, "IN_MEMORY_CELLS", 0)
    slabs = ft.FieldWindows(p.fields, p.spec, seed=5, dim_x=3, own_gaps=0.5)
    for batch in batches:
        again = slabs.sample(8)
        for name in ("xc", "yc", "xt", "yt", "mask_c", "mask_t"):
            torch.testing.assert_close(getattr(again, name), getattr(batch, name), atol=0, rtol=0)
    assert not slabs._in_memory


def test_with_history_folds_fine_tuning_hides_the_cells_the_covariates_were_computed_without(tiny_checkpoint,
                                                                                             one_thread):
    """A field with folds (a model with history covariates, ``FitOptions.history_folds``): every
    fine-tuning window's targets are one fold's hidden cells, and none of them is context."""
    import numpy as np

    from geonp.fill.finetune import FieldWindows
    from geonp.tasks.history import history_folds

    p = plan(smooth_cube(t=6), "sst", "te-pt-tnp", checkpoint=tiny_checkpoint, device="cpu", seed=3)
    f = p.fields[0]
    f.folds = history_folds(f.whole(), f.valid, ["dineof"], 3)
    assert len(f.folds) == 3
    for fold in f.folds:  # the covariate channel marks the hidden cells, so the inputs say which are which
        fold.covariates = fold.hidden[None].astype(np.float32)
    batch = FieldWindows(p.fields, p.spec, seed=5, dim_x=4, own_gaps=0.0).sample(8)
    xt, xc = batch.xt[batch.mask_t], batch.xc[batch.mask_c]
    for b in range(len(batch.xt)):
        marks_t, marks_c = batch.xt[b, batch.mask_t[b], 3], batch.xc[b, batch.mask_c[b], 3]
        assert marks_t.min() > marks_c.max()  # targets hidden, context not
    assert len(xt) and len(xc)


def test_fine_tuning_is_trainings_step_without_the_run_machinery(tiny_checkpoint, one_thread):
    """Fine-tuning takes training's optimizer step (geonp.train_step) without the resumable run's
    loop: the same steps through geonp.train.train give the same weights, bit for bit."""
    from geonp.fill.finetune import FieldWindows
    from geonp.train import TrainConfig, train

    p = _plan(tiny_checkpoint)
    tuned = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=3, batch_size=4), 3)
    cfg = TrainConfig(model=p.choice.model.registry_name, out_dir=None, steps=3, batch_size=4, lr=1e-4,
                      weight_decay=0.0, clip_grad_norm=1.0, val_tasks=0, seed=3, val_seed=4, device="cpu")
    source = FieldWindows(p.fields, p.spec, 3, p.choice.model.dim_x, None, 0.0, FitOptions().own_gaps)
    start = copy.deepcopy(p.choice.model).for_training()
    trained = train(cfg, progress=False, model=start, source=source).model.for_prediction()
    for k, v in tuned.state_dict().items():
        torch.testing.assert_close(v, trained.state_dict()[k], atol=0, rtol=0)


def test_head_scope_changes_the_head_alone(tiny_checkpoint, one_thread):
    """``scope="head"``: the encoder's weights stay as they were, bit for bit, the head's move, and
    the returned model's weights can all be trained again; a scope that is not one is refused."""
    import pytest

    from geonp.fill.finetune import HEAD_MODULES

    p = _plan(tiny_checkpoint)
    before = {k: v.clone() for k, v in p.choice.model.state_dict().items()}
    tuned = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=3, batch_size=4, scope="head"), 3)
    changed = {k for k, v in tuned.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.split(".")[0] in HEAD_MODULES for k in changed)
    assert any(k.startswith("decoder.") for k in changed)
    assert all(q.requires_grad for q in tuned.parameters())
    with pytest.raises(ValueError, match="fit scope must be one of all, upper, head"):
        FitOptions(scope="encoder")


def test_upper_scope_leaves_the_first_layer_and_what_it_reads_as_they_were(tiny_checkpoint, one_thread):
    """``scope="upper"``: the token embedding, the pseudo-tokens, Eq. 11's maps and every layer list's
    first entry stay as they were, bit for bit; the later layers and the head move; a model without
    layer lists is refused in one line."""
    import pytest

    from geonp.fill.finetune import LOWER_MODULES, upper_parameters
    from geonp.models import build

    p = _plan(tiny_checkpoint)
    before = {k: v.clone() for k, v in p.choice.model.state_dict().items()}
    tuned = finetune(p.choice.model, p.fields, p.spec, CPU, FitOptions(steps=3, batch_size=4, scope="upper"), 3)
    changed = {k for k, v in tuned.state_dict().items() if not torch.equal(v, before[k])}
    lists = {name for name, module in tuned.named_children() if isinstance(module, torch.nn.ModuleList)}
    assert {"to_pseudo", "to_context", "to_target"} <= lists
    lower = lambda k: k.split(".")[0] in LOWER_MODULES or k.split(".")[0] in lists and k.split(".")[1] == "0"  # noqa: E731
    assert changed and not any(lower(k) for k in changed)
    assert any(k.startswith("to_pseudo.1.") for k in changed) and any(k.startswith("decoder.") for k in changed)
    assert all(q.requires_grad for q in tuned.parameters())
    with pytest.raises(ValueError, match="fit scope 'upper': CNP has no list of encoder layers"):
        upper_parameters(build("cnp", 1, 1))


def test_plain_adamw_updates_as_torch_adamw_bit_for_bit():
    """Fine-tuning's optimizer skips torch.optim's import of torch._dynamo; its arithmetic is
    torch.optim.AdamW's (single-tensor path), weight decay, a frozen parameter and a layer used
    every other step (so parameters at different step counts) included."""
    from geonp.train_step import PlainAdamW

    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2), torch.nn.Linear(5, 2))
    theirs = copy.deepcopy(ours)
    for model in (ours, theirs):
        model[2].bias.requires_grad_(False)
    opts = [PlainAdamW(ours.parameters(), 3e-2, weight_decay=0.1),
            torch.optim.AdamW(theirs.parameters(), lr=3e-2, weight_decay=0.1, foreach=False)]
    for step in range(5):
        x = torch.randn(16, 5)
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad(set_to_none=True)
            loss = model[:3](x).square().mean()
            if step % 2:
                loss = loss + model[3](x).square().mean()
            loss.backward()
            for group in opt.param_groups:
                group["lr"] = 3e-2 / (step + 1)  # as optimizer_step sets it every step
            opt.step()
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
