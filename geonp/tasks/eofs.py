"""A matrix's gaps iterated to their rank-``k`` reconstruction: the iterations of DINEOF
(:mod:`geonp.tasks.dineof`), on the host or on a torch device.

The matrix is ``X [cells, steps]`` of anomalies, its unknown entries at their current guesses; an
iteration replaces them by the projection of ``X`` on its ``k`` leading right singular vectors,
the temporal EOFs, until they stop changing.

The temporal EOFs are the leading eigenvectors of the ``T x T`` Gram matrix ``X^T X``: with steps
counted in tens and cells in hundreds of thousands, ``numpy.linalg.eigh`` of it costs ``cells * T^2``
per iteration, far below a full SVD of ``X``. A long stack (an hourly month: 744 steps) would spend
minutes in those eigendecompositions, of which an iteration needs only the ``k`` leading vectors,
and hardly different ones from the iteration before: there each convergence (one per number of
modes, in the cross-validation and again in the final fill unless it resumes) starts from ``k + EOF_OVERSAMPLE``
vectors of ARPACK's Lanczos (``scipy.sparse.linalg.eigsh``, from
products ``X^T (X v)`` without forming ``X^T X``), and every iteration carries them on by block
(subspace) iteration, ``qr(X^T X B)``, the ``k`` leading taken from their span (Rayleigh-Ritz),
until they are as settled as :data:`EOF_RESIDUAL` asks: the same fill as fresh Lanczos to 3e-5 K
on a history fold of each hourly month (``pipelines/results/dineof_speed_cpu.md``).

On a GPU (``device``) the iterations run there in float64, the same steps with the same stop rules;
what is small stays on the host: ARPACK's start (a copy of ``X`` for each fresh Lanczos: once per
convergence with the block iteration) and the
``m x m`` eigenproblems of the Rayleigh-Ritz steps, which a GPU's eigensolver takes milliseconds
over where NumPy's takes tens of microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

from geonp.threads import one_blas_thread

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch

    #: A matrix of the iterations: a NumPy array on the host, a torch tensor on a device.
    Matrix: TypeAlias = np.ndarray | torch.Tensor

#: Steps up to which the EOFs come from a dense ``eigh`` of ``X^T X``; longer stacks use Lanczos.
DENSE_EOF_STEPS = 128
#: Vectors a long stack's block iteration carries beyond the ``k`` EOFs it needs: a span a few
#: vectors wider than the one sought converges at the rate of the ``k + p + 1``-th eigenvalue against
#: the ``k``-th, not the ``k + 1``-th (``p`` this number; 10, the usual oversampling of randomised
#: subspace methods).
EOF_OVERSAMPLE = 10
#: How settled the block iteration's EOFs must be before an iteration uses them: every leading
#: Ritz pair's residual ``|X^T X v - theta v|`` at most this share of the largest eigenvalue. Under
#: heavy gaps DINEOF carries a small error of its EOFs a long way: on fill_speed's hourly ERA5 cube
#: (85% clouds) residuals of 1e-6 left the fill 0.12 K (rms) from fresh Lanczos', 1e-8 0.001 K
#: (scratch runs of DINEOF on that cube alone, 2026-11-30; fresh Lanczos there 75.0 s, 1e-8 55.5 s,
#: in the fill of the cube 73.9 and 52.7 s).
EOF_RESIDUAL = 1e-8
#: Block steps an iteration takes at most before it falls back to a fresh eigendecomposition.
MAX_BLOCK_STEPS = 50


def converge(work: np.ndarray, unknown: np.ndarray, k: int, tol: float, max_iter: int,
             dense_steps: int, warm_start: bool = True, device: torch.device | str | None = None) -> np.ndarray:
    """A matrix's unknown entries iterated to its rank-``k`` reconstruction (DINEOF's convergence).

    Up to ``dense_steps`` steps, or without ``warm_start``, or where ``k + EOF_OVERSAMPLE`` is half
    the steps or more, each iteration's EOFs come afresh from :func:`_leading_eofs`. Beyond, a
    basis ``B [T, k + EOF_OVERSAMPLE]`` from Lanczos starts the call and :func:`_carried_eofs`
    carries it from one iteration to the next. Holds the unknown entries' flat indices (8 bytes
    each) for the call; on a device, a copy of ``work`` and its ``N x T`` products there too (a GPU
    that runs out of memory hands the convergence back to the host, from the start).

    Args:
        work: float64 ``[N, T]`` (cells x steps), the anomalies with the unknown entries at their
            current guesses (zeros, or an earlier convergence's values); not modified.
        unknown: bool ``[N, T]``, True at the entries to iterate.
        k: the modes (temporal EOFs) of the reconstruction.
        tol: stop when the unknown entries change by less than this (root mean square).
        max_iter: iterations at most.
        dense_steps: up to this many steps a dense ``eigh`` in every iteration (:data:`DENSE_EOF_STEPS`).
        warm_start: carry the EOFs by block iteration past ``dense_steps`` (else a fresh Lanczos
            in every iteration).
        device: a torch device the iterations run on, in float64 (a GPU's; on a CPU the same
            steps in torch); None: NumPy on the host.

    Returns:
        float64 ``[N, T]``, C-ordered: ``work`` with its unknown entries converged.
    """
    if unknown.shape != work.shape:
        raise ValueError(f"dineof: unknown mask {unknown.shape} does not match the matrix {work.shape}")
    work = np.array(work, order="C")  # a copy, whose flat view ``flat`` writes through
    # The unknown entries by flat index, in the row-major order a boolean mask reads them: a gather
    # by index costs a sixth of a masked read, and the three masked reads and writes of every
    # iteration were three quarters of its time on a 10-day 201 x 301 stack (same values, same order).
    # Written through a flat view: about half the time of ``ndarray.put`` (1.2 against 2.6 ms an
    # iteration on the million unknown entries of an hourly month).
    at = np.flatnonzero(unknown)
    if not at.size:
        return work
    if device is None:
        _iterate(work, at, k, tol, max_iter, dense_steps, warm_start)
        return work
    import torch

    try:
        on_device = torch.tensor(work, device=device)  # a copy, also on a CPU: ``work`` stays the start
        _iterate(on_device, torch.as_tensor(at, dtype=torch.long, device=device), k, tol, max_iter, dense_steps,
                 warm_start)
        return on_device.cpu().numpy()
    except torch.OutOfMemoryError:
        pass  # the device's tensors go with the exception's frames, at the end of this block
    on_device = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    _iterate(work, at, k, tol, max_iter, dense_steps, warm_start)  # the host's, from the same start
    return work


def _iterate(work: Matrix, at: Matrix, k: int, tol: float, max_iter: int, dense_steps: int,
             warm_start: bool) -> None:
    """:func:`converge`'s iterations, in place on ``work [N, T]`` (a C-ordered float64 NumPy array or
    torch tensor), whose flat entries ``at`` (int64 ``[n]``) are unknown."""
    xp = _namespace(work)
    flat = work.reshape(-1) if xp is np else work.view(-1)  # a view (writes through), never a copy
    current = flat[at]
    steps = work.shape[1]
    width = k + EOF_OVERSAMPLE
    block = warm_start and _lanczos_applies(steps, width, dense_steps)
    # Many small products and ARPACK's BLAS-2 steps: one BLAS thread (geonp.threads.one_blas_thread);
    # the block products too: on the two hourly months' folds 35.0 s against 37.3 s with the fill's
    # two threads (two threads win on ERA5's larger steps and lose on WFDE5's; dineof_speed_cpu.md),
    # and a fill beside other work is not slowed by threads waiting on each other.
    with one_blas_thread():
        basis = _leading_eofs(work, width, dense_steps) if block else None  # [T, width]
        for _ in range(max_iter):
            if basis is None:
                lead = _leading_eofs(work, k, dense_steps)  # [T, k]: the k leading temporal EOFs
                scores = work @ lead  # [N, k]
            else:
                lead, scores, basis = _carried_eofs(work, basis, k, dense_steps)
            rebuilt = (scores @ lead.T).take(at)  # [n unknown]
            change = rebuilt - current
            flat[at] = rebuilt
            current = rebuilt
            if xp.sqrt(xp.mean(change**2)) < tol:
                break


def _namespace(array: Matrix):
    """The module whose functions take ``array``: NumPy for an ndarray, else torch (a tensor)."""
    if isinstance(array, np.ndarray):
        return np
    import torch

    return torch


def _carried_eofs(work: Matrix, basis: Matrix, k: int, dense_steps: int) -> tuple[Matrix, Matrix, Matrix]:
    """The ``k`` leading temporal EOFs of ``work [N, T]`` from ``basis [T, m]`` (orthonormal, near
    their span), by block iteration until every leading Ritz pair's residual is below
    :data:`EOF_RESIDUAL` of the largest eigenvalue (a fresh :func:`_leading_eofs` after
    :data:`MAX_BLOCK_STEPS`). Returns ``(lead [T, k], work @ lead [N, k], basis [T, m])``, the basis
    one step past the one ``lead`` came from (:data:`MAX_BLOCK_STEPS` steps on where it fell back).

    One step costs two products with ``work`` and gives the residual for free: the step's
    ``X^T X B`` times the Ritz vectors is ``X^T X v``. Fewer steps would be faster: one step an
    iteration, whether or not the EOFs had settled, was 3.4 times faster than fresh Lanczos on a
    history fold of an hourly ERA5 month, but under 85% clouds it moved te-pt-tnp's RMSE on that
    month by x1.0065 [1.0003, 1.0131] (days resampled; scratch runs against the fresh path,
    2026-11-30) through the DINEOF covariate; settled, the fill is fresh Lanczos' own.
    """
    xp = _namespace(work)
    for _ in range(MAX_BLOCK_STEPS):
        projected = work @ basis  # [N, m]
        power = work.T @ projected  # [T, m]: X^T X B
        theta, vectors = _host_eigh(basis.T @ power)  # ascending: the last k lead
        ritz, theta = vectors[:, -k:], theta[-k:]  # [m, k], [k]
        lead = basis @ ritz  # [T, k]
        residual = _column_norms(power @ ritz - lead * theta)  # [k]
        basis = xp.linalg.qr(power)[0]
        if float(residual.max()) <= EOF_RESIDUAL * max(float(theta[-1]), 0.0):
            return lead, projected @ ritz, basis
    lead = _leading_eofs(work, k, dense_steps)
    return lead, work @ lead, basis


def _leading_eofs(work: Matrix, k: int, dense_steps: int) -> Matrix:
    """The ``k`` leading temporal EOFs of ``work [N, T]``: eigenvectors of ``X^T X``, ``[T, k]``.

    Up to ``dense_steps`` steps (or ``k`` past half of them) a dense ``eigh``; beyond,
    ARPACK's Lanczos on ``v -> X^T (X v)``, which finds ``k`` vectors, not ``T``: in every
    iteration 2.1 times faster than ``eigh`` on an hourly month of ERA5 (Intel Xeon, 2 threads; 4.0
    on an AMD EPYC, 1 thread) and 15 times on one of WFDE5, the fill the same to rounding
    (``pipelines/results/dineof_speed_cpu.md``). Its start vector is fixed, not ARPACK's random one,
    so the same stack gives the same EOFs in any process; a Lanczos that does not converge falls
    back to ``eigh``. Only the span of the vectors is used, so their signs and order do not matter.
    """
    steps = work.shape[1]
    xp = _namespace(work)
    if _lanczos_applies(steps, k, dense_steps):
        # ARPACK on the host; a device's matrix is copied there for each fresh start (once per
        # convergence with the block iteration; every iteration without it).
        host = work if xp is np else work.cpu().numpy()
        product = LinearOperator((steps, steps), matvec=lambda v: host.T @ (host @ v), dtype=np.float64)
        start = np.random.default_rng(steps).standard_normal(steps)
        try:
            found = eigsh(product, k=k, which="LA", v0=start, tol=0)[1]
            return found if xp is np else xp.as_tensor(found, device=work.device)
        except ArpackNoConvergence:
            pass
    return _host_eigh(work.T @ work)[1][:, -k:]  # ascending eigenvalues: the last k lead


def _host_eigh(matrix: Matrix) -> tuple[Matrix, Matrix]:
    """``numpy.linalg.eigh`` of a small symmetric ``matrix [m, m]`` (NumPy or torch), its eigenvalues
    ``[m]`` (ascending) and vectors ``[m, m]`` returned on the matrix's device: a GPU's eigensolver
    takes milliseconds where the host's takes tens of microseconds on matrices this small (the
    PyTorch issues on ``torch.linalg.eigh`` of small CUDA matrices), and the EOFs are then NumPy's
    on either path."""
    if isinstance(matrix, np.ndarray):
        return np.linalg.eigh(matrix)
    import torch

    values, vectors = np.linalg.eigh(matrix.cpu().numpy())
    return torch.as_tensor(values, device=matrix.device), torch.as_tensor(vectors, device=matrix.device)


def _column_norms(matrix: Matrix) -> Matrix:
    """The Euclidean norm of each column of ``matrix [T, k]`` (NumPy or torch): ``[k]``."""
    if isinstance(matrix, np.ndarray):
        return np.linalg.norm(matrix, axis=0)
    import torch

    return torch.linalg.vector_norm(matrix, dim=0)


def _lanczos_applies(steps: int, k: int, dense_steps: int) -> bool:
    """Whether ``k`` leading EOFs of a ``steps``-step stack come from Lanczos (past ``dense_steps``
    steps, and ``k`` under half of them), not a dense ``eigh``: one rule for the fresh EOFs of
    :func:`_leading_eofs` and the block iteration's start in :func:`converge`."""
    return steps > dense_steps and 2 * k < steps
