"""geonp.plot: PNG map figures of an infill output, drawn without any network access."""

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

from geonp import plot

PNG = b"\x89PNG"
ATTRS = {"units": "K", "long_name": "2 m temperature", "standard_name": "air_temperature"}


def _fields(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(value, std, flag, truth)``: a smooth truth, ~40 % infilled cells and a block outside the area."""
    rng = np.random.default_rng(seed)
    ny, nx = shape[-2:]
    truth = 280 + 10 * np.sin(np.linspace(0, 3, ny))[:, None] * np.cos(np.linspace(0, 4, nx))[None, :]
    truth = np.broadcast_to(truth, shape) + rng.normal(0, 0.5, shape)
    flag = np.where(rng.random(shape) < 0.4, 1, 0).astype(np.int8)
    flag[..., : ny // 4, : nx // 3] = 2
    value = np.where(flag == 1, truth + rng.normal(0, 1.0, shape), truth)
    value[flag == 2] = np.nan
    std = np.where(flag == 1, 1.0 + rng.random(shape), 0.0)
    std[flag == 2] = np.nan
    return value.astype(np.float32), std.astype(np.float32), flag, truth.astype(np.float32)


def _output(dims: tuple[str, ...], coords: dict, shape: tuple[int, ...],
            seed: int = 0) -> tuple[xr.Dataset, xr.DataArray]:
    value, std, flag, truth = _fields(shape, seed)
    ds = xr.Dataset(
        {"t2m": (dims, value, ATTRS),
         "t2m_std": (dims, std, {"units": "K", "long_name": "1-sigma predictive standard deviation"}),
         "t2m_flag": (dims, flag, {"flag_values": np.array([0, 1, 2], np.int8)})},
        coords=coords)
    return ds, xr.DataArray(truth, dims=dims, coords=ds.coords)


@pytest.fixture
def latlon() -> tuple[xr.Dataset, xr.DataArray]:
    """A lat/lon output: time 2, lat 20 (ascending), lon 30 in [-180, 180)."""
    coords = {"time": np.array(["2020-01-01T00", "2020-01-01T06"], dtype="datetime64[ns]"),
              "lat": np.linspace(-57, 57, 20), "lon": np.arange(-180, 180, 12.0)}
    return _output(("time", "lat", "lon"), coords, (2, 20, 30))


@pytest.fixture
def projected() -> tuple[xr.Dataset, xr.DataArray]:
    """A projected y/x output (no time) with 2-D lat/lon coordinates."""
    y, x = np.arange(15) * 25e3, np.arange(25) * 25e3
    yy, xx = np.meshgrid(y, x, indexing="ij")
    lat = 45 + yy / 111e3 + 0.05 * xx / 111e3
    lon = 5 + xx / (111e3 * np.cos(np.deg2rad(lat))) - 0.05 * yy / 111e3
    coords = {"y": y, "x": x, "lat": (("y", "x"), lat), "lon": (("y", "x"), lon)}
    return _output(("y", "x"), coords, (15, 25), seed=1)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every way out (sockets, urlopen, cartopy's downloader) raises and is recorded."""
    attempts: list[str] = []

    def refuse(what: str):
        def blocked(*args, **kwargs):
            attempts.append(f"{what}{args[:2]}")
            raise OSError(f"network access attempted in a test: {what}")
        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urllib.request.urlopen"))
    if _has("cartopy"):
        import cartopy.io as cartopy_io

        monkeypatch.setattr(cartopy_io, "urlopen", refuse("cartopy.io.urlopen"))
        monkeypatch.setattr(cartopy_io.Downloader, "_urlopen", refuse("Downloader._urlopen"))
        monkeypatch.setattr(cartopy_io.Downloader, "acquire_resource", refuse("Downloader.acquire_resource"))
    yield attempts
    assert attempts == [], f"plotting tried to reach the network: {attempts}"


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.fixture
def coastline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny stand-in 110m coastline shapefile in a fresh pre-existing data dir."""
    import cartopy
    import shapefile  # pyshp, a dependency of cartopy
    folder = tmp_path / "ne" / "shapefiles" / "natural_earth" / "physical"
    folder.mkdir(parents=True)
    with shapefile.Writer(str(folder / "ne_110m_coastline"), shapeType=shapefile.POLYLINE) as writer:
        writer.field("featurecla", "C", size=20)
        writer.line([[(-170.0, -20.0), (0.0, 30.0), (170.0, 10.0)]])
        writer.record("Coastline")
    monkeypatch.setitem(cartopy.config, "pre_existing_data_dir", tmp_path / "ne")
    monkeypatch.setitem(cartopy.config, "data_dir", tmp_path / "empty")
    return folder / "ne_110m_coastline.shp"


@pytest.fixture
def no_coastline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point cartopy's data dirs at empty folders, whatever this machine holds."""
    if _has("cartopy"):
        import cartopy

        monkeypatch.setitem(cartopy.config, "pre_existing_data_dir", tmp_path / "none1")
        monkeypatch.setitem(cartopy.config, "data_dir", tmp_path / "none2")


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label().startswith("panel:")]


def _colorbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_png_without_truth(latlon, tmp_path, no_coastline):
    ds, _ = latlon
    out = plot.plot_infill(ds, "t2m", tmp_path / "sub" / "map.png")
    assert out == tmp_path / "sub" / "map.png"
    assert out.read_bytes()[:4] == PNG
    fig = plot._figure(ds, "t2m")
    assert [ax.get_label() for ax in _panels(fig)] == ["panel:value", "panel:value", "panel:std"]
    assert len(_colorbars(fig)) == 3
    assert "observed" in _panels(fig)[0].get_title()
    assert all(cb.get_xlabel() in ("2 m temperature [K]", "1-sigma of 2 m temperature [K]") for cb in _colorbars(fig))
    assert _panels(fig)[0].get_xlabel() == "longitude [°E]"


def test_panels_mask_by_flag(latlon, no_coastline):
    ds, _ = latlon
    fig = plot._figure(ds, "t2m", time=1)
    flag = ds["t2m_flag"].isel(time=1).values
    observed, filled, _ = (ax.collections[-1].get_array() for ax in _panels(fig))
    assert np.array_equal(~np.ma.getmaskarray(observed).reshape(flag.shape), flag == 0)
    assert np.array_equal(~np.ma.getmaskarray(filled).reshape(flag.shape), flag != 2)
    observed_mesh, filled_mesh = _panels(fig)[0].collections[-1], _panels(fig)[1].collections[-1]
    assert observed_mesh.get_clim() == filled_mesh.get_clim()
    finite = ds["t2m"].isel(time=1).values
    assert np.allclose(filled_mesh.get_clim(), np.percentile(finite[np.isfinite(finite)], [2, 98]))
    grey = _panels(fig)[2].collections[0].get_array()  # the outside-area layer, under the data
    assert np.array_equal(~np.ma.getmaskarray(grey).reshape(flag.shape), flag == 2)
    assert "2020-01-01T06:00" in fig.get_suptitle()


def test_with_truth_and_hidden(latlon, tmp_path, no_coastline):
    ds, truth = latlon
    hidden = (ds["t2m_flag"] == 1) & (ds["lon"] > 0)
    out = plot.plot_infill(ds, "t2m", tmp_path / "err.png", time=1, truth=truth, hidden=hidden, title="check",
                           dpi=50)
    assert out.read_bytes()[:4] == PNG
    fig = plot._figure(ds, "t2m", time=1, truth=truth, hidden=hidden, title="check")
    panels = _panels(fig)
    assert len(panels) == 4 and len(_colorbars(fig)) == 4 and fig.get_suptitle() == "check"
    error = panels[3].collections[-1].get_array()
    assert np.ma.count(error) == int(hidden.isel(time=1).sum())
    vmin, vmax = panels[3].collections[-1].get_clim()
    assert vmin == -vmax > -np.inf
    assert "RMSE" in panels[3].get_title()


def test_projected_grid(projected, tmp_path, no_coastline):
    ds, truth = projected
    assert plot.plot_infill(ds, "t2m", tmp_path / "proj.png", dpi=50).read_bytes()[:4] == PNG
    out = plot.plot_infill(ds, "t2m", tmp_path / "proj_err.png", truth=truth.transpose("x", "y"), dpi=50)
    assert out.read_bytes()[:4] == PNG
    fig = plot._figure(ds, "t2m", truth=truth)
    assert len(_panels(fig)) == 4
    error = _panels(fig)[3].collections[-1].get_array()
    assert np.ma.count(error) == int((ds["t2m_flag"] == 1).sum())  # hidden defaults to the infilled cells
    assert fig.get_suptitle() == "t2m"


@pytest.mark.parametrize("missing", ["t2m", "t2m_std", "t2m_flag"])
def test_missing_variable_raises(latlon, tmp_path, missing):
    ds, _ = latlon
    with pytest.raises(ValueError, match=missing):
        plot.plot_infill(ds.drop_vars(missing), "t2m", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_bad_time_and_shapes_raise(latlon, tmp_path, no_coastline):
    ds, truth = latlon
    with pytest.raises(ValueError, match="time index 5"):
        plot.plot_infill(ds, "t2m", tmp_path / "x.png", time=5)
    with pytest.raises(ValueError, match="truth"):
        plot.plot_infill(ds, "t2m", tmp_path / "x.png", truth=truth.isel(lat=0))


def test_coastlines_drawn_offline(latlon, projected, coastline, tmp_path, no_network):
    from cartopy.mpl.geoaxes import GeoAxes

    assert plot.coastline_path() == coastline and plot.coastlines_available()
    for name, (ds, truth) in {"latlon": latlon, "projected": projected}.items():
        out = plot.plot_infill(ds, "t2m", tmp_path / f"{name}.png", truth=truth, dpi=50)
        assert out.read_bytes()[:4] == PNG
        panels = _panels(plot._figure(ds, "t2m"))
        assert len(panels) == 3 and all(isinstance(ax, GeoAxes) for ax in panels)
    assert no_network == []
    plain = _panels(plot._figure(latlon[0], "t2m", coastlines=False))
    assert not any(isinstance(ax, GeoAxes) for ax in plain)


def test_no_coastline_means_plain_axes(latlon, no_coastline, monkeypatch):
    assert plot.coastline_path() is None and not plot.coastlines_available()
    fig = plot._figure(latlon[0], "t2m")
    assert all(type(ax).__name__ == "Axes" for ax in _panels(fig))
    monkeypatch.setitem(sys.modules, "cartopy", None)  # cartopy not importable
    assert not plot.coastlines_available()


def test_without_matplotlib(latlon, tmp_path, monkeypatch):
    for name in ("matplotlib.figure", "matplotlib.colors"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ValueError, match="pip install matplotlib"):
        plot.plot_infill(latlon[0], "t2m", tmp_path / "x.png")


def test_import_is_light():
    code = ("import sys, geonp, geonp.plot; "
            "assert not any(m.split('.')[0] in ('matplotlib', 'cartopy') for m in sys.modules), 'heavy import'")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60,
                   env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
