"""The infill output store: CF attributes, block-wise resumable writes, incomplete never looks complete."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from geonp.data import open_cube
from geonp.fill.output import FLAG_INFILLED, FLAG_OBSERVED, STATUS, InfillStore, is_complete, output_template


@pytest.fixture
def cube(tmp_path):
    sst = np.random.default_rng(0).normal(15, 2, (3, 10, 12)).astype(np.float32)
    sst[:, 2:5, 3:7] = np.nan
    ds = xr.Dataset({"sst": (("time", "lat", "lon"), sst,
                             {"units": "degC", "standard_name": "sea_surface_temperature"})},
                    coords={"time": pd.date_range("2020", periods=3), "lat": np.arange(10.0), "lon": np.arange(12.0)})
    ds.chunk({"time": 1, "lat": 5, "lon": 6}).to_zarr(tmp_path / "in.zarr")
    return open_cube(tmp_path / "in.zarr")


def _fill(store, cube, only=None):
    for n, (index, region) in enumerate(store.blocks()):
        if only is not None and n not in only:
            continue
        obs = cube["sst"].isel(region).values
        flag = np.where(np.isnan(obs), FLAG_INFILLED, FLAG_OBSERVED).astype(np.int8)
        store.write_block(index, region, {"sst": np.nan_to_num(obs, nan=14.0), "sst_std": np.where(flag, 0.5, 0.0),
                                          "sst_flag": flag})


def test_template_has_cf_attributes_and_the_input_chunks(cube):
    out = output_template(cube, ["sst"])
    assert out["sst"].attrs["ancillary_variables"] == "sst_std sst_flag"
    assert out["sst_std"].attrs == {"long_name": "1-sigma predictive standard deviation of sst", "units": "degC",
                                    "standard_name": "sea_surface_temperature standard_error"}
    assert out["sst_flag"].attrs["standard_name"] == "sea_surface_temperature status_flag"
    assert list(out["sst_flag"].attrs["flag_values"]) == [0, 1, 2]
    assert out["sst"].chunks == cube["sst"].chunks


def test_a_run_killed_midway_resumes_and_matches_an_uninterrupted_one(cube, tmp_path):
    request = {"input": "in.zarr", "model": "test"}
    whole = InfillStore(tmp_path / "a.zarr", output_template(cube, ["sst"]), request, {"Conventions": "CF-1.11"})
    _fill(whole, cube)
    whole.finish()
    part = InfillStore(tmp_path / "b.zarr", output_template(cube, ["sst"]), request, {"Conventions": "CF-1.11"})
    _fill(part, cube, only={0, 1, 2})  # "killed" after three of twelve blocks
    assert not is_complete(tmp_path / "b.zarr")
    assert xr.open_zarr(tmp_path / "b.zarr").attrs[STATUS] == "incomplete"
    with pytest.raises(RuntimeError, match="9 blocks are not written"):
        part.finish()
    again = InfillStore(tmp_path / "b.zarr", output_template(cube, ["sst"]), request, {"Conventions": "CF-1.11"})
    assert again.resumed and again.done().sum() == 3
    todo = {n for n, done in enumerate(again.done().ravel()) if not done}
    _fill(again, cube, only=todo)
    again.finish()
    a, b = xr.open_zarr(tmp_path / "a.zarr"), xr.open_zarr(tmp_path / "b.zarr")
    assert is_complete(tmp_path / "b.zarr") and b.attrs["Conventions"] == "CF-1.11"
    for v in ("sst", "sst_std", "sst_flag"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    assert (b["sst_flag"].values >= 0).all() and b["sst"].notnull().all()


def test_a_store_is_not_resumed_with_other_blocks(cube, tmp_path):
    """Its progress bytes count blocks: the same request over the input chunked otherwise starts
    nothing on top of them."""
    path, request = tmp_path / "out.zarr", {"input": "in.zarr", "model": "test"}
    _fill(InfillStore(path, output_template(cube, ["sst"]), request), cube, only={0, 1, 2})
    for chunks in ({"time": 3, "lat": 10, "lon": 12}, {"time": 3, "lat": 5, "lon": 2}):  # 1 block; 12 others
        with pytest.raises(FileExistsError, match="not an unfinished run of this same command"):
            InfillStore(path, output_template(cube.chunk(chunks), ["sst"]), request)
    assert InfillStore(path, output_template(cube, ["sst"]), request).done().sum() == 3


def test_existing_outputs_are_refused_unless_overwrite(cube, tmp_path):
    path = tmp_path / "out.zarr"
    store = InfillStore(path, output_template(cube, ["sst"]), {"model": "a"})
    _fill(store, cube)
    store.finish()
    with pytest.raises(FileExistsError, match="complete infill output"):
        InfillStore(path, output_template(cube, ["sst"]), {"model": "a"})
    # An unfinished store of another request gives way while no block is written, not after.
    InfillStore(tmp_path / "unstarted.zarr", output_template(cube, ["sst"]), {"model": "a"})
    assert not InfillStore(tmp_path / "unstarted.zarr", output_template(cube, ["sst"]), {"model": "b"}).resumed
    _fill(InfillStore(tmp_path / "other.zarr", output_template(cube, ["sst"]), {"model": "a"}), cube)
    with pytest.raises(FileExistsError, match="not an unfinished run of this same command"):
        InfillStore(tmp_path / "other.zarr", output_template(cube, ["sst"]), {"model": "b"})
    fresh = InfillStore(path, output_template(cube, ["sst"]), {"model": "b"}, overwrite=True)
    assert not fresh.resumed and not is_complete(path)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="not a Zarr store"):
        InfillStore(tmp_path / "folder", output_template(cube, ["sst"]), {"model": "a"})
