"""The bad-input matrix (issue #16 §1): every case through the command line, each checked alike.

For each case: a non-zero exit, exactly one line on stderr that starts with ``geonp`` and names
what is wrong, no traceback, no output store that looks complete, and every input file unchanged
(checksum before and after). Behaviour that is *not* an error (no gaps, +-inf, integer fields, a
Zarr chunk that was never written) has its own tests at the end, as do a read-only output folder
and a full disk, which need a tmpfs the test can mount (skipped with the reason otherwise).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import smooth_cube

from geonp.cli import main
from geonp.fill.output import is_complete

WEIGHTS = Path(__file__).resolve().parents[1] / "geonp" / "weights" / "te-pt-tnp.safetensors"
FAST = ["--model", "linear", "--fit-steps", "0", "-q"]


@dataclass
class Case:
    argv: list  # after "geonp"
    expect: str  # a part of the one error line
    inputs: list[Path] = field(default_factory=list)  # files whose bytes must not change
    out: Path | None = None  # the output that must not look complete
    code: int = 2


CASES: list = []


def case(build: Callable[[Path], Case]) -> Callable[[Path], Case]:
    CASES.append(pytest.param(build, id=build.__name__))
    return build


def _cube(tmp: Path, name: str = "in.nc", ds: xr.Dataset | None = None) -> Path:
    path = tmp / name
    ds = smooth_cube() if ds is None else ds
    ds.to_zarr(path) if name.endswith(".zarr") else ds.to_netcdf(path)
    return path


def _infill(tmp: Path, path: Path, expect: str, *extra, out: str = "out.zarr") -> Case:
    return Case(["infill", path, "-o", tmp / out, *FAST, *extra], expect, [path], tmp / out)


# -- inputs that are not what they claim --------------------------------------------------------

@case
def missing_path(tmp):
    return _infill(tmp, tmp / "nope.nc", "nope.nc: no such file or directory")


@case
def not_a_dataset(tmp):
    (tmp / "notes.nc").write_text("field notes, not a dataset\n")
    return _infill(tmp, tmp / "notes.nc", "notes.nc: cannot read it as NetCDF, GRIB, Zarr or GeoTIFF")


@case
def truncated_netcdf(tmp):
    whole = _cube(tmp, "whole.nc").read_bytes()
    (tmp / "cut.nc").write_bytes(whole[: len(whole) // 2])
    return _infill(tmp, tmp / "cut.nc", "cut.nc: cannot read it")


@case
def unknown_variable(tmp):
    return _infill(tmp, _cube(tmp), "--var nope: no such variable", "--var", "nope")


@case
def no_lat_lon(tmp):
    xr.Dataset({"sst": (("a", "b"), np.ones((4, 4)))}).to_netcdf(tmp / "flat.nc")
    return _infill(tmp, tmp / "flat.nc", "flat.nc: no latitude coordinate found")


@case
def two_d_coordinates_without_cf_hints(tmp):
    grid = np.ones((4, 5))
    xr.Dataset({"sst": (("a", "b"), grid)}, coords={"p": (("a", "b"), grid), "q": (("a", "b"), grid)}).to_netcdf(
        tmp / "curvi.nc")
    return _infill(tmp, tmp / "curvi.nc", "curvi.nc: no latitude coordinate found")


@case
def non_monotonic_lat(tmp):
    ds = smooth_cube()
    ds = ds.assign_coords(lat=np.r_[ds.lat.values[:15], ds.lat.values[:15][::-1] - 0.01])
    return _infill(tmp, _cube(tmp, ds=ds), "lat is not monotonic")


@case
def duplicate_lat(tmp):
    ds = smooth_cube()
    lat = ds.lat.values.copy()
    lat[3] = lat[2]
    return _infill(tmp, _cube(tmp, ds=ds.assign_coords(lat=lat)), "lat is not monotonic (or repeats a value)")


@case
def duplicate_times(tmp):
    ds = smooth_cube()
    ds = ds.assign_coords(time=[ds.time.values[0]] * 3)
    return _infill(tmp, _cube(tmp, ds=ds), "duplicate times: 2020-01-01")


@case
def boolean_variable(tmp):
    return _infill(tmp, _cube(tmp), "--var valid: a boolean mask", "--var", "valid")


@case
def all_nan_variable(tmp):
    return _infill(tmp, _cube(tmp, ds=smooth_cube().assign(sst=lambda d: d.sst * np.nan)),
                   "variable 'sst' holds no finite value")


@case
def absurd_values(tmp):
    ds = smooth_cube()
    ds["sst"] = ds.sst.fillna(1e30)  # an undeclared fill value
    return _infill(tmp, _cube(tmp, ds=ds), "look like an undeclared fill value")


@case
def single_cell_window(tmp):
    return _infill(tmp, _cube(tmp, ds=smooth_cube().isel(lat=[25], lon=[35])), "larger than the cube",
                   "--window", "1,16,16")


# -- arguments ----------------------------------------------------------------------------------

@case
def window_larger_than_the_cube(tmp):
    return _infill(tmp, _cube(tmp), "--window 1,500,500: larger than the cube", "--window", "1,500,500")


@case
def window_of_zero_cells(tmp):
    return _infill(tmp, _cube(tmp), "--window: expected T,R,C (or R,C) cells, each at least 1", "--window", "0,16,16")


@case
def negative_window(tmp):
    return _infill(tmp, _cube(tmp), "each at least 1", "--window", "1,-16,16")


@case
def batch_size_zero(tmp):
    return _infill(tmp, _cube(tmp), "--batch-size must be >= 1", "--batch-size", "0")


@case
def negative_fit_steps(tmp):
    path = _cube(tmp)
    return Case(["infill", path, "-o", tmp / "o.zarr", "--model", "te-pt-tnp", "--fit-steps", "-1", "-q"],
                "--fit-steps must be >= 0", [path], tmp / "o.zarr")


@case
def unknown_option(tmp):
    return _infill(tmp, _cube(tmp), "unrecognized arguments: --colour", "--colour", "red")


@case
def unknown_model(tmp):
    path = _cube(tmp)
    return Case(["infill", path, "-o", tmp / "o.zarr", "--model", "nosuch", "-q"], "unknown model", [path],
                tmp / "o.zarr")


@case
def cuda_without_a_gpu(tmp):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    return _infill(tmp, _cube(tmp), "CUDA", "--device", "cuda")


@case
def elevation_not_covering_the_cube(tmp):
    dem = tmp / "dem.nc"
    xr.Dataset({"z": (("lat", "lon"), np.zeros((3, 3)))}, coords={"lat": [0.0, 1.0, 2.0], "lon": [0.0, 1.0, 2.0]}
               ).to_netcdf(dem)
    c = _infill(tmp, _cube(tmp), "does not cover the cube", "--elevation", dem)
    c.inputs.append(dem)
    return c


@case
def elevation_on_a_grid_without_lat_lon(tmp):
    dem = tmp / "dem_utm.nc"  # a projected DEM in metres with no CRS or lat/lon to place it
    xr.Dataset({"z": (("y", "x"), np.zeros((3, 3)))}, coords={"y": [0.0, 1e3, 2e3], "x": [0.0, 1e3, 2e3]}
               ).to_netcdf(dem)
    c = _infill(tmp, _cube(tmp), "dem_utm.nc: no latitude coordinate found", "--elevation", dem)
    c.inputs.append(dem)
    return c


# -- checkpoints and configs --------------------------------------------------------------------

def _with_checkpoint(tmp: Path, checkpoint: Path, expect: str, model: str = "te-pt-tnp") -> Case:
    path = _cube(tmp)
    return Case(["infill", path, "-o", tmp / "o.zarr", "--model", model, "--checkpoint", checkpoint, "-q"], expect,
                [path, checkpoint], tmp / "o.zarr")


@case
def checkpoint_for_another_model(tmp):
    return _with_checkpoint(tmp, WEIGHTS, "holds model 'te-pt-tnp', not 'convcnp'", model="convcnp")


@case
def truncated_checkpoint(tmp):
    data = WEIGHTS.read_bytes()
    (tmp / "cut.safetensors").write_bytes(data[: len(data) // 2])
    return _with_checkpoint(tmp, tmp / "cut.safetensors", "cut.safetensors: not a readable safetensors file")


@case
def checkpoint_with_a_pickle_payload(tmp):
    torch.save({"weights": torch.ones(3)}, tmp / "pickled.safetensors")
    return _with_checkpoint(tmp, tmp / "pickled.safetensors", "refusing a pickle/torch.save payload")


def _config(tmp: Path, text: str, expect: str) -> Case:
    (tmp / "train.yaml").write_text(text)
    return Case(["train", tmp / "train.yaml"], expect, [tmp / "train.yaml"], None)


@case
def config_with_an_unknown_key(tmp):
    return _config(tmp, "model: te-pt-tnp\nout_dir: run\nstepz: 3\n", "train.yaml: unknown key(s) stepz")


@case
def config_with_a_wrong_type(tmp):
    return _config(tmp, "model: te-pt-tnp\nout_dir: run\nsteps: many\n", "train.yaml: steps must be an integer")


@case
def config_with_zero_steps(tmp):
    return _config(tmp, "model: te-pt-tnp\nout_dir: run\nsteps: 0\n", "train.yaml: steps must be >= 1")


@case
def config_that_is_not_yaml(tmp):
    return _config(tmp, "model: [te-pt-tnp\n", "train.yaml: not valid YAML at line 2")


@case
def config_naming_missing_starting_weights(tmp):
    # A relative path is looked for from the working directory, and the error says where.
    return _config(tmp, f"model: te-pt-tnp\nout_dir: {tmp / 'run'}\ninit_from: nowhere.safetensors\n",
                   f"config init_from: {Path.cwd().resolve() / 'nowhere.safetensors'}: no such file")


@case
def config_asking_for_cube_tasks(tmp):
    # The task encoding geonp no longer trains: the error says what to write instead.
    return _config(tmp, f"model: te-pt-tnp\nout_dir: {tmp / 'run'}\ndata: {{name: cube, variables: [t2m]}}\n",
                   "data: name: cube (tasks in a cube's normalised lat/lon/time) is no longer a task source; "
                   "train on windows of the cube")


@case
def config_naming_a_missing_window_file(tmp):
    return _config(tmp, f"model: te-pt-tnp\nout_dir: {tmp / 'run'}\ndata: {{name: windows, files: [{{path: "
                   f"{tmp / 'gone.nc'}, variable: sst}}]}}\n",
                   f"config data.files[0].path: {(tmp / 'gone.nc').resolve()}: no such file")


@case
def config_whose_out_dir_is_a_file(tmp):
    (tmp / "taken").write_text("a file")
    case = _config(tmp, f"model: te-pt-tnp\nout_dir: {tmp / 'taken'}\n", "out_dir: ")
    case.expect = f"config out_dir: {tmp.resolve() / 'taken'} is a file, not a folder"
    case.inputs.append(tmp / "taken")
    return case


@case
def config_whose_out_dir_holds_its_input(tmp):
    (tmp / "run").mkdir()
    path = _cube(tmp / "run", "cube.nc")
    case = _config(tmp, f"model: te-pt-tnp\nout_dir: {tmp / 'run'}\n"
                   f"data: {{name: windows, files: [{{path: {path}, variable: t2m}}]}}\n",
                   "holds the input data.files[0].path")
    case.inputs.append(path)
    return case


# -- outputs --------------------------------------------------------------------------------------

@case
def output_equals_input(tmp):
    path = _cube(tmp, "in.zarr")
    return Case(["infill", path, "-o", path, *FAST], "would overwrite the input", [path], None)


@case
def output_inside_the_input(tmp):
    path = _cube(tmp, "in.zarr")
    return Case(["infill", path, "-o", path / "out.zarr", *FAST], "inside the input", [path], path / "out.zarr")


@case
def output_exists_without_overwrite(tmp):
    path = _cube(tmp)
    assert main(["infill", str(path), "-o", str(tmp / "done.zarr"), *FAST]) == 0
    return Case(["infill", path, "-o", tmp / "done.zarr", *FAST], "already exists (a complete infill output)",
                [path, tmp / "done.zarr"], None)


@case
def output_is_a_folder_that_is_not_zarr(tmp):
    (tmp / "photos").mkdir()
    (tmp / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    return _infill(tmp, _cube(tmp), "photos exists and is not a Zarr store", out="photos")


# -- the other commands -----------------------------------------------------------------------------

@case
def evaluate_an_unknown_variable(tmp):
    path = _cube(tmp)
    return Case(["evaluate", path, "--var", "nope", "--model", "linear"], "unknown variable 'nope'", [path])


@case
def evaluate_a_missing_file(tmp):
    return Case(["evaluate", tmp / "nope.nc", "--var", "sst", "--model", "linear"], "no such file or directory")


@case
def evaluate_one_sample(tmp):
    path = _cube(tmp)
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "--samples", "1"],
                "--samples 1: scoring samples needs at least 2", [path])


@case
def plot_a_file_that_is_not_an_output(tmp):
    path = _cube(tmp)
    return Case(["plot", path, "-o", tmp / "map.png"], "not an infill output", [path])


@case
def plot_a_time_out_of_range(tmp):
    path = _cube(tmp)
    assert main(["infill", str(path), "-o", str(tmp / "done.zarr"), *FAST]) == 0
    return Case(["plot", tmp / "done.zarr", "--time", "99", "-o", tmp / "map.png"], "time index 99 is out of range",
                [tmp / "done.zarr"])


@case
def plot_an_unknown_region(tmp):
    path = _cube(tmp)
    assert main(["infill", str(path), "-o", str(tmp / "done.zarr"), *FAST]) == 0
    return Case(["plot", tmp / "done.zarr", "--region", "atlantis", "-o", tmp / "map.png"], "atlantis",
                [tmp / "done.zarr"])


@case
def fetch_with_a_bad_area(tmp):
    return Case(["fetch", "era5", "--variable", "2m_temperature", "--start", "2019-01-01", "--end", "2019-01-02",
                 "--area", "1/2/3", "-o", tmp / "era5.zarr"], "--area", [], tmp / "era5.zarr")


@case
def fetch_with_the_end_before_the_start(tmp):
    return Case(["fetch", "era5", "--variable", "2m_temperature", "--start", "2019-02-01", "--end", "2019-01-01",
                 "--area", "50/-2/46/3", "-o", tmp / "era5.zarr"], "--end", [], tmp / "era5.zarr")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _run(argv: list) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own exits
        return int(stop.code)


def outcome(c: Case) -> dict:
    """Run one case: its exit code, stderr, and whether it left a complete output or changed an input."""
    before = {p: _digest(p) for p in c.inputs if p.exists()}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = _run(c.argv)
    return {"code": code, "stderr": err.getvalue(), "lines": [x for x in err.getvalue().splitlines() if x.strip()],
            "complete_output": c.out is not None and c.out.exists() and is_complete(c.out),
            "modified": [str(p) for p, d in before.items() if _digest(p) != d]}


def _check(c: Case) -> str:
    got = outcome(c)
    err, lines = got["stderr"], got["lines"]
    assert got["code"] == c.code, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("geonp") and c.expect in lines[0], err
    assert not got["complete_output"]
    assert not got["modified"], f"{got['modified']} modified"
    return lines[0]


@pytest.mark.parametrize("build", CASES)
def test_bad_input(build, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no CDS credentials from the machine
    for var in ("CDSAPI_URL", "CDSAPI_KEY", "CDSAPI_RC"):
        monkeypatch.delenv(var, raising=False)
    _check(build(tmp_path))


def test_the_matrix_is_complete() -> None:
    assert len(CASES) >= 30


# -- not errors: decided behaviour ------------------------------------------------------------------

def test_no_gaps_gives_the_input_with_flags(tmp_path, capsys) -> None:
    ds = smooth_cube().assign(sst=lambda d: d.sst.fillna(3.0))
    path = _cube(tmp_path, ds=ds)
    assert _run(["infill", path, "-o", tmp_path / "o.zarr", *FAST]) == 0
    assert "no gaps inside the valid area" in capsys.readouterr().err
    out = xr.open_zarr(tmp_path / "o.zarr")
    np.testing.assert_array_equal(out.sst.values, ds.sst.values)
    assert set(np.unique(out.sst_flag.values)) <= {0, 2}


def test_infinities_are_filled_as_gaps_with_a_note(tmp_path, capsys) -> None:
    ds = smooth_cube()
    ds["sst"][0, 20, 20] = np.inf
    ds["sst"][1, 21, 21] = -np.inf
    path = _cube(tmp_path, ds=ds)
    assert _run(["infill", path, "-o", tmp_path / "o.zarr", *FAST]) == 0
    assert "sst: 2 cells hold +-inf; they are filled as gaps" in capsys.readouterr().err
    out = xr.open_zarr(tmp_path / "o.zarr")
    assert np.isfinite(out.sst.values[0, 20, 20]) and out.sst_flag.values[1, 21, 21] == 1


def test_an_integer_field_is_filled_as_numbers(tmp_path) -> None:
    ds = smooth_cube()
    ds["sst"] = (ds.sst * 100).astype("float32")
    path = tmp_path / "int.nc"  # stored as int16 with a declared fill value, as many products are
    ds.to_netcdf(path, encoding={"sst": {"dtype": "int16", "_FillValue": -32768}})
    assert _run(["infill", path, "-o", tmp_path / "o.zarr", *FAST]) == 0
    out = xr.open_zarr(tmp_path / "o.zarr")
    assert out.sst.dtype == np.float32 and np.isfinite(out.sst.values[out.sst_flag.values == 1]).all()


def test_a_zarr_chunk_never_written_is_a_gap_when_the_fill_value_is_nan(tmp_path) -> None:
    """A missing chunk reads as the array's fill value: NaN (xarray's default for floats) makes
    it a gap to fill; any other declared fill value is data (README, "Inputs")."""
    ds = smooth_cube()
    path = tmp_path / "in.zarr"
    ds.chunk({"time": 1, "lat": 15, "lon": 20}).to_zarr(path, zarr_format=3)
    chunk = path / "sst" / "c" / "1" / "1" / "1"
    assert chunk.is_file()
    chunk.unlink()
    assert _run(["infill", path, "-o", tmp_path / "o.zarr", *FAST]) == 0
    out = xr.open_zarr(tmp_path / "o.zarr")
    block = out.sst_flag.values[1, 15:30, 20:40]
    assert (block == 1).all() and np.isfinite(out.sst.values[1, 15:30, 20:40]).all()


# -- the machine: a read-only folder and a full disk (a tmpfs mounted for the test) ------------------

@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_read_only_output_folder(tmp_path) -> None:
    path = _cube(tmp_path)
    with _tmpfs(tmp_path / "ro", "size=64k,ro") as folder:
        line = _check(Case(["infill", path, "-o", folder / "o.zarr", *FAST], "Read-only file system", [path],
                           folder / "o.zarr", code=1))
    assert "o.zarr" in line


def test_a_full_disk(tmp_path) -> None:
    path = _cube(tmp_path, ds=smooth_cube(t=6, r=60, c=80))
    with _tmpfs(tmp_path / "small", "size=96k") as folder:
        _check(Case(["infill", path, "-o", folder / "o.zarr", *FAST], "No space left on device", [path],
                    folder / "o.zarr", code=1))


def test_a_grib_file_without_its_reader_names_the_extra_to_install(tmp_path, monkeypatch):
    import importlib.util

    from geonp.data.readers import open_raw

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cfgrib" else real(name, *a))
    (tmp_path / "t2m.grib").write_bytes(b"GRIB")
    with pytest.raises(ValueError, match=r"t2m.grib: cannot read it .*pip install 'geonp\[grib\]'"):
        open_raw(str(tmp_path / "t2m.grib"))


def test_a_dataset_outside_the_convention_is_refused_in_one_line() -> None:
    import pytest
    import xarray as xr

    import geonp

    values = np.random.default_rng(0).random((3, 20, 20))
    values[1, 5:9, 5:9] = np.nan
    ds = xr.Dataset({"t2m": (("time", "y", "x"), values)},
                    coords={"time": np.arange(3), "y": np.arange(20.0), "x": np.arange(20.0)})
    with pytest.raises(ValueError, match=r"no lat coordinate on dims \('time', 'y', 'x'\).*open_cube"):
        geonp.infill(ds, "t2m", "linear")
