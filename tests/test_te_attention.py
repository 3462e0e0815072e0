"""Blocked TE attention (online softmax + checkpointed row blocks) equals the
one-block computation, in values and in gradients, with padding."""

from __future__ import annotations

import pytest
import torch
from conftest import random_tasks

from geonp.models import build


def set_block(model, elems: int) -> None:
    for module in model.modules():
        if hasattr(module, "max_block_elems"):
            module.max_block_elems = elems


@pytest.mark.parametrize("name", ["te-tnp", "te-pt-tnp"])
def test_blocked_attention_matches_one_block_in_values_and_gradients(name):
    xc, yc, xt, mask_c = random_tasks(b=2, nc=23, nt=17, dx=2)
    torch.manual_seed(0)
    model = build(name, 2, 1, preset="tiny")
    for module in model.modules():
        if hasattr(module, "key_block"):
            module.key_block = 5  # several key blocks even at this size
    results = []
    for elems in (2**40, 300):  # one block vs. many small row blocks under checkpointing
        set_block(model, elems)
        model.zero_grad()
        dist = model(xc, yc, xt, mask_c)
        loss = -dist.log_prob(torch.ones_like(dist.loc)).mean()
        loss.backward()
        # A parameter whose output is unused (the last layer's location update) has no
        # gradient without checkpointing and a zero one with it: compare as zeros.
        grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        results.append((dist.loc.detach(), dist.scale.detach(), grads))
    (loc1, scale1, g1), (loc2, scale2, g2) = results
    torch.testing.assert_close(loc1, loc2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scale1, scale2, atol=1e-5, rtol=1e-4)
    assert len(g1) == len(g2) > 0
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_location_updates_follow_eq10_and_keep_equivariance():
    from geonp.models.te_attention import TEAttention

    torch.manual_seed(0)
    attn = TEAttention(dim=8, num_heads=2, head_dim=4, dim_x=1, dim_hidden=8)
    torch.nn.init.normal_(attn.loc_mlp[-1].weight)  # switch the (zero-initialised) update on
    zq, zk = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    xq, xk = torch.randn(1, 3, 1), torch.randn(1, 5, 1)
    mask = torch.ones(1, 5, dtype=torch.bool)
    _, x_new = attn(zq, xq, zk, xk, mask)
    assert not torch.allclose(x_new, xq)
    _, x_shifted = attn(zq, xq + 2.5, zk, xk + 2.5, mask)
    torch.testing.assert_close(x_shifted, x_new + 2.5)  # locations move with the data
    # Padding a key must not change anything.
    zk_p, xk_p = torch.cat([zk, torch.randn(1, 2, 8)], 1), torch.cat([xk, torch.randn(1, 2, 1)], 1)
    mask_p = torch.cat([mask, torch.zeros(1, 2, dtype=torch.bool)], 1)
    out_p, x_p = attn(zq, xq, zk_p, xk_p, mask_p)
    out, _ = attn(zq, xq, zk, xk, mask)
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(x_p, x_new)


def test_pseudo_locations_start_as_weighted_average_of_context():
    torch.manual_seed(0)
    model = build("te-pt-tnp", 1, 1, preset="tiny")
    xc, yc, _, mask_c = random_tasks(b=2, nc=10)
    yc = torch.nan_to_num(yc)
    xc = torch.where(mask_c[..., None], torch.nan_to_num(xc), torch.tensor(1e3))  # padding far away
    zc = model.embed(model._flagged(yc, 1.0))
    with torch.no_grad():
        v = model.initial_pseudo_locations(zc, xc, mask_c) - model.pseudo_offset  # [B, M, 1]
        moved = model.initial_pseudo_locations(zc, torch.where(mask_c[..., None], xc, -xc), mask_c)
        torch.testing.assert_close(moved - model.pseudo_offset, v)  # padding has no say
        q = model.init_q(model.pseudo)  # [M, Dz]
        for b in range(2):  # Eq. 11 over the present points only: softmax(q k^T / sqrt(Dz)) @ xc
            present = mask_c[b]
            k = model.init_k(zc[b, present])  # [Nb, Dz]
            psi = (q @ k.T / q.shape[-1] ** 0.5).softmax(-1)  # [M, Nb]
            torch.testing.assert_close(v[b], psi @ xc[b, present], atol=1e-5, rtol=1e-5)


def test_distance_prior_makes_far_keys_negligible_and_can_be_switched_off():
    from geonp.models.te_attention import TEAttention

    torch.manual_seed(0)
    zk = torch.randn(1, 2, 16)
    xk = torch.tensor([[[0.0, 0.0], [40.0, 0.0]]])  # one key at the query, one 40 units away
    zq, xq = torch.randn(1, 1, 16), torch.zeros(1, 1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    near_only = torch.tensor([[True, False]])
    with torch.no_grad():
        on = TEAttention(16, 4, 4, 2, 8, update_locations=False, distance_prior=True)
        both, _ = on(zq, xq, zk, xk, mask)
        alone, _ = on(zq, xq, zk, xk, near_only)
        torch.testing.assert_close(both, alone, atol=1e-6, rtol=1e-5)  # weight ~exp(-40^2 / 18)
        off = TEAttention(16, 4, 4, 2, 8, update_locations=False, distance_prior=False)
        assert not any("lengthscale" in n for n, _ in off.named_parameters())
        assert (off(zq, xq, zk, xk, mask)[0] - off(zq, xq, zk, xk, near_only)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["te-tnp", "te-pt-tnp"])
@pytest.mark.parametrize("offset", [0.0, 250.0])
def test_fast_path_matches_the_reference_in_values_and_gradients(name, offset):
    """The split/folded kernel MLPs compute the reference form's function (1e-5 in fp32), far from
    the origin too (the fast path centres locations first)."""
    from geonp.models.te_attention import TEAttention, attention_backend

    xc, yc, xt, mask_c = random_tasks(b=2, nc=23, nt=17, dx=3)
    xc, xt = xc + offset, xt + offset
    torch.manual_seed(0)
    model = build(name, 3, 1, preset="tiny")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, TEAttention) and module.loc_mlp is not None:
                torch.nn.init.normal_(module.loc_mlp[-1].weight, std=0.3)  # switch Eq. 10 on
    results = []
    for backend in ("direct", "fast"):
        model.zero_grad()
        with attention_backend(model, backend):  # the backward pass recomputes with the same implementation
            dist = model(xc, yc, xt, mask_c)
            (-dist.log_prob(torch.ones_like(dist.loc)).mean()).backward()
        grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        results.append((dist.loc.detach(), dist.scale.detach(), grads))
    (loc1, scale1, g1), (loc2, scale2, g2) = results
    torch.testing.assert_close(loc2, loc1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scale2, scale1, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_the_backend_is_each_layers_own_and_put_back():
    """attention_backend switches the layers of one model and nothing else; the choice is each
    layer's attribute, not process-wide state, and comes back when the block ends."""
    from geonp.models.te_attention import TEAttention, attention_backend

    model, other = build("te-pt-tnp", 3, 1, preset="tiny"), build("te-tnp", 3, 1, preset="tiny")

    def backends(m):
        return {layer.backend for layer in m.modules() if isinstance(layer, TEAttention)}

    assert backends(model) == backends(other) == {"fused"}
    with attention_backend(model, "direct"):
        assert backends(model) == {"direct"} and backends(other) == {"fused"}
        with attention_backend(model, "fast"):
            assert backends(model) == {"fast"}
        assert backends(model) == {"direct"}
    assert backends(model) == {"fused"}
    with pytest.raises(ValueError, match="unknown TE attention backend 'cuda'"):
        with attention_backend(model, "cuda"):
            pass
    assert backends(model) == {"fused"}


def test_a_backward_pass_outside_the_backend_block_recomputes_with_the_forward_backend():
    """Row blocks checkpointed in the forward pass are recomputed in backward with the implementation
    the forward pass used, wherever backward() is called."""
    from geonp.models.te_attention import TEAttention, attention_backend

    torch.manual_seed(0)
    layer = TEAttention(16, 4, 4, 2, 12, max_block_elems=2000)  # several row blocks: checkpointed
    with torch.no_grad():
        torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)
    g = torch.Generator().manual_seed(1)
    zq, xq = torch.randn(2, 9, 16, generator=g), torch.randn(2, 9, 2, generator=g)
    zk, xk = torch.randn(2, 13, 16, generator=g), torch.randn(2, 13, 2, generator=g)
    mask = torch.ones(2, 13, dtype=torch.bool)
    grads = []
    for inside in (True, False):
        layer.zero_grad()
        q = zq.clone().requires_grad_()
        with attention_backend(layer, "direct"):
            out, x = layer(q, xq, zk, xk, mask)
            if inside:
                (out.square().sum() + x.square().sum()).backward()
        if not inside:
            (out.square().sum() + x.square().sum()).backward()
        grads.append([q.grad.clone()] + [p.grad.clone() for p in layer.parameters() if p.grad is not None])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_checkpointed_row_blocks_give_torch_checkpoints_gradients_without_importing_dynamo_or_sympy():
    """Row blocks recomputed in backward (``recomputed_in_backward``) give the gradients of
    ``torch.utils.checkpoint.checkpoint(use_reentrant=True)`` to the bit, in float32 and under
    bfloat16 autocast, and a forward and backward pass imports neither ``torch._dynamo`` (the
    public wrapper does at its first call) nor SymPy (the shape check of the gradients that
    PyTorch's CheckpointFunction passes on does): seconds of a GPU fill's cold start. In a fresh
    process, since other tests may import them."""
    import subprocess
    import sys

    code = """
import sys, torch
from torch.utils.checkpoint import checkpoint
import geonp.models.te_attention as te
torch.manual_seed(0)
layer = te.TEAttention(16, 4, 4, 2, 12, max_block_elems=2000)  # several row blocks: recomputed
g = torch.Generator().manual_seed(1)
zq, xq = torch.randn(2, 9, 16, generator=g), torch.randn(2, 9, 2, generator=g)
zk, xk = torch.randn(2, 13, 16, generator=g), torch.randn(2, 13, 2, generator=g)
mask = torch.ones(2, 13, dtype=torch.bool)
def grads(bf16):
    layer.zero_grad()
    q, x0 = zq.clone().requires_grad_(), xq.clone().requires_grad_()
    with te.attention_backend(layer, "fast"):  # the Python form, a GPU's (the CPU's kernel has its own)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out, x = layer(q, x0, zk, xk, mask)
        # Backward outside autocast, as training's is: the recompute must replay the forward's state.
        (out.float().square().sum() + x.float().square().sum()).backward()
    return [q.grad.clone(), x0.grad.clone()] + [p.grad.clone() for p in layer.parameters() if p.grad is not None]
ours = [grads(False), grads(True)]
assert "torch._dynamo" not in sys.modules, "torch._dynamo imported"
assert "sympy" not in sys.modules, "sympy imported"
geonps = te.recomputed_in_backward
te.recomputed_in_backward = lambda f, *a: checkpoint(f, *a, use_reentrant=True)
for mine, torchs in zip(ours, [grads(False), grads(True)], strict=True):
    assert len(mine) == len(torchs) > 3
    for a, b in zip(mine, torchs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
assert not torch.equal(ours[0][0], ours[1][0].to(ours[0][0].dtype))  # autocast did change the arithmetic
te.recomputed_in_backward = geonps
q = zq.clone().requires_grad_()
with te.attention_backend(layer, "fast"):
    out, _ = layer(q, xq, zk, xk, mask)
try:  # as PyTorch's reentrant checkpoint: not through torch.autograd.grad
    torch.autograd.grad(out.sum(), q)
    raise AssertionError("torch.autograd.grad went through")
except RuntimeError as e:
    assert "recomputed row blocks" in str(e), e
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
