"""DINEOF's EOFs (``geonp.tasks.eofs``): dense, fresh Lanczos, and carried by block iteration on
long stacks; their BLAS threads."""

from __future__ import annotations

import numpy as np
import pytest
from test_history import low_rank_stack

from geonp.tasks import dineof as dineof_module
from geonp.tasks.dineof import dineof


def test_a_long_stack_takes_lanczos_and_fills_as_the_dense_eigendecomposition_does(monkeypatch):
    """Past DENSE_EOF_STEPS, without the warm start, every iteration's EOFs come from ARPACK (only
    the k leading ones); the fill is the dense eigh's to rounding, the same in every call, and a
    Lanczos that fails falls back to eigh."""
    from geonp.tasks import eofs as module

    truth, given = low_rank_stack(steps=module.DENSE_EOF_STEPS + 22, rows=12, cols=14)
    calls = []
    real_eigsh = module.eigsh
    monkeypatch.setattr(module, "eigsh", lambda *a, **k: calls.append(k["k"]) or real_eigsh(*a, **k))
    lanczos, again = dineof(given, warm_start=False), dineof(given, warm_start=False)
    assert calls and max(calls) >= lanczos.modes >= 3  # the modes loop ran on Lanczos
    np.testing.assert_array_equal(lanczos.held_out, again.held_out)  # a fixed start vector
    dense = dineof(given, dense_steps=10_000)
    assert dense.modes == lanczos.modes and dense.cv_rmse.keys() == lanczos.cv_rmse.keys()
    np.testing.assert_allclose(lanczos.mean, dense.mean, atol=1e-9)
    np.testing.assert_allclose(lanczos.held_out, dense.held_out, atol=1e-9)

    def fails(*args, **kwargs):
        raise module.ArpackNoConvergence("no convergence", np.zeros(0), np.zeros((0, 0)))

    monkeypatch.setattr(module, "eigsh", fails)
    np.testing.assert_allclose(dineof(given, warm_start=False).held_out, dense.held_out, atol=1e-9)  # eigh


def test_a_long_stack_carries_its_eofs_from_one_iteration_to_the_next(monkeypatch):
    """Past DENSE_EOF_STEPS (warm start, the default) Lanczos runs once per convergence, for
    ``k + EOF_OVERSAMPLE`` vectors, and block iteration carries them on, settled to EOF_RESIDUAL:
    the same modes and fill as fresh Lanczos in every iteration to a ten-thousandth of how far that
    fill stops from a tighter tolerance's, the same limit, the same result in every call, eigh's
    start where Lanczos fails, and fresh EOFs in every iteration where the block steps never settle."""
    from geonp.tasks import eofs as module

    _, given = low_rank_stack(steps=module.DENSE_EOF_STEPS + 22, rows=12, cols=14)
    calls, converges = [], []
    real_eigsh, real_converge = module.eigsh, module.converge
    monkeypatch.setattr(module, "eigsh", lambda *a, **k: calls.append(k["k"]) or real_eigsh(*a, **k))
    monkeypatch.setattr(dineof_module, "converge", lambda *a: converges.append(a[2]) or real_converge(*a))
    warm, again = dineof(given), dineof(given)
    assert calls == [k + module.EOF_OVERSAMPLE for k in converges]  # one Lanczos start per call, no more
    np.testing.assert_array_equal(warm.held_out, again.held_out)
    fresh = dineof(given, warm_start=False)
    assert warm.modes == fresh.modes >= 3 and warm.cv_rmse.keys() == fresh.cv_rmse.keys()
    own = np.nanmax(np.abs(fresh.held_out - dineof(given, tol=1e-5, warm_start=False).held_out))
    assert np.nanmax(np.abs(warm.held_out - fresh.held_out)) < 1e-4 * own  # own: 1.8 (field spread 3)
    limit = {w: dineof(given, tol=1e-10, max_iter=20_000, max_modes=warm.modes, warm_start=w) for w in (True, False)}
    np.testing.assert_allclose(limit[True].held_out, limit[False].held_out, atol=1e-5)

    def fails(*args, **kwargs):
        raise module.ArpackNoConvergence("no convergence", np.zeros(0), np.zeros((0, 0)))

    monkeypatch.setattr(module, "eigsh", fails)
    np.testing.assert_allclose(dineof(given).held_out, warm.held_out, atol=1e-6)  # the span from eigh
    monkeypatch.setattr(module, "eigsh", real_eigsh)
    monkeypatch.setattr(module, "EOF_RESIDUAL", 0.0)  # never settled: fresh EOFs in every iteration
    monkeypatch.setattr(module, "MAX_BLOCK_STEPS", 1)
    np.testing.assert_array_equal(dineof(given).held_out, fresh.held_out)


def test_carried_eofs_settle_on_the_leading_span_from_a_nearby_basis():
    """One call of the block iteration: from a basis near the leading span it returns the k
    leading eigenvectors' span of X^T X (as eigh finds it), ``work @ lead`` as its scores and a
    basis still orthonormal; a matrix of zeros settles at once."""
    from geonp.tasks import eofs as module

    rng = np.random.default_rng(3)
    k, width = 4, 4 + module.EOF_OVERSAMPLE
    work = rng.normal(size=(80, 50)) @ np.diag(0.8 ** np.arange(50))  # [N, T], a decaying spectrum
    exact = np.linalg.eigh(work.T @ work)[1]  # ascending
    start = np.linalg.qr(exact[:, -width:] + 0.05 * rng.normal(size=(50, width)))[0]  # near, not on, the span
    lead, scores, basis = module._carried_eofs(work, start, k, 128)
    top = exact[:, -k:]
    np.testing.assert_allclose(lead @ lead.T, top @ top.T, atol=1e-6)  # the same projector
    np.testing.assert_allclose(scores, work @ lead, atol=1e-10)
    np.testing.assert_allclose(basis.T @ basis, np.eye(width), atol=1e-12)
    np.testing.assert_allclose(lead.T @ lead, np.eye(k), atol=1e-12)
    zeros = np.zeros_like(work)
    lead0, scores0, _ = module._carried_eofs(zeros, start, k, 128)
    assert lead0.shape == (50, k) and not scores0.any()


@pytest.mark.parametrize("dense_steps", [10_000, 4])  # dense eigh, and Lanczos past 4 steps
def test_dineof_iterates_on_one_blas_thread_and_as_the_masked_update_did(monkeypatch, dense_steps):
    """The iterations run with one BLAS thread (whatever the count outside, which comes back after)
    and their flat-index update gives the boolean-mask update's fill to the bit (the same entries in
    the same order; the reference also on one thread, as sums taken by other thread counts differ)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from geonp.tasks import eofs as module
    from geonp.threads import one_blas_thread

    def blas_threads() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    _, given = low_rank_stack(steps=12, rows=10, cols=11)
    seen_threads = []
    real = module._leading_eofs

    def counted(*args):
        seen_threads.append(blas_threads())
        return real(*args)

    monkeypatch.setattr(module, "_leading_eofs", counted)
    with threadpool_limits(2, user_api="blas"):
        shipped = dineof(given, dense_steps=dense_steps)
        assert blas_threads() == {2}
    assert seen_threads and all(s == {1} for s in seen_threads)

    def masked(work, unknown, k, tol, max_iter, dense_steps, warm_start, device=None):  # the update before
        work = work.copy()
        with one_blas_thread():
            for _ in range(max_iter):
                lead = real(work, k, dense_steps)
                rebuilt = (work @ lead) @ lead.T
                change = rebuilt[unknown] - work[unknown]
                work[unknown] = rebuilt[unknown]
                if np.sqrt(np.mean(change**2)) < tol:
                    break
        return work

    monkeypatch.setattr(dineof_module, "converge", masked)
    before = dineof(given, dense_steps=dense_steps)
    for name in ("mean", "std", "held_out"):
        np.testing.assert_array_equal(getattr(shipped, name), getattr(before, name))


def test_resume_converges_once_from_the_cross_validations_fill(monkeypatch):
    """``resume``: the final fill is one convergence at the chosen modes, started from the cross-
    validation's fill at those modes (the cross-validation cells back at their observations), not a
    climb from zeros; the same modes and cross-validation, a fill as close to the truth, and the
    default (the ``dineof`` baseline) still climbs."""
    from geonp.tasks import eofs as module

    truth, given = low_rank_stack()
    converges, starts = [], []
    real_converge = module.converge

    def counting(work, unknown, k, *rest):
        converges.append(k)
        starts.append(work.copy())
        return real_converge(work, unknown, k, *rest)

    monkeypatch.setattr(dineof_module, "converge", counting)
    climbed = dineof(given)
    cv_calls = len(climbed.cv_rmse)
    assert converges[cv_calls:] == list(range(1, climbed.modes + 1))  # the default climbs from zeros
    anomalies = starts[cv_calls]  # [cells, steps]: the climb's start, the observed anomalies and zeros
    converges.clear()
    starts.clear()
    resumed = dineof(given, resume=True)
    assert resumed.modes == climbed.modes and resumed.cv_rmse == climbed.cv_rmse
    assert converges[cv_calls:] == [resumed.modes]  # one convergence at the chosen modes
    seen = np.isfinite(given).reshape(len(given), -1).T  # [cells, steps]
    final_start = starts[-1]
    np.testing.assert_array_equal(final_start[seen], anomalies[seen])  # every observation back in
    assert resumed.modes < cv_calls  # so the chosen modes' cross-validation fill started the next one
    np.testing.assert_array_equal(final_start[~seen], starts[resumed.modes][~seen])  # its gaps
    assert np.count_nonzero(final_start[~seen]) > 0  # not zeros
    gap = np.isnan(given)
    for rec in (climbed, resumed):
        assert np.sqrt(np.mean((rec.mean[gap] - truth[gap]) ** 2)) < 0.25  # noise 0.1, spread about 3
