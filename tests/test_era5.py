"""``geonp fetch era5`` against a stand-in CDS on 127.0.0.1, through the real cdsapi client.

The stand-in (tests/cds_standin.py) serves the endpoints cdsapi 0.7 calls and generates the
NetCDF files from each request, so a store can be checked value by value; it also counts
submissions and fails on demand, which is how interruption, resume and retries are tested.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from geonp.cli import main
from geonp.data import zarr_store
from geonp.data.cube import open_cube
from geonp.data.era5 import G0, FetchError, era5_requests, fetch_era5

sys.path.insert(0, str(Path(__file__).parent))
from cds_standin import StandIn, elevation, field  # noqa: E402

AREA, GRID, HOURS = "50/-2/46/3", 1.0, "0,12"
LAT, LON = np.arange(46.0, 50.5, 1.0), np.arange(-2.0, 3.5, 1.0)


@pytest.fixture
def cds(monkeypatch, tmp_path):
    """A running stand-in whose URL and key are in the environment; HOME is empty."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CDSAPI_RC", raising=False)
    for var in ("no_proxy", "NO_PROXY"):  # a proxy set for the package index must not catch 127.0.0.1
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    with StandIn() as server:
        monkeypatch.setenv("CDSAPI_URL", server.url)
        monkeypatch.setenv("CDSAPI_KEY", server.key)
        yield server


def fetch(out: Path, start: str = "2019-01-30", end: str = "2019-02-02", **kw) -> Path:
    kw = {"retries": 0, "backoff": 0.0, "verbose": False, **kw}
    return fetch_era5(kw.pop("variables", ["2m_temperature"]), start, end, AREA, GRID, HOURS, out, **kw)


def expected_times(start: str, end: str) -> np.ndarray:
    days = np.arange(np.datetime64(start), np.datetime64(end) + 1)
    return np.array([d + np.timedelta64(h, "h") for d in days for h in (0, 12)], dtype="datetime64[ns]")


def assert_same_store(a: Path, b: Path) -> None:
    da, db = xr.open_zarr(a), xr.open_zarr(b)
    xr.testing.assert_identical(da.load(), db.load())
    assert da.attrs["geonp_months"] == db.attrs["geonp_months"]


def test_requests_one_per_month_days_clipped():
    reqs = era5_requests(["2m_temperature", "total_precipitation"], "2020-01-30", "2020-03-02",
                         "60/-10.5/35/30", 0.5, "18,0,6,6")
    assert len(reqs) == 3
    assert set(reqs[0]) == {"product_type", "variable", "year", "month", "day", "time", "area", "grid",
                            "data_format", "download_format"}
    assert [(r["year"], r["month"]) for r in reqs] == [(["2020"], ["01"]), (["2020"], ["02"]), (["2020"], ["03"])]
    assert reqs[0]["day"] == ["30", "31"] and reqs[2]["day"] == ["01", "02"]
    assert reqs[1]["day"] == [f"{d:02d}" for d in range(1, 30)]  # 2020 is a leap year
    for r in reqs:
        assert r["product_type"] == ["reanalysis"] and r["variable"] == ["2m_temperature", "total_precipitation"]
        assert r["time"] == ["00:00", "06:00", "18:00"] and r["area"] == [60.0, -10.5, 35.0, 30.0]
        assert r["grid"] == [0.5, 0.5] and r["data_format"] == "netcdf" and r["download_format"] == "unarchived"
    assert len(era5_requests("2m_temperature", "2019-12-31", "2020-01-01", AREA)[1]["time"]) == 24


@pytest.mark.parametrize("change, argument", [
    ({"start": "2019-13-01"}, "--start"), ({"start": "1939-12-31"}, "--start"),
    ({"end": "2018-12-31"}, "--end"), ({"end": "2999-01-01"}, "--end"),
    ({"area": "35/-10/60/30"}, "--area"), ({"area": "60/-10/35"}, "--area"), ({"area": "60/30/35/-10"}, "--area"),
    ({"grid": 0}, "--grid"), ({"grid": -0.25}, "--grid"), ({"grid": "x"}, "--grid"),
    ({"hours": "0,24"}, "--hours"), ({"hours": "noon"}, "--hours"), ({"hours": ""}, "--hours"),
    ({"variables": []}, "--variable"),
])
def test_bad_arguments_name_the_argument(change, argument, tmp_path):
    args = {"variables": ["2m_temperature"], "start": "2019-01-01", "end": "2019-01-31", "area": AREA,
            "grid": GRID, "hours": HOURS, **change}
    with pytest.raises(ValueError, match=argument):
        era5_requests(**args)
    with pytest.raises(ValueError, match=argument):
        fetch_era5(**args, out=tmp_path / "o.zarr", verbose=False)
    assert not (tmp_path / "o.zarr").exists()


def test_fetch_two_months_with_orography(cds, tmp_path, monkeypatch):
    out = fetch(tmp_path / "era5.zarr", orography=True)
    assert cds.months() == ["orography", "2019-01", "2019-02"]
    assert cds.requests[1:] == era5_requests(["2m_temperature"], "2019-01-30", "2019-02-02", AREA, GRID, HOURS)
    ds = open_cube(out)
    times = expected_times("2019-01-30", "2019-02-02")
    np.testing.assert_array_equal(ds["time"].values, times)
    np.testing.assert_array_equal(ds["lat"].values, LAT)  # ascending, although the CDS serves N to S
    np.testing.assert_array_equal(ds["lon"].values, LON)
    assert ds["t2m"].dims == ("time", "lat", "lon") and ds["t2m"].dtype == np.float32
    np.testing.assert_array_equal(ds["t2m"].values, field("t2m", times, LAT, LON))
    np.testing.assert_allclose(ds["elevation"].values, elevation(LAT, LON), rtol=1e-6)
    assert ds["elevation"].attrs["units"] == "m" and ds["elevation"].attrs["standard_name"] == "surface_altitude"
    assert "expver" not in ds.variables and "number" not in ds.variables
    # Zarr v3, consolidated, one day per time chunk; nothing left behind but the store.
    assert (out / "zarr.json").is_file() and "consolidated_metadata" in json.loads((out / "zarr.json").read_text())
    assert xr.open_zarr(out, consolidated=True)["t2m"].encoding["chunks"] == (2, 5, 6)
    assert [p.name for p in tmp_path.iterdir()] == ["era5.zarr"]
    attrs = xr.open_zarr(out).attrs
    assert attrs["geonp_months"] == {"2019-01": ["2019-01-30", "2019-01-31"], "2019-02": ["2019-02-01", "2019-02-02"]}
    assert cds.key not in json.dumps(attrs) and cds.url not in json.dumps(attrs)
    # Nothing missing: no request, and no credentials needed.
    monkeypatch.delenv("CDSAPI_KEY")
    fetch(out, orography=True)
    assert len(cds.requests) == 3


def test_interrupted_fetch_resumes_with_only_the_missing_month(cds, tmp_path):
    reference = fetch(tmp_path / "reference.zarr")
    cds.requests.clear()
    cds.fail["2019-02"] = ["500"] * 10
    out = tmp_path / "era5.zarr"
    with pytest.raises(FetchError, match=r"2019-02.*failed after 3 attempts.*run the same command again"):
        fetch(out, retries=2, backoff=0.001)
    assert cds.months() == ["2019-01"] and cds.submissions == 2 + 1 + 3  # reference, January, February x 3
    assert xr.open_zarr(out).attrs["geonp_months"] == {"2019-01": ["2019-01-30", "2019-01-31"]}
    assert xr.open_zarr(out).sizes["time"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["era5.zarr", "reference.zarr"]  # no temporary files
    cds.fail.clear()
    cds.requests.clear()
    fetch(out)
    assert cds.months() == ["2019-02"]
    assert_same_store(out, reference)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_kill_between_append_and_record_is_undone(cds, tmp_path, zarr_format):
    reference = fetch(tmp_path / "reference.zarr", zarr_format=zarr_format)
    out = fetch(tmp_path / "era5.zarr", zarr_format=zarr_format)
    assert (out / ("zarr.json" if zarr_format == 3 else ".zgroup")).is_file()
    # As if killed after February's append but before its record: the record lags the data.
    zarr_store.update_attrs(out, {"geonp_months": {"2019-01": ["2019-01-30", "2019-01-31"]}})
    cds.requests.clear()
    fetch(out, zarr_format=zarr_format)
    assert cds.months() == ["2019-02"]
    assert_same_store(out, reference)


def test_kill_before_the_first_month_is_recorded(cds, tmp_path):
    reference = fetch(tmp_path / "reference.zarr", orography=True)
    out = fetch(tmp_path / "era5.zarr", orography=True)
    zarr_store.update_attrs(out, {"geonp_months": {}})  # only the orography was recorded
    cds.requests.clear()
    fetch(out, orography=True)
    assert cds.months() == ["2019-01", "2019-02"]
    assert_same_store(out, reference)
    zarr_store.update_attrs(out, {"geonp_months": {}, "geonp_orography": False})  # nothing recorded: start afresh
    cds.requests.clear()
    fetch(out, orography=True)
    assert cds.months() == ["orography", "2019-01", "2019-02"]
    assert_same_store(out, reference)


def test_transient_failure_is_retried_after_a_back_off(cds, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)  # whatever the client logs, even at debug level, must not hold the key
    cds.fail["2019-01"] = ["truncate"]
    cds.fail["2019-02"] = ["500"]
    out = fetch(tmp_path / "era5.zarr", retries=1, backoff=0.001, verbose=True)
    assert cds.months() == ["2019-01", "2019-01", "2019-02"] and cds.submissions == 4
    err = capsys.readouterr().err
    assert err.count("retrying in 0.001 s") == 2 and "CDS: status has been updated to successful" in err
    assert cds.key not in err and cds.key not in caplog.text
    np.testing.assert_array_equal(open_cube(out)["time"].values, expected_times("2019-01-30", "2019-02-02"))


def test_store_grows_forward_and_refuses_other_fetches(cds, tmp_path):
    out = fetch(tmp_path / "era5.zarr", end="2019-01-31")
    cds.requests.clear()
    fetch(out, start="2019-01-30", end="2019-02-03")
    assert [r["day"] for r in cds.requests] == [["01", "02", "03"]]
    np.testing.assert_array_equal(open_cube(out)["time"].values, expected_times("2019-01-30", "2019-02-03"))
    with pytest.raises(ValueError, match="--start"):
        fetch(out, start="2019-01-29")
    with pytest.raises(ValueError, match="--start"):
        fetch(out, start="2019-02-05", end="2019-02-06")  # would leave a gap
    with pytest.raises(ValueError, match=r"area: stored .*--overwrite"):
        fetch_era5(["2m_temperature"], "2019-01-30", "2019-01-31", "51/-2/46/3", GRID, HOURS, out, verbose=False)
    with pytest.raises(ValueError, match="variables"):
        fetch(out, variables=["total_precipitation"])
    (tmp_path / "notes").mkdir()
    with pytest.raises(ValueError, match="not a Zarr store"):
        fetch(tmp_path / "notes", overwrite=True)
    cds.requests.clear()
    fetch(out, variables=["2m_temperature", "total_precipitation"], end="2019-01-31", overwrite=True)
    assert len(cds.requests) == 1  # one zip with an instantaneous and an accumulated file
    ds = open_cube(out)
    assert sorted(ds.data_vars) == ["t2m", "tp"] and ds.sizes["time"] == 4
    np.testing.assert_array_equal(ds["tp"].values, field("tp", expected_times("2019-01-30", "2019-01-31"), LAT, LON))


def test_credentials_from_the_rc_file_and_a_wrong_key(cds, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cdsapirc").write_text(f"url: {cds.url}\nkey: {cds.key}\n")
    monkeypatch.delenv("CDSAPI_URL")
    monkeypatch.delenv("CDSAPI_KEY")
    fetch(tmp_path / "a.zarr", end="2019-01-30")
    assert len(cds.requests) == 1
    monkeypatch.setenv("CDSAPI_KEY", "not-the-key-42")  # the environment wins over the file
    refused = r"refused the request for ERA5 2019-01 \(day 30\) \(HTTP 401: check the API key\)"
    with pytest.raises(ValueError, match=refused) as err:
        fetch(tmp_path / "b.zarr", end="2019-01-30", retries=3, backoff=10.0)
    assert "not-the-key-42" not in str(err.value) and cds.submissions == 1  # not retried
    assert not (tmp_path / "b.zarr").exists()


def test_missing_credentials_give_one_line_with_instructions(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("CDSAPI_URL", "CDSAPI_KEY", "CDSAPI_RC"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match=r"no CDS API url and key found: set CDSAPI_URL and CDSAPI_KEY.*\.cdsapirc"):
        fetch(tmp_path / "o.zarr")
    args = ["fetch", "era5", "--variable", "2m_temperature", "--start", "2019-01-01", "--end", "2019-01-02",
            "--area", AREA, "-o", str(tmp_path / "o.zarr")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("geonp: error: no CDS API") and err.count("\n") == 1 and "Traceback" not in err
    monkeypatch.setenv("CDSAPI_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("CDSAPI_KEY", "12345:abcdef-secret")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "legacy 'UID:KEY' form" in err and "abcdef-secret" not in err and err.count("\n") == 1
    assert main([*args[:-4], "--area", "1/2/3", "-o", str(tmp_path / "o.zarr")]) == 2
    assert "--area" in capsys.readouterr().err
    assert main(["fetch"]) == 2 and "geonp fetch era5" in capsys.readouterr().err
    assert not (tmp_path / "o.zarr").exists()


def test_cli_fetch(cds, tmp_path, capsys):
    out = tmp_path / "era5.zarr"
    args = ["fetch", "era5", "--variable", "2m_temperature", "--start", "2019-01-31", "--end", "2019-02-01",
            "--area", AREA, "--grid", "1", "--hours", HOURS, "--orography", "-o", str(out), "--retries", "0"]
    cds.fail["2019-02"] = ["500"]
    assert main(args) == 1  # a download failure: exit 1, one line, how to resume
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("geonp: error: ERA5 2019-02") and "resume" in err
    assert cds.key not in err
    assert main([*args, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"ERA5 store ready: {out}" and captured.err == ""
    assert cds.months() == ["orography", "2019-01", "2019-02"]
    assert sorted(open_cube(out).data_vars) == ["elevation", "t2m"]
    np.testing.assert_allclose(open_cube(out)["elevation"].values * G0, G0 * elevation(LAT, LON), rtol=1e-6)
