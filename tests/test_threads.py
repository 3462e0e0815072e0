"""geonp sizes its thread pools to the cores it may use, and keeps idle OpenMP threads asleep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from geonp import threads


def test_the_cgroup_quota_is_read_in_both_versions(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert threads.cgroup_quota(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_quota(v1) == 1.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_quota(v1) is None
    assert threads.cgroup_quota(tmp_path / "absent") is None


def test_usable_cores_follow_the_quota_and_the_affinity(monkeypatch):
    monkeypatch.setattr(threads, "cgroup_quota", lambda root="/sys/fs/cgroup": 1.2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert threads.usable_cores() == 2  # 1.2 cores of quota: two threads, not four
    monkeypatch.setattr(threads, "cgroup_quota", lambda root="/sys/fs/cgroup": None)
    assert threads.usable_cores() == 4
    monkeypatch.setattr(threads, "_dask_worker_threads", lambda: 3)
    assert threads.usable_cores() == 1  # a dask worker's three task threads share the four cores


def test_configure_sizes_torch_and_refuses_nonsense():
    before = torch.get_num_threads()
    try:
        assert threads.configure(1) == 1 and torch.get_num_threads() == 1
        assert threads.configure() == threads.usable_cores() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            threads.configure(bad)


def test_chosen_threads_answer_what_configure_or_a_workers_share_set(monkeypatch):
    from threadpoolctl import threadpool_limits

    monkeypatch.setattr(threads, "_chosen", None)
    assert threads.chosen_threads() == threads.usable_cores()
    before = torch.get_num_threads()
    # configure and share_cores size the pools for good: the pools put back as they were after.
    with threadpool_limits(None):
        try:
            threads.configure(1)
            assert threads.chosen_threads() == 1
        finally:
            torch.set_num_threads(before)
        threads.share_cores(3)
        assert threads.chosen_threads() == 3
        for bad in (0, 1.5, True):
            with pytest.raises(ValueError, match="threads"):
                threads.share_cores(bad)


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_one_blas_thread_limits_and_restores_the_pools_even_when_users_overlap():
    """One thread inside, the pools' own count after, also after an exception; two users whose
    contexts overlap (A in, B in, A out, B out) keep the limit until the last leaves, then restore."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(2, user_api="blas"):  # a count to come back to, whatever the machine's
        assert _blas_threads() == {2}
        with threads.one_blas_thread():
            assert _blas_threads() == {1}
        assert _blas_threads() == {2}
        with pytest.raises(RuntimeError), threads.one_blas_thread():
            raise RuntimeError("inside")
        assert _blas_threads() == {2}
        # Two users whose contexts overlap out of order (A in, B in, A out, B out), as two dask
        # task threads may: the limit holds until the last leaves. (Entered here from one thread:
        # OpenBLAS ignored a count set from any thread but the main one, so threads cannot show it.)
        first, second = threads.one_blas_thread(), threads.one_blas_thread()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert _blas_threads() == {1}
        second.__exit__(None, None, None)
        assert _blas_threads() == {2}


def test_importing_geonp_keeps_idle_openmp_threads_asleep_unless_told_otherwise():
    code = "import os, geonp; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["PASSIVE", "1000"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5"})
    assert out.stdout.split() == ["ACTIVE", "5"]


def test_pipelines_set_the_same_openmp_policy_before_torch_loads():
    """A benchmark that imports torch before geonp would otherwise measure another threading regime
    than the command line's (the suite ran with OpenMP's default spinning until 2026-11-29)."""
    code = ("import pipelines, os, sys; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('GOMP_SPINCOUNT'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["False", "PASSIVE", "1000"]
