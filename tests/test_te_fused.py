"""The fused CPU kernel computes TEAttention's function; without it the Python path runs."""

from __future__ import annotations

import pytest
import torch
from conftest import random_tasks

from geonp.models import build, cpu_build, te_fused
from geonp.models.te_attention import TEAttention, attention_backend

needs_kernel = pytest.mark.skipif(not cpu_build.can_build(), reason="no C++ compiler or ninja to build the kernel")


@needs_kernel
def test_the_kernel_builds_where_a_compiler_and_ninja_exist():
    assert te_fused.cpu_kernel() is not None


@pytest.mark.parametrize("cached", [False, True])
def test_a_first_build_is_announced_on_stderr_a_cached_one_is_not(cached, monkeypatch, tmp_path, capsys):
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = cpu_build.kernel_name("te_attention", cpu_build.kernel_flags("te_attention"))
    if cached:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(b"")
    built = object()
    monkeypatch.setattr(cpp, "load", lambda *a, **k: built)  # no compiler run in this test
    assert cpu_build.kernel.__wrapped__("te_attention") is built
    assert ("building the fused TE attention kernel" in capsys.readouterr().err) is not cached


def test_a_failed_avx512_build_falls_back_to_the_avx2_kernel(monkeypatch):
    """An AVX-512 build that fails (an older compiler, say) leaves the fused kernel in AVX2 code,
    not in PyTorch's slower path; kernels other than TE attention are built without the define."""
    monkeypatch.setattr(cpu_build, "has_avx512", lambda: True)
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: ["-O3", "-mavx2", "-mfma"])
    avx2 = object()
    asked = []

    def load(name, flags, warn=True):
        asked.append((name, cpu_build.AVX512 in flags, warn))
        return None if cpu_build.AVX512 in flags else avx2

    monkeypatch.setattr(cpu_build, "load_kernel", load)
    assert cpu_build.kernel.__wrapped__("te_attention") is avx2
    assert asked == [("te_attention", True, False), ("te_attention", False, True)]
    assert cpu_build.AVX512 not in cpu_build.kernel_flags("spd")


def test_each_environment_and_torch_builds_its_own_kernel(monkeypatch):
    """torch's cache is shared by an account's virtual environments: the name keys the build by the
    environment and torch, so another venv neither reuses an incompatible build nor rebuilds this one."""
    flags = cpu_build.cpu_flags()
    here = cpu_build.kernel_name("te_attention", flags)
    assert here == cpu_build.kernel_name("te_attention", flags)  # stable in one environment
    assert cpu_build.kernel_name("spd", flags) != here  # and one build per kernel
    monkeypatch.setattr(cpu_build.sys, "prefix", "/elsewhere/venv")
    assert cpu_build.kernel_name("te_attention", flags) != here
    monkeypatch.undo()
    monkeypatch.setattr(cpu_build.torch, "__version__", "0.0.1")
    assert cpu_build.kernel_name("te_attention", flags) != here
    monkeypatch.undo()


def test_each_checkout_builds_its_own_kernel(tmp_path):
    """Two checkouts sharing one environment: torch's build file names the source by path, so one
    name for both had each rebuild the other's kernel, silently, on every switch."""
    flags = cpu_build.cpu_flags()
    here = cpu_build.kernel_name("te_attention", flags)
    other = tmp_path / "te_attention_cpu.cpp"
    other.write_text(cpu_build.source("te_attention").read_text())  # the same source, in another checkout
    assert cpu_build.kernel_name("te_attention", flags, other) != here


def layer_inputs(nq: int, nk: int, dx: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    zq, zk = torch.randn(3, nq, 16, generator=g), torch.randn(3, nk, 16, generator=g)
    xq, xk = torch.randn(3, nq, dx, generator=g), torch.randn(3, nk, dx, generator=g)
    mask = torch.ones(3, nk, dtype=torch.bool)
    mask[0, nk // 2:] = False  # padding at the end
    mask[1, 1::3] = False  # absent keys in the middle
    return zq, xq, zk, xk, mask


@needs_kernel
@pytest.mark.parametrize("nk", [5, 16, 37])
@pytest.mark.parametrize("dx", [1, 3, 4])
@pytest.mark.parametrize("update_locations, distance_prior", [(True, True), (False, True), (True, False)])
def test_fused_layer_matches_the_python_fast_path(nk, dx, update_locations, distance_prior):
    torch.manual_seed(nk + dx)
    heads = 3 if nk == 37 else 4  # rows of the kernel's tiles in blocks of four and one by one
    layer = TEAttention(16, heads, 4, dx, 12, update_locations=update_locations, distance_prior=distance_prior)
    if layer.loc_mlp is not None:
        with torch.no_grad():
            torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)  # switch Eq. 10 on
    inputs = layer_inputs(9, nk, dx)
    with torch.no_grad():
        with attention_backend(layer, "fast"):
            out_py, x_py = layer(*inputs)
        with attention_backend(layer, "fused"):
            out_fused, x_fused = layer(*inputs)
    torch.testing.assert_close(out_fused, out_py, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x_fused, x_py, atol=1e-5, rtol=1e-5)
    if update_locations:
        assert (x_fused - inputs[1]).abs().max() > 1e-3  # the update is on, not trivially zero


@needs_kernel
@pytest.mark.parametrize("name", ["te-tnp", "te-pt-tnp"])
def test_fused_models_predict_as_the_python_path_far_from_the_origin(name):
    xc, yc, xt, mask_c = random_tasks(b=2, nc=40, nt=21, dx=3)
    xc, xt = xc + 300.0, xt + 300.0  # locations are centred before the kernel sees them
    torch.manual_seed(0)
    model = build(name, 3, 1, preset="tiny").eval()
    with torch.no_grad():
        with attention_backend(model, "fast"):
            slow = model(xc, yc, xt, mask_c)
        with attention_backend(model, "fused"):
            fast = model(xc, yc, xt, mask_c)
    torch.testing.assert_close(fast.loc, slow.loc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.scale, slow.scale, atol=1e-5, rtol=1e-5)


def backend_gradients(layer: TEAttention, backend: str) -> list[torch.Tensor]:
    """Every parameter's gradient and those of the tokens and locations, through both outputs of
    ``layer`` on ``layer_inputs(9, 37, 3)`` (random output weights, the same for every backend)."""
    zq, xq, zk, xk, mask = (t.clone().requires_grad_(t.is_floating_point()) for t in layer_inputs(9, 37, 3))
    layer.zero_grad()
    with attention_backend(layer, backend):  # the backward pass recomputes with the same implementation
        out, x = layer(zq, xq, zk, xk, mask)
        g = torch.Generator().manual_seed(2)
        (out * torch.randn(out.shape, generator=g)).sum().add((x * torch.randn(x.shape, generator=g)).sum()).backward()
    return [p.grad.clone() for p in layer.parameters() if p.grad is not None] + [zq.grad, xq.grad, zk.grad, xk.grad]


@needs_kernel
@pytest.mark.parametrize("update_locations, distance_prior", [(True, True), (False, False)])
def test_fused_gradients_match_the_python_fast_path(update_locations, distance_prior, monkeypatch):
    """Every parameter's gradient and those of the tokens and locations, through both outputs."""
    torch.manual_seed(1)
    layer = TEAttention(16, 3, 4, 3, 12, update_locations=update_locations, distance_prior=distance_prior)
    if layer.loc_mlp is not None:
        with torch.no_grad():
            torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)
    calls = []
    apply = te_fused._Kernel.apply
    monkeypatch.setattr(te_fused._Kernel, "apply", lambda *a: calls.append(1) or apply(*a))
    slow, fast = backend_gradients(layer, "fast"), backend_gradients(layer, "fused")
    assert calls == [1] and len(slow) == len(fast)
    for a, b in zip(slow, fast):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_far_pairs_give_the_python_paths_gradients_with_denormals_flushed():
    """Softmax weights of far pairs sit at the exp floor (~1e-38) and their products below it:
    denormals, which the kernel flushes to zero (flush_denormals.h: each took a microcode assist).
    The gradients still match the Python path's."""
    torch.manual_seed(4)
    layer = TEAttention(16, 4, 4, 3, 12, distance_prior=True)
    with torch.no_grad():
        layer.log_lengthscale.fill_(-2.0)  # short lengthscales: most pairs' prior below -87
    for a, b in zip(backend_gradients(layer, "fast"), backend_gradients(layer, "fused")):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_reads_denormals_as_zero_and_the_callers_threads_keep_them(threads):
    """Inside the kernel a denormal value counts as zero; outside it, on the calling thread and
    PyTorch's other threads alike, denormals are as they were (each thread restores its register)."""
    tiny = torch.full((1 << 20,), 1e-38)  # large enough for PyTorch to split the product over threads
    if not (tiny * 0.5 > 0).all():
        pytest.skip("this process already flushes denormals")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        torch.manual_seed(5)
        layer = TEAttention(16, 4, 4, 3, 12)
        g = torch.Generator().manual_seed(6)
        q, k = torch.randn(2, 4, 9, 4, generator=g), torch.randn(2, 4, 37, 4, generator=g)
        v = torch.full((2, 4, 37, 4), 1e-39)  # denormal values: the attention-weighted sum is ~1e-39
        xq, xk = torch.randn(2, 9, 3, generator=g), torch.randn(2, 37, 3, generator=g)
        with torch.no_grad():
            out, _ = te_fused.fused_attention(layer.logit_mlp, layer.loc_mlp, layer.log_lengthscale, q, k, v, xq, xk,
                                              torch.ones(2, 37, dtype=torch.bool))
        assert v.sum() > 0 and (out == 0).all()  # PyTorch keeps them; the kernel read them as zero
        assert (tiny * 0.5 > 0).all()  # and left every thread's float mode as it found it
    finally:
        torch.set_num_threads(before)


def test_without_the_kernel_the_python_path_runs(monkeypatch):
    monkeypatch.setattr(te_fused, "cpu_kernel", lambda: None)
    layer = TEAttention(16, 4, 4, 2, 12)
    with torch.no_grad():
        out, x = layer(*layer_inputs(5, 7, 2))
    assert out.shape == (3, 5, 16) and torch.isfinite(out).all()


@needs_kernel
def test_fused_gradients_are_the_same_bit_for_bit_on_any_number_of_threads():
    """Each batch sums its own weight gradients, added up in batch order whichever thread ran it,
    so gradients do not depend on the thread count or the split (resumed runs stay exact)."""
    threads = torch.get_num_threads()
    try:
        torch.manual_seed(3)
        layer = TEAttention(16, 4, 4, 3, 12)
        grads = []
        for count in (2, 2, 1, 3):
            torch.set_num_threads(count)
            layer.zero_grad()
            zq, xq, zk, xk, mask = layer_inputs(6, 40, 3)
            with attention_backend(layer, "fused"):
                out, x = layer(zq, xq, zk, xk, mask)
                (out.square().sum() + x.sum()).backward()
            grads.append([p.grad.clone() for p in layer.parameters()])
    finally:
        torch.set_num_threads(threads)
    for later in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], later))


@needs_kernel
def test_skipped_query_rows_change_no_wanted_row_nor_any_gradient():
    """``mask_q``: the kernel skips a padded batch's padding rows. The wanted rows' outputs, and
    every gradient of a loss on them, are the same floats as when every row is computed."""
    torch.manual_seed(6)
    layer = TEAttention(16, 4, 16, 3, 32)
    with torch.no_grad():
        torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)
    mask_q = torch.rand(3, 21, generator=torch.Generator().manual_seed(7)) < 0.6
    mask_q[2] = False  # a task with no wanted query at all
    results = []
    for skip in (None, mask_q):
        zq, xq, zk, xk, mask = (t.clone().requires_grad_(t.is_floating_point()) for t in layer_inputs(21, 70, 3))
        layer.zero_grad()
        out, x = layer(zq, xq, zk, xk, mask, skip)
        want = mask_q[..., None]
        ((out * want).square().sum() + (x * want).square().sum()).backward()
        results.append([out[mask_q], x[mask_q], zq.grad, zk.grad, xq.grad, xk.grad]
                       + [p.grad.clone() for p in layer.parameters()])
        if skip is not None:  # skipped rows: the output layer's bias and the location unmoved
            assert torch.equal(out[~mask_q], layer.to_out.bias.expand(int((~mask_q).sum()), -1))
            assert torch.equal(x[~mask_q], xq[~mask_q])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def layer_results(layer: TEAttention, kernel, monkeypatch) -> list[torch.Tensor]:
    """A layer's outputs and every gradient on fixed inputs (21 queries, 70 keys), run by ``kernel``."""
    monkeypatch.setattr(te_fused, "cpu_kernel", lambda: kernel)
    zq, xq, zk, xk, mask = (t.clone().requires_grad_(t.is_floating_point()) for t in layer_inputs(21, 70, 3))
    layer.zero_grad()
    out, x = layer(zq, xq, zk, xk, mask)
    (out.square().sum() + x.square().sum()).backward()
    return [out, x, zq.grad, zk.grad, xq.grad, xk.grad] + [p.grad.clone() for p in layer.parameters()]


@needs_kernel
@pytest.mark.skipif(not cpu_build.has_avx512(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("heads, head_dim, hidden", [(4, 16, 32), (3, 5, 10), (5, 16, 33)])
def test_the_avx512_kernel_gives_the_avx2_kernels_floats(heads, head_dim, hidden, monkeypatch):
    """On a CPU with AVX-512 two loops of the kernel run 16 floats wide, each sum in the AVX2 loops'
    order, so that which build a machine gets never changes a fill: outputs and gradients equal to
    the bit, whole blocks and leftover rows and columns alike. Builds the AVX2 kernel once."""
    avx2 = cpu_build.load_kernel("te_attention", cpu_build.cpu_flags())
    assert te_fused.cpu_kernel().__name__.startswith("geonp_te_attention_cpu_avx512_")
    assert avx2 is not None
    torch.manual_seed(5)
    layer = TEAttention(16, heads, head_dim, 3, hidden)
    with torch.no_grad():
        torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)
    results = [layer_results(layer, kernel, monkeypatch) for kernel in (te_fused.cpu_kernel(), avx2)]
    assert all(torch.equal(a, b) for a, b in zip(*results))


@needs_kernel
@pytest.mark.skipif("-mavx2" not in cpu_build.cpu_flags(), reason="this CPU builds the portable kernel already")
@pytest.mark.parametrize("head_dim, hidden", [(16, 32), (4, 12)])
def test_the_avx2_kernel_computes_what_the_portable_one_does(head_dim, hidden, monkeypatch):
    """The AVX2 build writes its inner loops in intrinsics; a build without -mavx2 keeps the plain
    loops that every other CPU runs. Both must give the same outputs and gradients (to rounding:
    the intrinsics sum in another order). Builds the portable kernel once (about a minute)."""
    portable = cpu_build.load_kernel("te_attention", [f for f in cpu_build.cpu_flags() if f not in ("-mavx2", "-mfma")])
    assert portable is not None
    torch.manual_seed(4)
    layer = TEAttention(16, 4, head_dim, 3, hidden)
    with torch.no_grad():
        torch.nn.init.normal_(layer.loc_mlp[-1].weight, std=0.3)
    results = [layer_results(layer, kernel, monkeypatch) for kernel in (te_fused.cpu_kernel(), portable)]
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
