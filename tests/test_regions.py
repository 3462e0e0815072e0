"""Named regions and cropping a cube to one (lat/lon grids and projected grids alike)."""

from __future__ import annotations

import pytest
from conftest import data_dir

from geonp.data import open_cube
from geonp.data.regions import Region, crop_to_region, get_region

DATA = data_dir()


def test_regions_registry_and_custom_bounds():
    assert get_region("central_europe") == Region("central_europe", (42.0, 53.0), (8.0, 28.0))
    assert get_region("western_europe").lon == (-4.0, 8.0) and get_region("northern_europe").lat == (53.0, 62.0)
    assert get_region((10, 20, -5, 5)).lat == (10.0, 20.0)
    assert get_region({"lat": [1, 2], "lon": [3, 4]}).lon == (3, 4)
    with pytest.raises(ValueError, match="south < north"):
        Region("bad", (50, 40), (0, 1))


@pytest.mark.skipif(DATA is None, reason="shared data folder absent (set GEONP_DATA)")
def test_a_projected_grid_is_cropped_by_its_cells_lat_lon():
    modis = open_cube(DATA / "satellite" / "modis_lst_brazil_2019-11-01.nc", "LST_Day_1km")
    part = crop_to_region(modis, get_region((-9, -8, -40, -39)))
    inside = (part["lat"] >= -9) & (part["lat"] <= -8) & (part["lon"] >= -40) & (part["lon"] <= -39)
    assert 0.5 < float(inside.mean()) <= 1.0 and part.sizes["y"] < 200
