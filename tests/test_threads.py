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
        n = threads.configure()  # the usable cores, less those another job holds now
        assert 1 <= n <= threads.usable_cores() and n == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            threads.configure(bad)


def test_importing_geonp_keeps_idle_openmp_threads_asleep_unless_told_otherwise():
    code = "import os, geonp; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert out.stdout.strip() == "ACTIVE"


def test_the_machines_busy_and_idle_seconds_are_read_from_proc_stat(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    (tmp_path / "stat").write_text(f"cpu  {3 * ticks} 0 {ticks} {10 * ticks} {2 * ticks} 0 0 0 0 0\ncpu0 1 2 3\n")
    assert threads.cpu_seconds(tmp_path / "stat") == (4.0, 12.0)  # iowait counts as idle
    assert threads.cpu_seconds(tmp_path / "absent") is None


def test_other_processes_load_is_the_machines_less_our_own():
    # Over 2 s the machine was busy 3.6 CPU-seconds, 1.6 of them ours: others held one core.
    assert threads.others_busy((0.0, 100.0, 50.0, 10.0), (2.0, 103.6, 50.4, 11.6)) == pytest.approx(1.0)
    assert threads.others_busy((0.0, 100.0, 50.0, 10.0), (2.0, 101.0, 53.0, 11.0)) == 0.0


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux")
def test_threads_give_way_to_another_job_and_come_back_when_it_stops(monkeypatch):
    before = torch.get_num_threads()
    samples = iter([(0.0, 0.0, 0.0, 0.0),  # configure's first look
                    (0.1, 0.2, 0.0, 0.2),  # 0.1 s later: only ours
                    (3.0, 6.0, 0.0, 3.0),  # a job held 1.03 cores
                    (6.0, 12.0, 0.0, 9.0),  # it held none: all ours again
                    (9.0, 18.0, 0.0, 12.0)])
    monkeypatch.setattr(threads, "_sample", lambda: next(samples))
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    try:
        assert threads.configure() == 2
        assert threads.adapt(force=True) == 1 and torch.get_num_threads() == 1
        assert threads.adapt(force=True) == 2 and torch.get_num_threads() == 2
        assert threads.configure(2) == 2 and threads.adapt(force=True) == 2  # --threads: kept as given
    finally:
        torch.set_num_threads(before)
