"""Shared fixtures: small random tasks in the geonp calling convention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import xarray as xr

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def data_dir() -> Path | None:
    """The shared real-data folder: ``$GEONP_DATA`` or ``../shared/data``; None when absent."""
    env = os.environ.get("GEONP_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return path if path.is_dir() else None


def real_file(name: str) -> str:
    """Path of a shared real-data file; skips the calling test when the folder or file is absent."""
    folder = data_dir()
    if folder is None:
        pytest.skip("real data folder absent (set GEONP_DATA or provide ../shared/data)")
    path = folder / name
    if not path.exists():
        pytest.skip(f"{path} absent")
    return str(path)


def random_tasks(b: int = 3, nc: int = 12, nt: int = 9, dx: int = 1, dy: int = 1, seed: int = 0):
    """``(xc, yc, xt, mask_c)`` with task 0 padded after 7 context points (padding holds NaN)."""
    g = torch.Generator().manual_seed(seed)
    xc = torch.rand(b, nc, dx, generator=g) * 4 - 2
    yc = torch.randn(b, nc, dy, generator=g)
    xt = torch.rand(b, nt, dx, generator=g) * 6 - 3
    mask_c = torch.ones(b, nc, dtype=torch.bool)
    mask_c[0, 7:] = False
    xc[0, 7:] = float("nan")
    yc[0, 7:] = float("nan")
    return xc, yc, xt, mask_c


@pytest.fixture
def one_thread():
    """Run a test on one intra-op thread: small tensors gain nothing from a second one, and on a
    busy 2-core machine it made tiny-model tests 5-10x slower (measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tasks():
    return random_tasks()


def smooth_cube(t: int = 3, r: int = 30, c: int = 40, seed: int = 0) -> xr.Dataset:
    """A smooth field with a rectangular hole, scattered missing cells, and land (NaN always) in a
    corner: the cube :mod:`pipelines.benchmarks.device_agreement` fills on two devices."""
    from pipelines.benchmarks.device_agreement import synthetic_cube

    return synthetic_cube(t, r, c, seed)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """A te-pt-tnp (tiny preset, random weights) checkpoint with the infill input scaling."""
    from geonp.models import build, save

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "te.safetensors"
    save(build("te-pt-tnp", 3, 1, preset="tiny"), path, extra={"infill": {"cells_per_unit": 8.0}})
    return str(path)
