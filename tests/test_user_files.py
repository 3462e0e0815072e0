"""The files users really have fill as given (issue: climate-model output and real files).

A property test writes inputs the way users do (see :mod:`user_files`) and runs ``geonp infill``
through the command line on each: it must exit 0 with an output aligned with the input, its
attributes, bounds and calendar kept, observed cells unchanged and every gap filled. Named tests
cover what one drawn file cannot show: the same answer whatever the chunking or writer, the real
CMIP files, evaluate and plot on climate-model calendars, extra dimensions through resume and a
dask cluster, and a date typed on a 360-day calendar.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import real_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from user_files import CALENDARS, EXTRA_DIMS, Layout, check_filled, read_back, user_dataset, write_user_file

from geonp.cli import main

FAST = ["--model", "linear", "--fit-steps", "0", "-q"]


def run(*argv) -> tuple[int, str]:
    """``geonp ARGV`` in this process: exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as stop:
            code = int(stop.code)
    return code, err.getvalue()


layouts = st.builds(
    Layout,
    calendar=st.sampled_from([*CALENDARS, None]),
    start_year=st.sampled_from([2000, 1850, 2300, 1500]),
    steps=st.integers(1, 3),
    extra=st.sampled_from([None, *EXTRA_DIMS]),
    order=st.permutations("teyx").map("".join),
    grid=st.sampled_from(["regular", "descending", "curvilinear"]),
    packed=st.booleans(),
    writer=st.sampled_from(["nc", "zarr2", "zarr3"]),
    chunks=st.sampled_from(["none", "data", "mixed"]),
    bounds=st.booleans(),
    seed=st.integers(0, 5),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts)
def test_every_file_a_user_writes_fills_as_given(tmp_path_factory, layout: Layout) -> None:
    folder = tmp_path_factory.mktemp("user")
    path = write_user_file(layout, folder)
    code, err = run("infill", path, "-o", folder / "out.zarr", *FAST)
    assert code == 0, err
    assert "error" not in err
    check_filled(read_back(path), xr.open_zarr(folder / "out.zarr"))


@pytest.mark.parametrize("writer", ["nc", "zarr2", "zarr3"])
def test_writer_and_chunking_never_change_the_fill(tmp_path: Path, writer: str) -> None:
    outs = []
    for chunks in ("none", "data", "mixed"):
        folder = tmp_path / chunks
        folder.mkdir()
        layout = Layout(calendar="360_day", extra="level", order="etyx", grid="curvilinear", writer=writer,
                        chunks=chunks)
        path = write_user_file(layout, folder)
        assert run("infill", path, "-o", folder / "out.zarr", *FAST)[0] == 0
        outs.append(xr.open_zarr(folder / "out.zarr").load())
    for other in outs[1:]:
        xr.testing.assert_identical(outs[0].drop_attrs(), other.drop_attrs())


def test_the_real_cmip_files_fill_as_given(tmp_path: Path) -> None:
    """CanESM2 monthly tas (365_day, global T42, time and cell bounds) and daily tasmax beside a
    4-D (time, ts, lon, lat) auxiliary variable, with cells hidden the way clouds would."""
    for name, variable in (("climate_models/tas_Amon_CanESM2_rcp85_r1i1p1_200701-200712.nc", "tas"),
                           ("climate_models/tasmax_day_CanESM2_rcp85_r1i1p1_na10kgrid_qm-moving-50bins-"
                            "detrend_2095.nc", "tasmax")):
        ds = xr.open_dataset(real_file(name), decode_times=xr.coders.CFDatetimeCoder(use_cftime=True)).load()
        values = ds[variable].values.copy()
        rng = np.random.default_rng(0)
        values[rng.random(values.shape) < 0.15] = np.nan
        values[:, 10:16, 12:20] = np.nan
        ds[variable].values = values
        path = tmp_path / Path(name).name
        ds.to_netcdf(path)
        out = tmp_path / f"{variable}.zarr"
        code, err = run("infill", path, "-o", out, "--var", variable, *FAST)
        assert code == 0, err
        given_ds = xr.open_dataset(path)
        check_filled(given_ds, xr.open_zarr(out), variable)
        assert xr.open_zarr(out)["time"].encoding["calendar"] == "365_day"


def test_evaluate_and_plot_work_on_climate_model_calendars(tmp_path: Path) -> None:
    layout = Layout(calendar="360_day", steps=3, extra="plev", order="txey", grid="curvilinear")
    path = write_user_file(layout, tmp_path)
    assert run("evaluate", path, "--var", "tas", "--model", "linear", "-o", tmp_path / "skill.md")[0] == 0
    assert "| linear |" in (tmp_path / "skill.md").read_text()
    assert run("infill", path, "-o", tmp_path / "out.zarr", *FAST)[0] == 0
    # The 30th of February exists on a 360-day calendar; --time finds it.
    code, err = run("plot", tmp_path / "out.zarr", "-o", tmp_path / "map.png", "--time", "2000-02-30",
                    "--point", "44,0")
    assert code == 0, err
    assert (tmp_path / "map.png").stat().st_size > 10_000
    code, err = run("plot", tmp_path / "out.zarr", "-o", tmp_path / "map.png", "--time", "2000-02-31")
    assert code == 2 and "not a date of the 360_day calendar" in err
    # A pressure level by its value; one that is not there is named.
    code, err = run("plot", tmp_path / "out.zarr", "-o", tmp_path / "map.png", "--select", "plev=600")
    assert code == 0, err
    code, err = run("plot", tmp_path / "out.zarr", "-o", tmp_path / "map.png", "--select", "plev=650")
    assert code == 2 and "--select plev=650: not a value of plev (500, 600)" in err


def test_extra_dims_resume_and_cluster_give_the_same_store(tmp_path: Path, monkeypatch) -> None:
    """Every member filled by itself: interrupted after three blocks and resumed, or spread over a
    local dask cluster, the store is the one an uninterrupted run writes."""
    from geonp.fill import runners

    layout = Layout(calendar="noleap", extra="member", order="tyxe", writer="zarr3", chunks="data")
    path = write_user_file(layout, tmp_path)
    assert run("infill", path, "-o", tmp_path / "whole.zarr", *FAST)[0] == 0
    whole = xr.open_zarr(tmp_path / "whole.zarr").load()

    real, calls = runners.block_values, []

    def stops_after_three(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt  # Ctrl-C
        return real(*args, **kwargs)

    monkeypatch.setattr(runners, "block_values", stops_after_three)
    assert run("infill", path, "-o", tmp_path / "resumed.zarr", *FAST)[0] == 130
    monkeypatch.setattr(runners, "block_values", real)
    code, err = run("infill", path, "-o", tmp_path / "resumed.zarr", "--model", "linear", "--fit-steps", "0")
    assert code == 0 and "3 of" in err, err
    assert run("infill", path, "-o", tmp_path / "cluster.zarr", "--workers", "2", *FAST)[0] == 0
    for name in ("resumed", "cluster"):
        other = xr.open_zarr(tmp_path / f"{name}.zarr").load()
        xr.testing.assert_identical(whole.drop_attrs(), other.drop_attrs())


def test_a_level_without_data_is_left_as_it_is(tmp_path: Path) -> None:
    ds = user_dataset(Layout(calendar="noleap", extra="level", order="etyx"))
    ds["tas"][1] = np.nan  # a pressure level under the ground everywhere
    ds.to_netcdf(tmp_path / "in.nc")
    code, err = run("infill", tmp_path / "in.nc", "-o", tmp_path / "out.zarr", "--model", "linear",
                    "--fit-steps", "0")
    assert code == 0, err
    assert "tas[level=1] hold no observed value" in err
    out = xr.open_zarr(tmp_path / "out.zarr")
    assert np.isnan(out["tas"][1].values).all() and (out["tas_flag"][1].values == 2).all()
    assert np.isfinite(out["tas"][0].values).all()
