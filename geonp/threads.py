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

A fill is thousands of small parallel regions (attention blocks, kriging solves), each of which
waits for its slowest thread; when another job holds some of the cores, a thread of ours is often
descheduled and every region waits a time slice for it. :func:`adapt`, called between blocks and
fine-tuning steps, measures the cores other processes kept busy since its last call
(``/proc/stat`` against this process's own CPU time) and runs on the cores they leave, at least
one, never more than configured; an explicit ``--threads`` is kept as given.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

#: What OpenMP threads do while they wait, unless the environment says otherwise (set on import).
WAIT_POLICY = "PASSIVE"


def quiet_openmp() -> None:
    """Ask OpenMP runtimes loaded after this to sleep while idle (``OMP_WAIT_POLICY``), unless set."""
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


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
    (default :func:`usable_cores`, then as many of them as other processes leave free, see
    :func:`adapt`); returns the number used.

    Raises:
        ValueError: ``threads`` below 1.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"--threads must be a whole number >= 1, got {threads!r}")
    _SHARE.limit, _SHARE.fixed = (usable_cores(), False) if threads is None else (threads, True)
    _SHARE.last, _SHARE.blas = None, 0
    _set(_SHARE.limit)
    if not _SHARE.fixed:  # a first look at what else runs, over a tenth of a second
        _SHARE.last = _sample()
        time.sleep(SAMPLE_S)
        return adapt(force=True)
    return _SHARE.limit


#: Seconds between two looks at the other processes' load (:func:`adapt`), and of the first look.
ADAPT_EVERY_S, SAMPLE_S = 2.0, 0.1


class _Share:
    """The thread count :func:`configure` allows and what :func:`adapt` last measured."""

    limit: int = 0  # 0: configure() not called, adapt() leaves the pools alone
    fixed: bool = False  # --threads given: kept as is
    last: tuple[float, float, float, float] | None = None  # (wall s, busy s, idle s, own s)
    blas: int = 0  # the BLAS pools' size as last set


_SHARE = _Share()


def _set(n: int) -> None:
    import torch
    from threadpoolctl import threadpool_limits

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if _SHARE.blas != n:  # threadpoolctl inspects every loaded library: only when the count changes
        threadpool_limits(n)
        _SHARE.blas = n


def cpu_seconds(stat: str | os.PathLike = "/proc/stat") -> tuple[float, float] | None:
    """``(busy, idle)`` CPU seconds of the whole machine since boot (all cores; iowait counts as
    idle), from ``/proc/stat``; None where it cannot be read (not Linux)."""
    try:
        fields = [int(v) for v in Path(stat).read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / ticks, idle / ticks


def _sample() -> tuple[float, float, float, float] | None:
    machine = cpu_seconds()
    if machine is None:
        return None
    own = os.times()
    return time.monotonic(), machine[0], machine[1], own.user + own.system


def others_busy(before: tuple[float, float, float, float], after: tuple[float, float, float, float]) -> float:
    """Cores kept busy by other processes between two samples ``(wall s, machine busy s, machine
    idle s, own CPU s)``: the machine's busy time less this process's, over the wall time."""
    wall = after[0] - before[0]
    if wall <= 0:
        return 0.0
    return max(0.0, (after[1] - before[1]) - (after[3] - before[3])) / wall


def adapt(force: bool = False) -> int:
    """Run on the cores other processes left free since the last call: at least 1, at most what
    :func:`configure` allowed; returns the thread count now. Cheap (two small file reads); looks
    again at most every :data:`ADAPT_EVERY_S` seconds unless ``force``. Does nothing before
    :func:`configure`, with ``--threads``, or where ``/proc/stat`` is absent."""
    if _SHARE.limit == 0 or _SHARE.fixed:
        return _SHARE.limit
    import torch

    now = time.monotonic()
    if _SHARE.last is None or (not force and now - _SHARE.last[0] < ADAPT_EVERY_S):
        if _SHARE.last is None:
            _SHARE.last = _sample()
        return torch.get_num_threads()
    sample = _sample()
    if sample is None:
        return torch.get_num_threads()
    # Half a core of other work (a browser, an editor) leaves every thread; a job on a whole core takes one.
    n = min(_SHARE.limit, max(1, int(_SHARE.limit - others_busy(_SHARE.last, sample) + 0.5)))
    _SHARE.last = sample
    _set(n)
    return n
