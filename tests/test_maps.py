"""geonp.maps and `geonp plot`: map panels of an infill output, drawn offline with the shipped
Natural Earth coastlines, in the grid's own CRS, with a cell's time series."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from geonp.cli import main
from geonp.maps import map_figure, natural_earth, plot_infill

PNG = b"\x89PNG"
ATTRS = {"units": "K", "long_name": "2 m temperature", "standard_name": "air_temperature"}


def _output(dims: tuple[str, ...], coords: dict, shape: tuple[int, ...], seed: int = 0,
            attrs: dict | None = None) -> tuple[xr.Dataset, xr.DataArray]:
    """An infill output of ``t2m`` (a smooth truth, ~40 % infilled cells, a block outside the
    valid area) and its truth."""
    rng = np.random.default_rng(seed)
    ny, nx = shape[-2:]
    truth = 280 + 10 * np.sin(np.linspace(0, 3, ny))[:, None] * np.cos(np.linspace(0, 4, nx))[None, :]
    truth = (np.broadcast_to(truth, shape) + rng.normal(0, 0.5, shape)).astype(np.float32)
    flag = np.where(rng.random(shape) < 0.4, 1, 0).astype(np.int8)
    flag[..., : ny // 4, : nx // 3] = 2
    value = np.where(flag == 1, truth + rng.normal(0, 1.0, shape), truth).astype(np.float32)
    value[flag == 2] = np.nan
    std = np.where(flag == 1, 1.0 + rng.random(shape), 0.0).astype(np.float32)
    std[flag == 2] = np.nan
    ds = xr.Dataset({"t2m": (dims, value, ATTRS),
                     "t2m_std": (dims, std, {"units": "K", "long_name": "1-sigma predictive standard deviation"}),
                     "t2m_flag": (dims, flag, {"flag_values": np.array([0, 1, 2], np.int8)})},
                    coords=coords, attrs=attrs or {"geonp_model": "te-pt-tnp"})
    return ds, xr.DataArray(truth, dims=dims, coords=ds.coords)


@pytest.fixture
def europe() -> tuple[xr.Dataset, xr.DataArray]:
    """Time 3 (6-hourly), lat 36 north to south (as ERA5 stores it), lon 48 over Europe."""
    coords = {"time": np.array(["2019-01-01T00", "2019-01-01T06", "2019-01-01T12"], dtype="datetime64[ns]"),
              "lat": np.linspace(62, 34, 36), "lon": np.linspace(-12, 35, 48)}
    return _output(("time", "lat", "lon"), coords, (3, 36, 48))


@pytest.fixture
def stereographic() -> xr.Dataset:
    """A polar-stereographic y/x grid over Europe with a CF grid mapping (no lat/lon at all)."""
    import pyproj

    crs = pyproj.CRS.from_proj4("+proj=stere +lat_0=90 +lon_0=10 +k=1 +x_0=0 +y_0=0 +R=6371000 +units=m")
    x, y = np.linspace(-1.5e6, 1.5e6, 40), np.linspace(-4.5e6, -2.5e6, 30)
    ds, _ = _output(("y", "x"), {"y": y, "x": x}, (30, 40), seed=2)
    ds["t2m"].attrs["grid_mapping"] = "crs"
    ds["crs"] = xr.DataArray(np.int32(0), attrs=crs.to_cf())
    return ds


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """Every way out (sockets, urlopen, cartopy's downloader) raises and is recorded, and cartopy's
    data folders are empty: only the shipped shapefiles can draw a coastline."""
    import cartopy
    import cartopy.io as cartopy_io

    attempts: list[str] = []

    def refuse(what: str):
        def blocked(*args, **kwargs):
            attempts.append(what)
            raise OSError(f"network access attempted in a test: {what}")
        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urllib.request.urlopen"))
    monkeypatch.setattr(cartopy_io, "urlopen", refuse("cartopy.io.urlopen"))
    monkeypatch.setattr(cartopy_io.Downloader, "acquire_resource", refuse("Downloader.acquire_resource"))
    monkeypatch.setitem(cartopy.config, "pre_existing_data_dir", str(tmp_path / "empty1"))
    monkeypatch.setitem(cartopy.config, "data_dir", str(tmp_path / "empty2"))
    yield attempts
    assert attempts == [], f"plotting tried to reach the network: {attempts}"


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label().startswith("panel:")]


def _kinds(fig) -> list[str]:
    return [ax.get_label().removeprefix("panel:") for ax in _panels(fig)]


def _mesh(ax):
    """The panel's data layer (under coastlines and markers)."""
    return next(c for c in ax.collections if c.get_label() == "data")


def _rgba(fig) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3] / 255.0


def _coast_pixels(draw, panel: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """``(coastline vertices drawn darker, vertices checked)``: ``draw()`` makes the figure twice,
    with the shipped coastline and with none; at each vertex of the coastline inside the panel,
    the darkest pixel nearby must be darker with the coastline than without it."""
    import cartopy.crs as ccrs

    with_coast = draw()
    ax = _panels(with_coast)[panel]
    lum = _rgba(with_coast).mean(-1)
    with monkeypatch.context() as m:
        m.setattr(natural_earth, "lines", lambda layer, scale, bbox=None: __import__("shapely").MultiLineString())
        lum_plain = _rgba(draw()).mean(-1)
    height = lum.shape[0]
    x0, x1, y0, y1 = ax.get_extent(ccrs.PlateCarree())
    darker = checked = 0
    for geom in natural_earth.geometries("coastline", natural_earth.scale_for(x1 - x0)):
        for lon, lat in np.asarray(geom.coords)[::2]:
            if not (x0 + 1 < lon < x1 - 1 and y0 + 1 < lat < y1 - 1):
                continue
            px, py = ax.transData.transform(ax.projection.transform_point(lon, lat, ccrs.PlateCarree()))
            r, c = int(height - py), int(px)  # display coordinates -> the pixel holding them
            near = (slice(max(r - 2, 0), r + 3), slice(max(c - 2, 0), c + 3))
            checked += 1
            darker += bool(lum[near].min() < lum_plain[near].min() - 0.05)
    return darker, checked


def test_panels_scales_units_and_title(europe, tmp_path):
    ds, truth = europe
    out = plot_infill(ds, "t2m", tmp_path / "sub" / "map.png", time=1, dpi=50)
    assert out.read_bytes()[:4] == PNG
    fig = map_figure(ds, "t2m", time=1)
    assert _kinds(fig) == ["value", "value", "std", "flag"]
    assert [ax.get_title() for ax in _panels(fig)][:2] == ["observed", "predicted mean (observed + infilled)"]
    assert fig.get_suptitle() == "2 m temperature (t2m) at 2019-01-01T06:00 filled by te-pt-tnp"
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert [b.get_xlabel() for b in bars] == ["2 m temperature [K]", "2 m temperature [K]",
                                              "1-sigma of 2 m temperature [K]", "status flag"]
    assert [t.get_text() for t in bars[3].get_xticklabels()] == ["observed", "infilled", "outside"]
    with_truth = map_figure(ds, "t2m", time=1, truth=truth)
    assert _kinds(with_truth) == ["value", "value", "value", "std", "flag", "error"]
    meshes = [_mesh(ax) for ax in _panels(with_truth)]
    assert meshes[0].get_clim() == meshes[1].get_clim() == meshes[2].get_clim()  # one scale for values
    assert meshes[3].get_clim() != meshes[2].get_clim()
    vmin, vmax = meshes[5].get_clim()
    assert vmin == -vmax > -np.inf and "RMSE" in _panels(with_truth)[5].get_title()
    flag = ds["t2m_flag"].isel(time=1).values
    observed = np.ma.getmaskarray(meshes[0].get_array()).reshape(flag.shape)
    assert np.array_equal(~observed, flag == 0)
    error = meshes[5].get_array()
    assert np.ma.count(error) == int((flag == 1).sum())


def test_pictures_are_not_blank_and_show_the_shipped_coastline(europe, monkeypatch):
    """Cartopy's data folders are empty (fixture): the coastline comes from the shipped shapefiles."""
    ds, truth = europe
    fig = map_figure(ds, "t2m", truth=truth)
    img = _rgba(fig)
    for ax in _panels(fig):
        box = ax.get_window_extent()
        h = img.shape[0]
        part = img[int(h - box.y1):int(h - box.y0), int(box.x0):int(box.x1)]
        assert part.var() > 1e-3, f"panel {ax.get_title()!r} is blank"
    darker, checked = _coast_pixels(lambda: map_figure(ds, "t2m", truth=truth), 1, monkeypatch)
    assert checked > 50 and darker / checked > 0.9, (darker, checked)


def test_time_by_date_region_and_projection(europe):
    from cartopy.crs import Robinson

    ds, _ = europe
    fig = map_figure(ds, "t2m", time="2019-01-01T11", region="central_europe", projection_name="robinson")
    assert "2019-01-01T12:00" in fig.get_suptitle()  # the nearest step
    panels = _panels(fig)
    assert isinstance(panels[0].projection, Robinson)
    shape = _mesh(panels[1]).get_array().shape
    lat = ds["lat"].values
    n_lat = int(((lat >= 42) & (lat <= 53)).sum())
    assert shape[0] == n_lat  # cropped to 42-53N on a north-to-south grid
    with pytest.raises(ValueError, match="covers 2019-01-01T00:00 to 2019-01-01T12:00"):
        map_figure(ds, "t2m", time="2020-06-01")
    with pytest.raises(ValueError, match="time index 5"):
        map_figure(ds, "t2m", time=5)
    with pytest.raises(ValueError, match="unknown --projection 'peters'"):
        map_figure(ds, "t2m", projection_name="peters")
    with pytest.raises(ValueError, match="holds no grid cell"):
        map_figure(ds, "t2m", region=(-40, -30, 100, 110))


def test_projected_grid_is_drawn_in_its_own_crs(stereographic, monkeypatch):
    import cartopy.crs as ccrs

    fig = map_figure(stereographic, "t2m")
    ax = _panels(fig)[1]
    assert isinstance(ax.projection, ccrs.Projection) and not isinstance(ax.projection, ccrs.PlateCarree)
    assert "Stereographic" in ax.projection.to_wkt()
    darker, checked = _coast_pixels(lambda: map_figure(stereographic, "t2m"), 1, monkeypatch)
    assert checked > 20 and darker / checked > 0.9, (darker, checked)
    robinson = map_figure(stereographic, "t2m", projection_name="robinson")
    assert isinstance(_panels(robinson)[0].projection, ccrs.Robinson)


def test_modis_sinusoidal_text_crs():
    import cartopy.crs as ccrs

    y, x = np.linspace(-463, -1.1e6, 20), np.linspace(-4.447e6, -3.336e6, 20)
    ds, _ = _output(("y", "x"), {"y": y, "x": x}, (20, 20), attrs={"crs": "MODIS sinusoidal, sphere R=6371007.181"})
    ax = _panels(map_figure(ds, "t2m"))[0]
    assert isinstance(ax.projection, ccrs.Sinusoidal)
    assert ax.projection.globe.semimajor_axis == 6371007.181


def test_point_series(europe):
    ds, truth = europe
    fig = map_figure(ds, "t2m", time=2, point=(50.0, 10.0), truth=truth)
    assert _kinds(fig)[-1] == "series"
    series = _panels(fig)[-1]
    row = int(np.argmin(np.abs(ds["lat"].values - 50.0)))
    col = int(np.argmin(np.abs(ds["lon"].values - 10.0)))
    want = ds["t2m"].values[:, row, col]
    line = series.lines[0].get_ydata()
    np.testing.assert_allclose(np.asarray(line, float), np.where(ds["t2m_flag"].values[:, row, col] == 2, np.nan,
                                                                  want), equal_nan=True)
    assert f"cell row {row}, col {col}" in series.get_title()
    assert all(len(ax.lines) >= 1 for ax in _panels(fig)[:-1])  # the cell is marked on each map
    with pytest.raises(ValueError, match="lies outside the grid"):
        map_figure(ds, "t2m", point=(10.0, 10.0))
    with pytest.raises(ValueError, match="no time axis"):
        map_figure(ds.isel(time=0), "t2m", point=(50.0, 10.0))


def test_missing_layer_and_bad_truth(europe, tmp_path):
    ds, truth = europe
    for missing in ("t2m_std", "t2m_flag"):
        with pytest.raises(ValueError, match=missing):
            plot_infill(ds.drop_vars(missing), "t2m", tmp_path / "x.png")
    with pytest.raises(ValueError, match="truth"):
        map_figure(ds, "t2m", truth=truth.isel(lat=slice(0, 5)))
    assert not (tmp_path / "x.png").exists()


def test_cli_plot(europe, tmp_path, capsys):
    ds, truth = europe
    ds.to_zarr(tmp_path / "out.zarr")
    truth.to_dataset(name="t2m").to_netcdf(tmp_path / "truth.nc")
    png = tmp_path / "map.png"
    assert main(["plot", str(tmp_path / "out.zarr"), "-o", str(png), "--truth", str(tmp_path / "truth.nc"),
                 "--time", "2019-01-01T06", "--region", "40,60,-5,25", "--projection", "robinson",
                 "--point", "50,10", "--dpi", "40"]) == 0
    assert png.read_bytes()[:4] == PNG and capsys.readouterr().out.strip() == f"wrote {png}"
    bad = [(["--var", "sst"], "--var sst: "), (["--point", "50"], "--point '50'"),
           (["--region", "1,2,3"], "--region '1,2,3'"), (["--time", "yesterday"], "--time 'yesterday'")]
    for extra, message in bad:
        assert main(["plot", str(tmp_path / "out.zarr"), "-o", str(tmp_path / "bad.png"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert main(["plot", str(tmp_path / "missing.zarr"), "-o", str(png)]) == 2
    assert "missing.zarr does not exist" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "truth.nc"), "-o", str(png)]) == 2
    assert "not an infill output" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "out.zarr"), "-o", str(tmp_path / "map.jpg")]) == 2
    assert not (tmp_path / "bad.png").exists() and not (tmp_path / "map.jpg").exists()


def test_shipped_natural_earth():
    for layer in natural_earth.LAYERS:
        for scale in natural_earth.SCALES:
            path = natural_earth.shapefile_path(layer, scale)
            assert all(path.with_suffix(s).is_file() for s in (".shp", ".shx", ".dbf", ".prj"))
    coast = natural_earth.geometries("coastline", "110m")
    assert len(coast) > 100
    lon = np.concatenate([np.asarray(g.coords)[:, 0] for g in coast])
    lat = np.concatenate([np.asarray(g.coords)[:, 1] for g in coast])
    assert lon.min() >= -180 and lon.max() <= 180 and lat.min() > -90 and lat.max() < 90
    for g in coast:  # no edge jumps across the antimeridian (it would cross the whole map)
        assert np.abs(np.diff(np.asarray(g.coords)[:, 0])).max(initial=0) < 180
    with pytest.raises(ValueError, match="unknown Natural Earth scale"):
        natural_earth.shapefile_path("coastline", "10m")


def test_natural_earth_conversion(tmp_path, monkeypatch):
    """The converter on a two-country topology: coast = the land rings, border = the shared arc."""
    import cartopy.io.shapereader as shpreader

    from pipelines.release import natural_earth as convert

    topology = {"type": "Topology", "bbox": [-1, -1, 3, 2], "transform": {"scale": [1, 1], "translate": [0, 0]},
                "arcs": [[[1, 0], [0, 1]], [[1, 1], [-1, 0], [0, -1], [1, 0]], [[1, 0], [1, 0], [0, 1], [-1, 0]]],
                "objects": {"countries": {"type": "GeometryCollection", "geometries": [
                    {"type": "Polygon", "arcs": [[0, 1]]}, {"type": "Polygon", "arcs": [[2, ~0]]}]},
                    "land": {"type": "GeometryCollection", "geometries": [{"type": "Polygon", "arcs": [[1, 2]]}]}}}
    arcs = convert.decode_arcs(topology)
    np.testing.assert_array_equal(arcs[0], [[1, 0], [1, 1]])
    assert [a.tolist() for a in convert.borders(topology, arcs)] == [[[1, 0], [1, 1]]]
    coast = convert.coastlines(topology, arcs)
    assert len(coast) == 1 and len(coast[0]) == 7
    monkeypatch.setattr(convert, "shapefile_path", lambda layer, scale: tmp_path / scale / f"{layer}.shp")
    (tmp_path / "pkg").mkdir()
    for scale in ("110m", "50m"):
        (tmp_path / "pkg" / f"countries-{scale}.json").write_text(__import__("json").dumps(topology))
    written = convert.convert(tmp_path / "pkg")
    assert len(written) == 4
    assert len(list(shpreader.Reader(str(tmp_path / "50m" / "borders.shp")).geometries())) == 1
    np.testing.assert_array_equal(convert.split_at_cuts(np.array([[170.0, 0], [179, 1], [-179, 2], [-170, 3]]), -90)[1],
                                  [[-179, 2], [-170, 3]])


def test_import_is_light():
    code = ("import sys, geonp, geonp.maps; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'cartopy', 'torch')]; "
            "assert not heavy, heavy")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60,
                   env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
