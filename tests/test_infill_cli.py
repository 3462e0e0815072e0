"""`geonp infill` from the command line: the Zarr output, bad input, and resume after a kill."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import smooth_cube

from geonp.cli import main
from geonp.fill.output import PROGRESS, is_complete

REPO = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()) if path.is_dir() else [path]:
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def cube_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.nc"
    smooth_cube().to_netcdf(path)
    return path


def _infill(*args: str) -> int:
    return main(["infill", *map(str, args), "-q"])


def test_writes_cf_zarr_and_leaves_input_alone(cube_file: Path, tmp_path: Path, tiny_checkpoint: str) -> None:
    before = _digest(cube_file)
    out = tmp_path / "out.zarr"
    assert _infill(cube_file, "-o", out, "--checkpoint", tiny_checkpoint, "--fit-steps", "0") == 0
    assert _digest(cube_file) == before
    assert is_complete(out)
    ds = xr.open_zarr(out)
    assert {"sst", "sst_std", "sst_flag"} <= set(ds.data_vars)
    assert ds.sst_flag.dtype == np.int8 and list(ds.sst_flag.attrs["flag_values"]) == [0, 1, 2]
    assert ds.attrs["Conventions"] == "CF-1.11" and ds.attrs["geonp_model"] == "te-pt-tnp"
    assert "geonp infill" in ds.attrs["history"] and ds.attrs["geonp_fit_steps"] == 0
    assert zarr.open_group(str(out), mode="r").metadata.zarr_format == 3
    src = xr.open_dataset(cube_file)
    obs = np.isfinite(src.sst.values) & src.valid.values
    np.testing.assert_array_equal(ds.sst.values[obs], src.sst.values[obs])
    # A second run refuses the complete store; --overwrite replaces it.
    assert _infill(cube_file, "-o", out, "--checkpoint", tiny_checkpoint) == 2
    assert _infill(cube_file, "-o", out, "--checkpoint", tiny_checkpoint, "--fit-steps", "0", "--overwrite") == 0


def test_verbose_prints_how_the_fill_was_made(cube_file: Path, tmp_path: Path, tiny_checkpoint: str, capsys) -> None:
    out = tmp_path / "out.zarr"
    assert _infill(cube_file, "-o", out, "--checkpoint", tiny_checkpoint, "--fit-steps", "0", "-v") == 0
    printed = capsys.readouterr().out
    assert "model: te-pt-tnp" in printed and "fine-tuning steps: 0" in printed


def test_zarr_v2_on_request(cube_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "v2.zarr"
    assert _infill(cube_file, "-o", out, "--model", "linear", "--zarr-format", "2", "--window", "1,30,40") == 0
    assert zarr.open_group(str(out), mode="r").metadata.zarr_format == 2


def _bad(capsys, *args) -> str:
    code = _infill(*args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_bad_input_one_line_and_nothing_left(cube_file: Path, tmp_path: Path, capsys, tiny_checkpoint: str) -> None:
    out = tmp_path / "out.zarr"
    assert "--var nope" in _bad(capsys, cube_file, "-o", out, "--var", "nope")
    assert "larger than the cube" in _bad(capsys, cube_file, "-o", out, "--window", "1,500,500",
                                          "--checkpoint", tiny_checkpoint)
    assert "overwrite the input" in _bad(capsys, cube_file, "-o", cube_file)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00" * 64)
    assert "corrupt.safetensors" in _bad(capsys, cube_file, "-o", out, "--checkpoint", corrupt)
    assert "holds model 'te-pt-tnp'" in _bad(capsys, cube_file, "-o", out, "--model", "tnp",
                                              "--checkpoint", tiny_checkpoint)
    assert "unknown model" in _bad(capsys, cube_file, "-o", out, "--model", "nosuch")
    empty = tmp_path / "empty.nc"
    smooth_cube().assign(sst=lambda d: d.sst * np.nan).to_netcdf(empty)
    assert "empty.nc" in _bad(capsys, empty, "-o", out)
    dem = tmp_path / "dem.nc"
    xr.Dataset({"z": (("lat", "lon"), np.zeros((3, 3)))},
               coords={"lat": [0.0, 1.0, 2.0], "lon": [0.0, 1.0, 2.0]}).to_netcdf(dem)
    assert "dem.nc" in _bad(capsys, cube_file, "-o", out, "--elevation", dem)
    assert not out.exists()


def test_cuda_requested_without_gpu(cube_file: Path, tmp_path: Path, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert "CUDA" in _bad(capsys, cube_file, "-o", tmp_path / "o.zarr", "--device", "cuda")


def test_no_gaps_is_not_an_error(tmp_path: Path, capsys) -> None:
    path = tmp_path / "full.nc"
    smooth_cube().assign(sst=lambda d: d.sst.fillna(3.0)).to_netcdf(path)
    assert _infill(path, "-o", tmp_path / "o.zarr", "--model", "linear") == 0
    assert "no gaps" in capsys.readouterr().err
    assert is_complete(tmp_path / "o.zarr")


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130)], ids=["kill", "ctrl-c"])
def test_resume_after_kill_matches_an_uninterrupted_run(tmp_path: Path, tiny_checkpoint: str, sig, code) -> None:
    """Kill `geonp infill` mid-run (SIGKILL, or Ctrl-C: exit 130), rerun the same command: identical output."""
    path = tmp_path / "in.nc"
    smooth_cube(t=12, r=20, c=24).to_netcdf(path, encoding={"sst": {"chunksizes": (1, 20, 24)}})
    args = [sys.executable, "-m", "geonp", "infill", str(path), "--checkpoint", tiny_checkpoint, "--fit-steps", "2",
            "-q"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reference = tmp_path / "reference.zarr"
    subprocess.run([*args, "-o", str(reference)], env=env, check=True, timeout=600)

    out = tmp_path / "killed.zarr"
    # Ctrl-C as at a terminal even when the suite itself runs in the background (`cmd &` starts
    # children with SIGINT ignored, and Python then never raises KeyboardInterrupt).
    proc = subprocess.Popen([*args, "-o", str(out)], env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    done = 0
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            done = int(np.asarray(zarr.open_group(str(out), mode="r")[PROGRESS][...]).sum())
        except Exception:  # the store is not created yet
            done = 0
        if done >= 3:
            proc.send_signal(sig)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, "the run finished before it could be killed"
    if sig == signal.SIGINT:
        assert err.strip().splitlines()[-1] == f"geonp: interrupted; run the same command again to resume {out}"
        assert "Traceback" not in err
    assert not is_complete(out) and 3 <= done < 12
    subprocess.run([*args, "-o", str(out)], env=env, check=True, timeout=600)
    assert is_complete(out)
    a, b = xr.open_zarr(reference), xr.open_zarr(out)
    for v in ("sst", "sst_std", "sst_flag"):
        np.testing.assert_array_equal(a[v].values, b[v].values)


@pytest.mark.parametrize("record, why", [
    ({"inputs": {"kind": "cube", "channels": ["lat", "lon", "time"], "normalisation": {}}},
     "an encoding geonp no longer trains: inputs lat, lon, time normalised over its training region"),
    ({"inputs": {"kind": "synthetic", "generator": "gp-se"}}, "synthetic gp-se tasks"),
    ({}, "does not record what inputs"),
])
def test_weights_trained_on_other_inputs_are_refused(cube_file: Path, tmp_path: Path, capsys, record, why) -> None:
    # geonp train writes the inputs record; infill (and evaluate, which runs infill) reads it.
    from geonp.models import build, save

    checkpoint = tmp_path / "other.safetensors"
    save(build("te-pt-tnp", 3, 1, preset="tiny"), checkpoint, extra=record)
    out = tmp_path / "out.zarr"
    message = _bad(capsys, cube_file, "-o", out, "--checkpoint", checkpoint)
    assert why in message and "other.safetensors" in message and "data: {name: windows" in message
    assert not out.exists()


def test_a_ctrl_c_a_library_dropped_still_stops_the_blocks(cube_file: Path, tmp_path: Path, tiny_checkpoint: str,
                                                          monkeypatch, capsys) -> None:
    """The key press is remembered: the block loop stops at the next block with exit 130, the
    store left unfinished, as when the interrupt is raised where it lands."""
    import geonp.cli
    from geonp import interrupt

    # Pressed before the first block and dropped (no KeyboardInterrupt raised); the suite's own
    # SIGINT handler is left alone.
    monkeypatch.setattr(geonp.cli, "catch_ctrl_c", interrupt._pressed.set)
    out = tmp_path / "out.zarr"
    try:
        assert _infill(cube_file, "-o", out, "--checkpoint", tiny_checkpoint, "--fit-steps", "0") == 130
    finally:
        interrupt._pressed.clear()
    assert "geonp: interrupted" in capsys.readouterr().err
    assert not is_complete(out)
