"""How many threads geonp's numeric work runs on: the cores this process may use, chosen by geonp.

PyTorch and the BLAS libraries size their thread pools by the machine's cores, whatever share of
them a process may use (a container's CPU quota, ``taskset``, a batch job's allocation, a dask
worker beside others), and OpenMP threads spin while they wait for work. On a busy machine both
cost several-fold: ``geonp demo`` took 526 s beside another job against 62 s alone (issue 54).
So geonp decides: :func:`usable_cores` reads the process's CPU affinity and cgroup quota (and a
dask worker's share), :func:`configure` sizes torch's and the BLAS pools to it (or to
``--threads``), and importing geonp asks OpenMP to sleep rather than spin while idle
(``OMP_WAIT_POLICY=PASSIVE``, unless the environment says otherwise; it takes effect only when
geonp is imported before torch, as the command line does).

Sleeping at once has its own cost: a library call that opens a thread team for a few
microseconds of work (LAPACK on one small matrix, a small product) then waits for its threads to
wake. Torch's CPU wheels use GNU OpenMP, whose threads spin ``GOMP_SPINCOUNT`` times before they
sleep (300,000 by default, none under ``PASSIVE``); geonp sets 1,000 (unless the environment
says otherwise), a few microseconds. One LAPACK solve of a 64 x 64 system took 102 us sleeping
at once, 8 us after 1,000 spins. te-pt-tnp's fill of the demo (``python -m
pipelines.benchmarks.fill_speed --one demo te-pt-tnp``, the whole process, 2 cores, medians of
``farm-bench``): quiet 41.2 s sleeping at once, 36.1 s with 1,000 spins; beside a PyTorch job
with its default threads 57.8 s and 61.1 s. 10,000 spins gained no more when quiet and took
99.6 s beside that job (``fill_speed`` rows), so more is worse on a shared machine.

Loops of many small BLAS calls (DINEOF's iterations, the kriging baselines' small systems) run
inside :func:`one_blas_thread`, where a second BLAS thread costs more in waking than it gives; so
do a stack's history folds when they run side by side on :func:`chosen_threads` Python threads
(:func:`geonp.tasks.history.history_folds`), one core each and sums that do not depend on how many.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: What OpenMP threads do while they wait, unless the environment says otherwise (set on import).
WAIT_POLICY = "PASSIVE"
#: How many times a GNU OpenMP thread checks for work before it sleeps (module docstring).
SPIN_COUNT = "1000"


_chosen: int | None = None  # the count configure() (or share_cores) set in this process

_blas_lock = threading.Lock()
_blas_users = 0  # threads inside one_blas_thread; the pools are restored when the last one leaves
_blas_limit = None  # threadpoolctl's limit, set by the first thread in


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """The BLAS pools (numpy's and SciPy's OpenBLAS) on one thread for the duration.

    For a loop of many small BLAS calls, such as ARPACK's Lanczos iterations and their
    matrix-vector products, where a second thread costs more in waking and waiting than it saves:
    on 2 cores, DINEOF of a history fold of ERA5's hourly month over the UK (744 x 33 x 49), with a
    fresh Lanczos in every iteration, took 65.1 s with a fill's two BLAS threads and 21.3 s with one
    on an AMD EPYC (``pipelines/results/dineof_speed_cpu.md``; not measured on more cores). The
    limit is the whole process's (BLAS pools are), so threads that enter it together share it
    (history folds on a thread pool, :func:`geonp.tasks.history.history_folds`, enter it in the
    calling thread): it is set when the first enters and restored when the last leaves. Each first
    entry scans the loaded libraries (0.7 ms), so SciPy's is found whenever it was loaded.
    With this OpenBLAS (0.3.31) a count set from a thread other than the main one did not change
    the count that thread read, so in a dask worker's task threads this is likely a no-op.
    """
    global _blas_users, _blas_limit
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        if _blas_users == 0:
            _blas_limit = threadpool_limits(1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limit.restore_original_limits()
                _blas_limit = None


def quiet_openmp() -> None:
    """Ask OpenMP runtimes loaded after this to sleep while idle (``OMP_WAIT_POLICY``) after a short
    spin (``GOMP_SPINCOUNT``), each unless set."""
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def cgroup_quota(root: str | os.PathLike = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this process's cgroup in cores (``2.5`` for 250 ms per 100 ms), or None.

    Reads cgroup v2's ``cpu.max`` (``"max 100000"``: no quota; ``"250000 100000"``: 2.5 cores), else
    cgroup v1's ``cpu/cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (quota -1: none)."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _dask_worker_threads() -> int:
    """Task threads of the dask worker this runs in (they share its cores), 1 outside one."""
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity, within its cgroup's CPU quota (rounded up),
    divided among a dask worker's task threads; at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores // _dask_worker_threads())


def configure(threads: int | None = None) -> int:
    """Size torch's intra-op pool and the BLAS and OpenMP pools (threadpoolctl) to ``threads``
    (default :func:`usable_cores`); returns the number used.

    Raises:
        ValueError: ``threads`` below 1.
    """
    n = usable_cores() if threads is None else _whole(threads, "--threads")
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    share_cores(n)
    return n


def share_cores(threads: int) -> None:
    """A worker process's share of the cores (``threads``): its BLAS and OpenMP pools sized to it and
    :func:`chosen_threads` answering it, without importing torch (:func:`configure` adds torch's)."""
    from threadpoolctl import threadpool_limits

    global _chosen
    threadpool_limits(_whole(threads, "threads"))
    _chosen = threads


def _whole(threads: object, name: str) -> int:
    """``threads`` when it is a whole number >= 1 (not a bool); else ValueError naming ``name``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {threads!r}")
    return threads


def chosen_threads() -> int:
    """The threads geonp's numeric work may use here: what :func:`configure` or :func:`share_cores`
    set in this process, else :func:`usable_cores`. Work split into independent parts (a stack's
    history folds) runs on this many Python threads."""
    return _chosen if _chosen is not None else usable_cores()
