"""`geonp infill` on a real dask.distributed cluster (issue #16 §3).

A LocalCluster of two worker processes: the output equals the single-process run value for value;
a worker killed mid-run (SIGKILL to its process) loses no block and the run completes on the
workers left (the nanny's replacement included); ``--workers N`` starts such a cluster itself.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import smooth_cube

from geonp.cli import main
from geonp.fill.output import PROGRESS, is_complete

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install distributed)")

BLOCKS = 12


@pytest.fixture(scope="module")
def cube_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "in.nc"
    smooth_cube(t=BLOCKS, r=20, c=24).to_netcdf(path, encoding={"sst": {"chunksizes": (1, 20, 24)}})
    return path


def _args(cube_file: Path, out: Path, checkpoint: str, *extra: str) -> list[str]:
    return ["infill", str(cube_file), "-o", str(out), "--checkpoint", checkpoint, "--fit-steps", "0", "-q", *extra]


@pytest.fixture(scope="module")
def reference(cube_file: Path, tiny_checkpoint: str, tmp_path_factory) -> xr.Dataset:
    out = tmp_path_factory.mktemp("reference") / "one_process.zarr"
    assert main(_args(cube_file, out, tiny_checkpoint)) == 0
    return xr.open_zarr(out).load()


def _same(out: Path, reference: xr.Dataset) -> None:
    assert is_complete(out)
    got = xr.open_zarr(out)
    for v in ("sst", "sst_std", "sst_flag"):
        np.testing.assert_array_equal(got[v].values, reference[v].values)


@pytest.fixture
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  env={"OMP_NUM_THREADS": "1"}) as c:
        yield c


def test_two_worker_processes_give_the_single_process_output(cluster, cube_file, tiny_checkpoint, reference,
                                                             tmp_path) -> None:
    out = tmp_path / "cluster.zarr"
    assert main(_args(cube_file, out, tiny_checkpoint, "--scheduler", cluster.scheduler_address)) == 0
    _same(out, reference)


def test_a_worker_killed_mid_run_loses_no_block(cluster, cube_file, tiny_checkpoint, reference, tmp_path) -> None:
    out = tmp_path / "killed_worker.zarr"
    with distributed.Client(cluster.scheduler_address) as client:
        pids = list(client.run(os.getpid).values())
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(
        main(_args(cube_file, out, tiny_checkpoint, "--scheduler", cluster.scheduler_address))))
    run.start()
    done, deadline = 0, time.time() + 300
    while time.time() < deadline and run.is_alive():
        try:
            done = int(np.asarray(zarr.open_group(str(out), mode="r")[PROGRESS][...]).sum())
        except Exception:  # the store is not created yet
            done = 0
        if done >= 2:
            os.kill(pids[0], signal.SIGKILL)
            break
        time.sleep(0.02)
    run.join(timeout=600)
    assert 2 <= done < BLOCKS, "the run finished before a worker could be killed"
    assert codes == [0]
    _same(out, reference)


def test_workers_starts_a_local_cluster(cube_file, tiny_checkpoint, reference, tmp_path, capsys) -> None:
    out = tmp_path / "local.zarr"
    args = [a for a in _args(cube_file, out, tiny_checkpoint, "--workers", "2") if a != "-q"]  # progress shown
    assert main(args) == 0
    assert "local dask cluster: 2 worker processes" in capsys.readouterr().err
    _same(out, reference)
