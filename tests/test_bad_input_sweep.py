"""Cases found by a sweep of the command line with bad input (2026-12-01), in the bad-input
matrix's form (``test_bad_input``: one line on stderr naming the problem, a non-zero exit, no
complete output, every input unchanged), and what a refused fill must not leave behind."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import smooth_cube
from test_bad_input import FAST, Case, _check, _cube, _infill, _run

from geonp.data import zarr_store
from geonp.fill.output import is_complete
from geonp.output_paths import check_report_path, check_store_path

CASES: list = []


def case(build):
    CASES.append(pytest.param(build, id=build.__name__))
    return build


def _filled(tmp, name="done.zarr"):
    path = _cube(tmp)
    assert _run(["infill", path, "-o", tmp / name, *FAST]) == 0
    return tmp / name


# -- outputs that would destroy an input -------------------------------------------------------------

@case
def evaluate_onto_its_input(tmp):
    path = _cube(tmp)
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "-o", path],
                "geonp evaluate writes a markdown table", [path])


@case
def evaluate_into_a_folder(tmp):
    path = _cube(tmp)
    (tmp / "tables.md").mkdir()
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "-o", tmp / "tables.md"], "is a folder",
                [path])


@case
def infill_over_an_input_inside_the_output(tmp):
    store = _filled(tmp)
    inner = store / "input.nc"
    shutil.copy(_cube(tmp), inner)
    return Case(["infill", inner, "-o", store, *FAST, "--overwrite"], "lies inside the output", [inner])


@case
def infill_to_a_netcdf_name(tmp):
    return _infill(tmp, _cube(tmp), "writes a Zarr store (a folder), not a .nc file", out="filled.nc")


@case
def infill_to_no_name(tmp):
    path = _cube(tmp)
    return Case(["infill", path, "-o", "", *FAST], "name the output", [path])


# -- inputs ---------------------------------------------------------------------------------------

@case
def a_text_variable(tmp):
    ds = smooth_cube()
    ds["sst"] = (ds.sst.dims, np.full(ds.sst.shape, "x"))
    return _infill(tmp, _cube(tmp, ds=ds), "variable 'sst' holds text values, not numbers")


@case
def latitudes_beyond_the_pole(tmp):
    ds = smooth_cube()
    ds = ds.assign_coords(lat=np.linspace(80, 100, ds.sizes["lat"]))
    return _infill(tmp, _cube(tmp, ds=ds), "latitudes lie within -90..90")


@case
def a_time_step_without_a_date(tmp):
    ds = smooth_cube()
    times = ds.time.values.copy()
    times[1] = np.datetime64("NaT")
    return _infill(tmp, _cube(tmp, ds=ds.assign_coords(time=times)), "time holds 1 missing values (NaT)")


@case
def variables_in_a_netcdf_group(tmp):
    path = tmp / "grouped.nc"
    smooth_cube().to_netcdf(path, group="PRODUCT")
    return _infill(tmp, path, "its variables sit in NetCDF groups (PRODUCT)")


@case
def a_latitude_missing(tmp):
    ds = smooth_cube()
    lat = ds.lat.values.copy()
    lat[4] = np.nan
    return _infill(tmp, _cube(tmp, ds=ds.assign_coords(lat=lat)), "lat holds 1 missing values (NaN)")


@case
def a_damaged_zarr_chunk_after_the_first(tmp):
    """The first chunk reads (open_cube stops at a value there): the plan's read of every chunk
    finds the damaged one."""
    path = tmp / "in.zarr"
    smooth_cube(t=4).chunk({"time": 1}).to_zarr(path)
    last = sorted(p for p in (path / "sst").rglob("*") if p.is_file() and p.name != "zarr.json")[-1]
    last.write_bytes(b"\x00not a compressed chunk" * 8)
    return _infill(tmp, path, "reading sst failed (RuntimeError")


@case
def evaluate_with_its_json_onto_the_input(tmp):
    path = _cube(tmp, "scores.json")  # a NetCDF file, named as the table's JSON would be
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "-o", tmp / "scores.md"],
                "would overwrite the input", [path])


@case
def a_damaged_zarr_chunk(tmp):
    path = _cube(tmp, "in.zarr")
    chunk = next(p for p in sorted((path / "sst").rglob("*")) if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(b"\x00not a compressed chunk" * 8)
    return _infill(tmp, path, "variable 'sst' could not be read")


@case
def zarr_array_metadata_missing(tmp):
    path = tmp / "v2.zarr"
    smooth_cube().to_zarr(path, zarr_format=2, consolidated=False)
    (path / "sst" / ".zarray").unlink()
    return _infill(tmp, path, "Zarr cannot read sst")


# -- options --------------------------------------------------------------------------------------

@case
def a_negative_seed(tmp):
    return _infill(tmp, _cube(tmp), "--seed must be >= 0", "--seed", "-1")


@case
def more_threads_than_the_machine(tmp):
    return _infill(tmp, _cube(tmp), "--threads 100000: this machine has", "--threads", "100000")


@case
def a_window_that_is_not_numbers(tmp):
    return _infill(tmp, _cube(tmp), "--window: expected whole numbers", "--window", "a,b,c")


@case
def a_checkpoint_that_is_a_folder(tmp):
    (tmp / "weights").mkdir()
    return _infill(tmp, _cube(tmp), "a folder, not a checkpoint file", "--model", "te-pt-tnp",
                   "--checkpoint", tmp / "weights")


@case
def evaluate_a_checkpoint_for_no_model(tmp):
    path = _cube(tmp)
    (tmp / "w.safetensors").write_bytes(b"x")
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "--checkpoint",
                 f"kriging={tmp / 'w.safetensors'}", "-o", tmp / "cv.md"], "'kriging' is not among the models", [path])


@case
def evaluate_a_damaged_checkpoint_before_any_model_runs(tmp):
    path = _cube(tmp)
    (tmp / "w.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))
    # One line: had linear run first, its progress line would precede the error.
    return Case(["evaluate", path, "--var", "sst", "--model", "linear", "--model", "te-pt-tnp", "--checkpoint",
                 f"te-pt-tnp={tmp / 'w.safetensors'}", "-o", tmp / "cv.md"], "--checkpoint te-pt-tnp=", [path])


@case
def plot_at_a_huge_resolution(tmp):
    store = _filled(tmp)
    return Case(["plot", store, "-o", tmp / "map.png", "--dpi", "100000"], "--dpi must be between 1 and", [store])


@case
def plot_a_negative_number_of_samples(tmp):
    store = _filled(tmp)
    return Case(["plot", store, "-o", tmp / "map.png", "--samples", "-1"], "--samples must be >= 0", [store])


@case
def plot_a_truth_on_another_grid(tmp):
    store = _filled(tmp)
    other = _cube(tmp, "other.nc", smooth_cube().assign_coords(lat=lambda d: d.lat - 30.0))
    return Case(["plot", store, "-o", tmp / "map.png", "--truth", other], "not the same grid", [store, other])


@case
def plot_an_unfinished_fill(tmp):
    store = _filled(tmp)
    group = zarr.open_group(str(store), mode="r+")
    group.attrs["geonp_status"] = "incomplete"
    zarr.consolidate_metadata(str(store))
    return Case(["plot", store, "-o", tmp / "map.png"], "an unfinished fill", [store])


@case
def demo_on_a_device_that_is_not_there(tmp):
    return Case(["demo", "-o", tmp / "demo", "--device", "tpu"], "device must be auto, cpu or cuda")


@pytest.mark.parametrize("build", CASES)
def test_bad_input_found_by_the_sweep(build, tmp_path) -> None:
    _check(build(tmp_path))


# -- what a refused command leaves -------------------------------------------------------------------

def test_a_fill_refused_after_its_store_was_made_does_not_block_the_fix(tmp_path) -> None:
    """te-pt-tnp refuses a 1 x 1 grid when it draws fine-tuning windows, after the store exists: the
    suggested fix (``--fit-steps 0``, another request) replaces that unstarted store instead of
    being refused as another run's unfinished output."""
    ds = smooth_cube().isel(lat=slice(20, 21), lon=slice(30, 31))
    ds["sst"] = ds.sst.copy(data=np.array([15.0, np.nan, 15.5]).reshape(3, 1, 1).astype(np.float32))
    ds["valid"] = ds.valid | True
    path, out = _cube(tmp_path, ds=ds), tmp_path / "o.zarr"
    assert _run(["infill", path, "-o", out, "-q"]) == 2
    assert out.exists() and not is_complete(out)
    assert _run(["infill", path, "-o", out, "-q", "--fit-steps", "0"]) == 0
    assert is_complete(out)


def test_an_unfinished_store_with_a_block_written_is_kept(tmp_path) -> None:
    """Only a store with no block written gives way to another request; one with a block is refused
    (its blocks are work), and resumed by its own command."""
    path, out = _cube(tmp_path, ds=smooth_cube(t=6)), tmp_path / "o.zarr"
    assert _run(["infill", path, "-o", out, *FAST]) == 0
    group = zarr.open_group(str(out), mode="r+")
    group.attrs["geonp_status"] = "incomplete"  # as a run stopped after its blocks left it
    zarr.consolidate_metadata(str(out))
    assert _run(["infill", path, "-o", out, *FAST, "--seed", "3"]) == 2  # another request
    assert out.exists()


def test_a_demo_refused_leaves_no_folder(tmp_path) -> None:
    assert _run(["demo", "-o", tmp_path / "demo", "--device", "tpu"]) == 2
    assert not (tmp_path / "demo").exists()


def test_a_constant_field_fills_with_its_constant(tmp_path) -> None:
    """DINEOF's held-out fit of a constant stack had a singular system (no cross-validation error,
    so no prior); its floor keeps it solvable and the fill is the constant."""
    ds = smooth_cube(t=4)
    ds["sst"] = ds.sst.where(ds.sst.isnull(), 5.0)
    path, out = _cube(tmp_path, ds=ds), tmp_path / "o.zarr"
    assert _run(["infill", path, "-o", out, "-q", "--fit-steps", "2"]) == 0
    filled = xr.open_zarr(out).sst.values
    assert np.nanmin(filled) == pytest.approx(5.0, abs=1e-4) and np.nanmax(filled) == pytest.approx(5.0, abs=1e-4)


def test_an_infill_output_filled_again_fills_only_its_field(tmp_path) -> None:
    """The output's ``sst_std`` and ``sst_flag`` describe ``sst`` (CF ``ancillary_variables``): not
    fields to fill by default."""
    store = _filled(tmp_path)
    assert _run(["infill", store, "-o", tmp_path / "again.zarr", *FAST]) == 0
    assert set(xr.open_zarr(tmp_path / "again.zarr").data_vars) == {"sst", "sst_std", "sst_flag"}


def test_an_unfinished_store_is_read_without_warnings(tmp_path) -> None:
    """A resumed fill reads its store beside the choices it saved there (``geonp_nugget.json``),
    which Zarr warns are not part of the hierarchy; geonp's users should not see that."""
    store = _filled(tmp_path)
    for saved in ("geonp_nugget.json", "geonp_history_used.json"):
        (store / saved).write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert zarr_store.read_state(store) is not None


def test_output_paths(tmp_path) -> None:
    source = _cube(tmp_path, "scene.nc")
    assert check_store_path(tmp_path / "a.zarr", source) == tmp_path / "a.zarr"
    assert check_report_path(tmp_path / "cv.md", source) == (tmp_path / "cv.md", tmp_path / "cv.json")
    store = _cube(tmp_path, "scene.zarr")
    for bad, why in [(store, "overwrite the input"), (store / "sub.zarr", "inside the input"),
                     (tmp_path / "x.nc", "not a .nc file"), (tmp_path, "lies inside the output"),
                     (".", "name the output")]:
        with pytest.raises(ValueError, match=why):
            check_store_path(bad, store)
    (tmp_path / "scene.json").write_text("{}")
    with pytest.raises(ValueError, match="would overwrite the input"):  # the JSON beside the table
        check_report_path(tmp_path / "scene.md", tmp_path / "scene.json")
    for bad in (tmp_path / "cv.json", tmp_path / "cv.nc", "..", ""):
        with pytest.raises(ValueError, match="-o"):
            check_report_path(bad, source)
    assert check_store_path("https://example.org/out.zarr", "https://example.org/in.zarr")
