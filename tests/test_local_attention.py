"""Local TE attention (targets -> their k nearest context points): neighbour search, the model
properties every TE model must keep, and growing a trained model with it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import random_tasks

from geonp.models import build, cpu_build, local_attention, save
from geonp.models.local_attention import nearest_neighbours
from geonp.train_state import initialise_from


def local_model(dx: int = 2, k: int = 4, seed: int = 0, weights: list[float] | None = None,
                kriging: dict | None = None):
    """A tiny te-pt-tnp with local attention to ``k`` neighbours (and a kriging head of these
    settings) whose zero-initialised branches are switched on."""
    torch.manual_seed(seed)
    model = build("te-pt-tnp", dx, 1, preset="tiny", local_attention={"neighbours": k, "weights": weights},
                  kriging=kriging)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in ("_local", "kriging")):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def test_nearest_neighbours_match_a_brute_force_search():
    g = torch.Generator().manual_seed(1)
    xq, xk = torch.rand(2, 7, 3, generator=g), torch.rand(2, 11, 3, generator=g)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 4:] = False  # task 1 has 4 keys: fewer than k
    weights = torch.tensor([0.25, 1.0, 0.0])  # time counted a quarter, the last input ignored
    index, valid = nearest_neighbours(xq, xk, mask, 5, weights)
    assert index.shape == valid.shape == (2, 7, 5)
    for b in range(2):
        keys = np.flatnonzero(mask[b].numpy())
        d = (((xq[b, :, None] - xk[b, None, keys]) * weights) ** 2).sum(-1).numpy()
        for i in range(7):
            want = keys[np.argsort(d[i], kind="stable")[:5]]
            got = index[b, i][valid[b, i]].numpy()
            np.testing.assert_array_equal(got, want)
    assert valid[0].all() and valid[1, :, :4].all() and not valid[1, :, 4:].any()



def _topk_ties_from_the_end(self, k, dim=-1, largest=True, sorted=True):
    """``topk`` breaking ties the other way round, as another device's kernel may."""
    n = self.shape[dim]
    values, indices = _TOPK(self.flip(dim), k, dim=dim, largest=largest, sorted=sorted)
    return torch.return_types.topk((values, n - 1 - indices))


_TOPK = torch.Tensor.topk


@pytest.mark.parametrize("quadrants", [None, (0, 1)])
def test_grid_ties_go_to_the_lower_index_whatever_topk_does(monkeypatch, quadrants):
    """On a grid many keys are equally far; the kept keys and their order are (distance, index),
    so a device whose topk breaks ties differently fills the same cube the same way."""
    rows, cols = torch.meshgrid(torch.arange(9.0), torch.arange(9.0), indexing="ij")
    xk = torch.stack([rows.flatten(), cols.flatten()], -1)[None]  # [1, 81, 2], ties everywhere
    xq = torch.tensor([[[4.0, 4.0], [4.5, 4.5], [0.0, 3.0], [2.0, 7.5]]])
    mask = torch.ones(1, 81, dtype=torch.bool)
    mask[0, 40] = False  # the centre absent
    index, valid = nearest_neighbours(xq, xk, mask, 8, quadrant_dims=quadrants)
    d = ((xq[0, :, None] - xk[0, None]) ** 2).sum(-1).numpy()
    d[:, 40] = np.inf
    if quadrants is None:
        for i in range(xq.shape[1]):
            np.testing.assert_array_equal(index[0, i].numpy(), np.argsort(d[i], kind="stable")[:8])
    monkeypatch.setattr(torch.Tensor, "topk", _topk_ties_from_the_end)
    other, other_valid = nearest_neighbours(xq, xk, mask, 8, quadrant_dims=quadrants)
    assert torch.equal(other[valid], index[valid]) and torch.equal(other_valid, valid)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 9])
def test_smallest_ranks_by_distance_then_index(monkeypatch, k):
    """Small-integer distances (ties beyond the 2k candidates too) and absent keys (inf): the kept
    keys are numpy's stable argsort's, whichever way topk breaks ties."""
    from geonp.models.local_attention import smallest

    g = torch.Generator().manual_seed(k)
    d2 = torch.randint(0, 4, (3, 5, 12), generator=g).float()
    d2[0, 0, :10] = float("inf")  # fewer present keys than k for some k
    want = np.argsort(d2.numpy(), axis=-1, kind="stable")[..., :k]
    for topk in (_TOPK, _topk_ties_from_the_end):
        monkeypatch.setattr(torch.Tensor, "topk", topk)
        values, index = smallest(d2, k)
        present = torch.isfinite(values)
        np.testing.assert_array_equal(index[present].numpy(), torch.from_numpy(want)[present].numpy())
        torch.testing.assert_close(values, d2.gather(-1, index))


def test_quadrant_search_takes_the_nearest_keys_of_each_quadrant():
    """A target at the edge of a gap: the plain search takes only the near side, the quadrant
    search the k // 4 nearest of each quadrant, far side included (checked by brute force)."""
    g = torch.Generator().manual_seed(2)
    xk = torch.rand(1, 60, 3, generator=g) * 10 - 5
    xk[0, :40, 2] = xk[0, :40, 2].abs() + 0.5  # two thirds of the keys on one side of the target
    xq = torch.zeros(1, 1, 3)
    mask = torch.ones(1, 60, dtype=torch.bool)
    index, valid = nearest_neighbours(xq, xk, mask, 8, quadrant_dims=(1, 2))
    assert index.shape == (1, 1, 8) and valid.all()
    du, dv = xk[0, :, 1].numpy(), xk[0, :, 2].numpy()
    d = (xk[0] ** 2).sum(-1).numpy()
    quadrant = np.select([(dv > 0) & (du >= 0), (dv <= 0) & (du > 0), (dv < 0) & (du <= 0)], [0, 1, 2], 3)
    for q in range(4):
        members = np.flatnonzero(quadrant == q)
        want = members[np.argsort(d[members], kind="stable")[:2]]
        np.testing.assert_array_equal(index[0, 0, 2 * q:2 * q + 2].numpy(), want)
    plain, _ = nearest_neighbours(xq, xk, mask, 8)
    assert len(set(quadrant[plain[0, 0].numpy()])) < 4  # the plain search misses a side here
    with pytest.raises(ValueError, match="k >= 4"):
        nearest_neighbours(xq, xk, mask, 3, quadrant_dims=(1, 2))


needs_kernels = pytest.mark.skipif(not cpu_build.can_build(), reason="no C++ compiler or ninja to build the kernels")


@needs_kernels
@pytest.mark.parametrize("quadrants", [None, (0, 1)])
@pytest.mark.parametrize("grid", [False, True])
def test_the_search_kernel_keeps_the_keys_pytorch_keeps(quadrants, grid, monkeypatch):
    """The CPU kernel against the PyTorch search, which GPUs and float64 inputs run: the same
    keys in the same order, the same missing slots, on random locations and on a grid (ties)."""
    g = torch.Generator().manual_seed(5)
    if grid:
        rows, cols = torch.meshgrid(torch.arange(12.0), torch.arange(12.0), indexing="ij")
        xk = torch.stack([rows.flatten(), cols.flatten(), torch.zeros(144)], -1).expand(3, 144, 3).contiguous()
        xq = torch.randint(0, 24, (3, 40, 3), generator=g).float() / 2
    else:
        xk, xq = torch.randn(3, 144, 3, generator=g), torch.randn(3, 40, 3, generator=g)
    mask = torch.rand(3, 144, generator=g) > 0.3
    mask[2, 10:] = False  # fewer keys than asked for: slots left empty
    weights = torch.tensor([1.0, 0.5, 2.0])
    kernel = nearest_neighbours(xq, xk, mask, 16, weights, quadrant_dims=quadrants)
    monkeypatch.setattr(local_attention, "_kernel_takes", lambda *a: False)
    torch_search = nearest_neighbours(xq, xk, mask, 16, weights, quadrant_dims=quadrants)
    assert torch.equal(kernel[1], torch_search[1]) and not kernel[1][2].all()
    assert torch.equal(kernel[0][kernel[1]], torch_search[0][torch_search[1]])


@needs_kernels
def test_the_search_kernel_takes_what_pytorch_s_search_takes(monkeypatch):
    """Edge cases against the PyTorch search: no keys, k = 0, a key at a NaN location (never
    kept), negative quadrant dimensions, and a batch of one key set for several query sets."""
    g = torch.Generator().manual_seed(6)
    xq, xk = torch.randn(2, 9, 3, generator=g), torch.randn(2, 30, 3, generator=g)
    xk[1, 4, 0] = float("nan")
    mask = torch.ones(2, 30, dtype=torch.bool)
    cases = [(xq, xk[:, :0], mask[:, :0], 8, None), (xq, xk, mask, 0, None), (xq, xk, mask, 8, None),
             (xq, xk, mask, 8, (-3, -2)), (xq, xk[:1], mask[:1], 8, (0, 1))]
    assert all(local_attention._kernel_takes(c[0], c[1], c[2]) for c in cases[:4])
    kernel = [nearest_neighbours(*c[:4], quadrant_dims=c[4]) for c in cases]
    monkeypatch.setattr(local_attention, "_kernel_takes", lambda *a: False)
    torch_search = [nearest_neighbours(*c[:4], quadrant_dims=c[4]) for c in cases]
    for (i1, v1), (i2, v2) in zip(kernel, torch_search):
        assert torch.equal(v1, v2) and torch.equal(i1[v1], i2[v2])
    index, valid = kernel[2]
    assert not (index[1][valid[1]] == 4).any()  # the key at a NaN location is never kept
    assert kernel[4][0].shape == (2, 9, 8)  # one key set for two query sets: broadcast, by PyTorch


def test_gather_rows_broadcasts_one_index_over_the_batch():
    from geonp.models.local_attention import gather_rows

    t = torch.arange(24.0).view(2, 4, 3)
    index = torch.tensor([[[3, 0]]])  # [1, 1, 2]
    assert torch.equal(gather_rows(t, index), torch.stack([t[0, [3, 0]], t[1, [3, 0]]])[:, None])


def test_rows_reached_marks_every_wanted_querys_valid_neighbours_and_no_other_row():
    from geonp.models.local_attention import rows_reached

    index = torch.tensor([[[0, 2], [2, 2], [4, 1]], [[3, 3], [0, 1], [1, 0]]])  # [2, 3, 2], repeats
    valid = torch.tensor([[[True, True], [True, False], [True, False]], [[True, False], [False, True], [True, True]]])
    mask_q = torch.tensor([[True, True, False], [True, True, True]])
    assert rows_reached(index, valid, 5, mask_q).tolist() == [[True, False, True, False, False],
                                                                [True, True, False, True, False]]
    assert rows_reached(index, valid, 5)[0].tolist() == [True, False, True, False, True]  # every query wanted


@pytest.mark.skipif(not cpu_build.can_build(), reason="no C++ compiler or ninja to build the kernel")
def test_the_last_context_update_skips_rows_no_target_reaches_and_changes_no_float(monkeypatch, one_thread):
    """te-pt-tnp computes its last layer's context tokens only where some wanted target has them as
    neighbours (the fused kernel skips the others): predictions and every gradient are the same
    floats as when every context row is computed."""
    xc, yc, xt, mask_c = random_tasks(b=3, nc=40, nt=11, dx=2, seed=3)
    mask_t = torch.ones(3, 11, dtype=torch.bool)
    mask_t[1, 6:] = False
    model = local_model(k=3, kriging={"neighbours": 4}).train()
    with torch.no_grad():  # location updates on, so dx reaches the result too
        for module in model.modules():
            if hasattr(module, "loc_mlp") and module.loc_mlp is not None:
                torch.nn.init.normal_(module.loc_mlp[-1].weight, std=0.3)
    results, reached = [], []

    def every_row(index, valid, num_rows, mask_q=None):
        reached.append(int(local_attention.rows_reached(index, valid, num_rows, mask_q).sum()))
        return torch.ones(index.shape[0], num_rows, dtype=torch.bool)

    import geonp.models.tnp as tnp

    for patch in (False, True):
        if patch:
            monkeypatch.setattr(tnp, "rows_reached", every_row)
        model.zero_grad()
        dist = model(xc, yc, xt, mask_c, mask_t)
        (-(dist.log_prob(torch.ones_like(dist.loc))[..., 0] * mask_t).sum()).backward()
        results.append([dist.loc[mask_t].detach(), dist.scale[mask_t].detach()]
                       + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert reached[0] < int(mask_c.sum())  # rows were skipped
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_local_attention_of_the_wanted_queries_alone_gives_their_values_and_gradients():
    """``mask_q``: the block packs the wanted queries of every task into one (keys of all tasks,
    indices shifted); their outputs and the gradients of a loss on them match those of the block
    run on every query (rounding: sums over other row counts), and the other rows get the MLP
    branch alone."""
    from geonp.models.local_attention import TELocalAttentionBlock

    torch.manual_seed(4)
    block = TELocalAttentionBlock(16, 2, 8, 2, 12)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    xc, _, xt, mask_c = random_tasks(b=3, nc=20, nt=9, dx=2, seed=2)
    index, valid = nearest_neighbours(xt, xc, mask_c, 5)
    mask_q = torch.rand(3, 9, generator=torch.Generator().manual_seed(1)) < 0.6
    mask_q[2] = False  # a task with no wanted query
    zq, zk = torch.randn(3, 9, 16), torch.randn(3, 20, 16)
    results = []
    for wanted in (None, mask_q):
        zq_, zk_ = zq.clone().requires_grad_(), zk.clone().requires_grad_()
        block.zero_grad()
        out = block(zq_, xt, zk_, xc, index, valid, wanted)
        out[mask_q].square().sum().backward()
        results.append([out[mask_q], zq_.grad, zk_.grad] + [p.grad.clone() for p in block.parameters()])
        if wanted is not None:
            rest = zq[~mask_q]
            torch.testing.assert_close(out[~mask_q], rest + block.ff(block.norm_ff(rest)), atol=0, rtol=0)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # no wanted query anywhere: every row gets the MLP branch alone
        out = block(zq, xt, zk, xc, index, valid, torch.zeros_like(mask_q))
        torch.testing.assert_close(out, zq + block.ff(block.norm_ff(zq)), atol=0, rtol=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as training on a GPU runs it
            mixed = block(zq, xt, zk, xc, index, valid, mask_q)
            unpacked = block(zq, xt, zk, xc, index, valid)
    assert mixed.dtype == unpacked.dtype
    torch.testing.assert_close(mixed[mask_q], unpacked[mask_q], atol=0.1, rtol=0.05)


def test_quadrant_kriging_keeps_translation_equivariance_and_padding():
    xc, yc, xt, mask_c = random_tasks(dx=3)
    model = local_model(dx=3, k=4, kriging={"neighbours": 8, "quadrant_dims": [1, 2]})
    tau = torch.tensor([0.4, 3.7, -1.3])
    with torch.no_grad():
        a, b = model(xc, yc, xt, mask_c), model(xc + tau, yc, xt + tau, mask_c)
        one = model(xc[:1, :7], yc[:1, :7], xt[:1])  # task 0 without its padding
        plain = local_model(dx=3, k=4, kriging={"neighbours": 8})(xc, yc, xt, mask_c)
    torch.testing.assert_close(a.loc, b.loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.loc[:1], one.loc, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a.loc, plain.loc)  # the same weights, other neighbours
    with pytest.raises(ValueError, match="kriging quadrant_dims"):
        local_model(dx=3, k=4, kriging={"quadrant_dims": [1, 3]})

def test_local_attention_keeps_translation_equivariance_and_padding():
    xc, yc, xt, mask_c = random_tasks(dx=2)
    model = local_model(weights=[0.5, 1.0], kriging={"neighbours": 4})
    tau = torch.tensor([3.7, -1.3])
    with torch.no_grad():
        a, b = model(xc, yc, xt, mask_c), model(xc + tau, yc, xt + tau, mask_c)
        one = model(xc[:1, :7], yc[:1, :7], xt[:1])  # task 0 without its padding
    torch.testing.assert_close(a.loc, b.loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.scale, b.scale, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.loc[:1], one.loc, atol=1e-5, rtol=1e-5)


def test_local_attention_changes_predictions_once_switched_on():
    xc, yc, xt, mask_c = random_tasks(dx=2)
    torch.manual_seed(0)
    plain = build("te-pt-tnp", 2, 1, preset="tiny").eval()
    model = local_model()
    with torch.no_grad():
        assert (plain(xc, yc, xt, mask_c).loc - model(xc, yc, xt, mask_c).loc).abs().max() > 1e-3


def test_query_chunks_give_the_same_values_and_gradients():
    xc, yc, xt, mask_c = random_tasks(b=2, nc=23, nt=17, dx=2)
    model = local_model(k=6, kriging={"neighbours": 6}).train()
    results = []
    for elems in (2**30, 64):  # one chunk vs. one query at a time
        for module in model.modules():
            if hasattr(module, "max_block_elems"):
                module.max_block_elems = elems
        model.zero_grad()
        dist = model(xc, yc, xt, mask_c)
        (-dist.log_prob(torch.ones_like(dist.loc)).mean()).backward()
        grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        results.append((dist.loc.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-4)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_a_target_on_a_context_point_sees_that_point():
    """The nearest context point reaches the target through the local path: changing its value
    moves the prediction there more than changing the farthest point's."""
    g = torch.Generator().manual_seed(3)
    xc = torch.rand(1, 40, 2, generator=g) * 4
    yc = torch.randn(1, 40, 1, generator=g)
    xt = xc[:, :1].clone()
    model = local_model(k=4)
    far = int(((xc[0] - xt[0, 0]) ** 2).sum(-1).argmax())
    with torch.no_grad():
        base = model(xc, yc, xt).loc
        near_y, far_y = yc.clone(), yc.clone()
        near_y[0, 0] += 1.0
        far_y[0, far] += 1.0
        near_change = (model(xc, near_y, xt).loc - base).abs().item()
        far_change = (model(xc, far_y, xt).loc - base).abs().item()
        off = copy.deepcopy(model)  # the same model with its local branches switched off (zeroed)
        for name, p in off.named_parameters():
            if "_local" in name:
                p.zero_()
        near_change_off = (off(xc, near_y, xt).loc - off(xc, yc, xt).loc).abs().item()
    assert near_change > far_change
    assert near_change > 2 * near_change_off  # it is the local path that carries it (measured 3.3x)


def test_growing_a_trained_model_starts_from_its_predictions(tmp_path):
    xc, yc, xt, mask_c = random_tasks(dx=2)
    torch.manual_seed(0)
    trained = build("te-pt-tnp", 2, 1, preset="tiny")
    save(trained, tmp_path / "trained.safetensors")
    torch.manual_seed(1)
    grown = build("te-pt-tnp", 2, 1, preset="tiny", local_attention={"neighbours": 8})
    copied = initialise_from(grown, tmp_path / "trained.safetensors")
    assert len(copied) == len(trained.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(grown.eval()(xc, yc, xt, mask_c).loc, trained.eval()(xc, yc, xt, mask_c).loc)
        # With the kriging head, the kriging mean is the prediction from the start; sigma is the
        # trained decoder's, as the head's features enter the tokens through zero weights.
        kriged = build("te-pt-tnp", 2, 1, preset="tiny", local_attention={"neighbours": 8}, kriging={"neighbours": 8})
        initialise_from(kriged, tmp_path / "trained.safetensors")
        torch.testing.assert_close(kriged.eval()(xc, yc, xt, mask_c).scale, trained(xc, yc, xt, mask_c).scale)
    with pytest.raises(ValueError, match="holds model 'te-pt-tnp', not 'te-tnp'"):
        initialise_from(build("te-tnp", 2, 1, preset="tiny"), tmp_path / "trained.safetensors")


def test_local_parts_are_checked_when_built():
    with pytest.raises(ValueError, match="one weight per location dimension"):
        build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 4, "weights": [1.0, 1.0]})
    with pytest.raises(ValueError, match="local_attention neighbours must be .* at least 1"):
        build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 0})
    with pytest.raises(ValueError, match="kriging: unknown setting\\(s\\) kernel"):
        build("te-pt-tnp", 3, 1, preset="tiny", local_attention={"neighbours": 4}, kriging={"kernel": "gaussian"})
    with pytest.raises(ValueError, match="the kriging head needs local attention"):
        build("te-pt-tnp", 3, 1, preset="tiny", kriging={"neighbours": 8})


def test_local_kriging_is_ordinary_kriging():
    """With its initial covariance the head reproduces PyKrige's ordinary kriging (Gaussian model)."""
    from pykrige.ok import OrdinaryKriging

    from geonp.models.local_kriging import INIT_LENGTHSCALES, INIT_NUGGET, INIT_SILL, LocalKriging

    g = torch.Generator().manual_seed(0)
    xc = torch.rand(1, 30, 2, generator=g)
    yc = torch.sin(3 * xc[..., :1]) + torch.cos(2 * xc[..., 1:])
    xt = torch.rand(1, 5, 2, generator=g)
    index, valid = nearest_neighbours(xt, xc, torch.ones(1, 30, dtype=torch.bool), 30)
    mean, logvar = LocalKriging(8, 2)(torch.zeros(1, 5, 8), xt, xc, yc, index, valid)
    nugget = INIT_NUGGET + 1e-4  # the head's jitter acts as nugget too
    # PyKrige's Gaussian variogram is sill (1 - exp(-h^2 / (4/7 range)^2)): range = ell sqrt(2) 7/4.
    params = {"sill": INIT_SILL + nugget, "nugget": nugget, "range": INIT_LENGTHSCALES["gaussian"] * np.sqrt(2) * 7 / 4}
    ok = OrdinaryKriging(xc[0, :, 0].numpy(), xc[0, :, 1].numpy(), yc[0, :, 0].numpy(), variogram_model="gaussian",
                         variogram_parameters=params, exact_values=False)
    z, var = ok.execute("points", xt[0, :, 0].numpy().astype(float), xt[0, :, 1].numpy().astype(float))
    np.testing.assert_allclose(mean[0, :, 0].detach().numpy(), z, atol=1e-4)
    np.testing.assert_allclose(logvar[0, :, 0].exp().detach().numpy(), var, atol=1e-3)


def test_local_kriging_ignores_absent_neighbours():
    from geonp.models.local_kriging import LocalKriging

    xc, yc, xt, mask_c = random_tasks(b=1, nc=12, nt=4, dx=2)
    index, valid = nearest_neighbours(xt, xc, mask_c, 12)  # task 0 has 7 present points: 5 absent slots
    head = LocalKriging(8, 2)
    a = head(torch.zeros(1, 4, 8), xt, xc, yc, index, valid)
    index7, valid7 = nearest_neighbours(xt, xc[:, :7], mask_c[:, :7], 7)
    b = head(torch.zeros(1, 4, 8), xt, xc[:, :7], yc[:, :7], index7, valid7)
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-4)



def test_the_kriging_mean_is_the_prediction_and_the_exponential_kernel_interpolates():
    """The predicted mean is the local kriging head's, sigma the decoder's; the exponential head
    is (nearly) exact at a context point when its nugget is negligible."""
    from geonp.models.local_kriging import LocalKriging

    xc, yc, xt, mask_c = random_tasks(dx=2)
    torch.manual_seed(0)
    model = build("te-pt-tnp", 2, 1, preset="tiny", local_attention={"neighbours": 4},
                  kriging={"neighbours": 8}).eval()
    assert model.kriging.kernel == "exponential" and model.kriging_neighbours == 8
    xc, yc, xt = xc[1:], yc[1:], xt[1:]  # the task without padding: the head is called directly below
    mask_c = torch.ones(xc.shape[:2], dtype=torch.bool)
    with torch.no_grad():
        dist = model(xc, yc, xt, mask_c)
        near = nearest_neighbours(xt, xc, mask_c, 8, model.neighbour_weights)
        zt = model._encode(xc, yc, xt, mask_c, tuple(t[..., :4] for t in near))
        k_mean, _ = model.kriging(zt, xt, xc, yc, *near)
    torch.testing.assert_close(dist.loc, k_mean, atol=1e-6, rtol=0)
    head = LocalKriging(8, 2, "exponential")
    with torch.no_grad():
        head.covariance[-1].bias[-1] = -12.0  # nugget ~ 6e-6
    index, valid = nearest_neighbours(xc, xc, mask_c, 6)
    mean, _ = head(torch.zeros(1, 12, 8), xc, xc, yc, index, valid)
    torch.testing.assert_close(mean, yc, atol=1e-2, rtol=0)  # the 1e-4 jitter smooths a little


def test_spd_solve_gradients_match_autograd_through_cholesky():
    """The kriging head's solve has its backward written out (one more solve, no differentiation
    of the Cholesky factor): it must give autograd's gradients."""
    from geonp.models.kriging_linalg import spd_solve

    torch.manual_seed(0)
    a = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    k = (a @ a.transpose(-1, -2) + 6 * torch.eye(6, dtype=torch.float64)).requires_grad_()
    r = torch.randn(2, 3, 6, 2, dtype=torch.float64, requires_grad=True)
    sym = lambda m: 0.5 * (m + m.transpose(-1, -2))  # noqa: E731 - perturbations stay symmetric
    assert torch.autograd.gradcheck(lambda m, b: spd_solve(sym(m), b), (k, r))
    g = torch.randn(2, 3, 6, 2, dtype=torch.float64)
    ours = torch.autograd.grad(spd_solve(sym(k), r), (k, r), g)
    theirs = torch.autograd.grad(torch.cholesky_solve(r, torch.linalg.cholesky(sym(k))), (k, r), g)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kernel", ["exponential", "matern32", "gaussian"])
def test_kriging_covariance_gradients_match_autograd(kernel):
    """The covariance build has its backward written out; it must match autograd through the
    plain chain of steps, absent neighbours included."""
    from geonp.models.kriging_linalg import JITTER as _JITTER
    from geonp.models.kriging_linalg import NeighbourCovariance as _Covariance
    from geonp.models.kriging_linalg import correlation

    torch.manual_seed(1)
    scaled = torch.randn(2, 3, 5, 3, dtype=torch.float64, requires_grad=True)
    sill = torch.rand(2, 3, dtype=torch.float64).add(0.5).requires_grad_()
    nugget = torch.rand(2, 3, dtype=torch.float64).mul(0.1).requires_grad_()
    ok = (torch.rand(2, 3, 5) > 0.25).double()

    def plain(scaled, sill, nugget):
        diff = scaled[..., :, None, :] - scaled[..., None, :, :]
        pair = ok[..., :, None] * ok[..., None, :]
        k = sill[..., None, None] * correlation(diff.square().sum(-1), kernel) * pair
        return k + torch.diag_embed((nugget[..., None] + _JITTER) * ok + (1 - ok))

    ours = _Covariance.apply(scaled, sill, nugget, ok, kernel)
    torch.testing.assert_close(ours, plain(scaled, sill, nugget))
    g = torch.randn_like(ours)  # not symmetric: the solve's gradient -(K^-1 g) x^T is not either
    for x, y in zip(torch.autograd.grad(ours, (scaled, sill, nugget), g),
                    torch.autograd.grad(plain(scaled, sill, nugget), (scaled, sill, nugget), g)):
        torch.testing.assert_close(x, y)


def test_local_kriging_gives_the_same_answer_a_slice_of_targets_at_a_time():
    """The head works through targets in cache-sized slices; slices of one target must give what
    one pass over all of them gives, gradients included."""
    import geonp.models.local_kriging as lk

    torch.manual_seed(2)
    head = lk.LocalKriging(8, 2, kernel="exponential")
    xc, yc, xt, zt = torch.randn(2, 30, 2), torch.randn(2, 30, 1), torch.randn(2, 7, 2), torch.randn(2, 7, 8)
    mask = torch.rand(2, 30) > 0.2
    index, valid = nearest_neighbours(xt, xc, mask, 12)

    def run():
        zt_ = zt.clone().requires_grad_()
        mean, logvar = head(zt_, xt, xc, yc, index, valid)
        (mean.sum() + logvar.sum()).backward()
        return mean, logvar, zt_.grad

    whole = run()
    head.cache_elems = 1  # one target per slice
    for x, y in zip(run(), whole):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
