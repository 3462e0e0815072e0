"""A stand-in for the Copernicus Climate Data Store, enough for the real ``cdsapi`` client (0.7.x with
ecmwf-datastores-client) to fetch ERA5 single levels from it, on 127.0.0.1.

Endpoints, under ``{url}`` = ``http://127.0.0.1:PORT/api`` (what the client calls, in order):

- ``GET  {url}/catalogue/v1/messages``                    news shown when a client is made
- ``GET  {url}/retrieve/v1/processes/{dataset}``          the process description
- ``POST {url}/retrieve/v1/processes/{dataset}/execution`` submit ``{"inputs": request}``: 201 + monitor link
- ``GET  {url}/retrieve/v1/jobs/{id}``                    status (always ``successful`` here) + results link
- ``GET  {url}/retrieve/v1/jobs/{id}/results``            the asset: href, ``file:size``, type
- ``HEAD/GET /download/{id}.nc``                          the file (no key, like the CDS's object store)

Every ``retrieve`` call needs the ``PRIVATE-TOKEN`` header to equal :attr:`StandIn.key` (else 401).
Files are built from the request like the current CDS NetCDF output: ``valid_time``, ``latitude``
descending from N, ``longitude`` from W, a scalar ``number`` and an ``expver`` coordinate; a request
mixing instantaneous and accumulated variables gets a zip of one file per kind. Field values come
from :func:`field`, so tests can compute what a store must hold.
"""

from __future__ import annotations

import io
import json
import tempfile
import threading
import uuid
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

G0 = 9.80665
SHORT = {"2m_temperature": "t2m", "total_precipitation": "tp", "geopotential": "z",
         "10m_u_component_of_wind": "u10", "surface_pressure": "sp"}
ACCUMULATED = {"tp"}


def elevation(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Synthetic surface height (m) on (lat, lon)."""
    return 400.0 + 300.0 * np.sin(np.radians(7 * lat))[:, None] * np.cos(np.radians(5 * lon))[None, :]


def field(short: str, times: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """The value served for variable ``short`` on (time, lat, lon), float32."""
    hours = (times - np.datetime64("2000-01-01", "ns")) / np.timedelta64(1, "h")
    t = hours[:, None, None]
    la, lo = lat[None, :, None], lon[None, None, :]
    if short == "z":
        out = G0 * elevation(lat, lon)[None] + 0 * t
    elif short == "tp":
        out = 1e-4 * (1 + np.sin(t / 7.0 + la / 3.0)) + 0 * lo
    else:  # t2m and anything else: a smooth field with a daily cycle and a trend
        out = 273.15 + 20 * np.cos(np.radians(la)) + 0.1 * lo + 3 * np.sin(2 * np.pi * t / 24) + 1e-3 * t / 24
    return out.astype("float32")


def grid(area: list[float], step: float) -> tuple[np.ndarray, np.ndarray]:
    """(lat descending from N, lon ascending from W) as the CDS would interpolate to."""
    n, w, s, e = area
    lat = np.round(np.arange(n, s - step / 2, -step), 6)
    lon = np.round(np.arange(w, e + step / 2, step), 6)
    return lat, lon


def netcdf(request: dict) -> bytes:
    """The file (or zip of files) the CDS would serve for ``request``."""
    days = [pd.Timestamp(f"{request['year'][0]}-{request['month'][0]}-{d}") for d in request["day"]]
    times = np.array([d + pd.Timedelta(hours=int(t[:2])) for d in days for t in request["time"]],
                     dtype="datetime64[ns]")
    lat, lon = grid(request["area"], float(request["grid"][0]))
    groups: dict[str, xr.Dataset] = {}
    for name in request["variable"]:
        short = SHORT[name]
        kind = "accum" if short in ACCUMULATED else "instant"
        ds = groups.setdefault(kind, xr.Dataset(coords={
            "number": 0, "valid_time": ("valid_time", times, {"standard_name": "time", "long_name": "time"}),
            "latitude": ("latitude", lat, {"units": "degrees_north", "standard_name": "latitude"}),
            "longitude": ("longitude", lon, {"units": "degrees_east", "standard_name": "longitude"}),
            "expver": ("valid_time", np.array(["0001"] * len(times)))},
            attrs={"GRIB_centre": "ecmf", "Conventions": "CF-1.7", "institution": "stand-in"}))
        ds[short] = (("valid_time", "latitude", "longitude"), field(short, times, lat, lon),
                     {"units": "K" if short == "t2m" else "m", "long_name": name, "GRIB_paramId": 167})
    encoding = {"valid_time": {"units": "seconds since 1970-01-01", "dtype": "int64"}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for kind, ds in groups.items():
            path = Path(tmp) / f"data_stream-oper_stepType-{kind}.nc"
            ds.to_netcdf(path, engine="netcdf4", encoding=encoding)
            files[path.name] = path.read_bytes()
    if len(files) == 1:
        return next(iter(files.values()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buffer.getvalue()


class StandIn:
    """The server. ``requests``: the bodies of accepted submissions, in order; ``fail``: per
    month (``"YYYY-MM"``, or ``"orography"``) a list of failures still to inflict, each ``"500"``
    (the submission answers HTTP 500) or ``"truncate"`` (the download stops half-way)."""

    def __init__(self, key: str = "standin-token-0123456789") -> None:
        self.key = key
        self.requests: list[dict] = []
        self.submissions = 0
        self.fail: dict[str, list[str]] = {}
        self.jobs: dict[str, tuple[str, bytes, str]] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.root}/api"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def months(self) -> list[str]:
        """The month (or ``orography``) of each accepted submission, in order."""
        return ["orography" if r["variable"] == ["geopotential"] else f"{r['year'][0]}-{r['month'][0]}"
                for r in self.requests]

    def submit(self, request: dict) -> tuple[int, dict]:
        what = "orography" if request["variable"] == ["geopotential"] else f"{request['year'][0]}-{request['month'][0]}"
        with self.lock:
            self.submissions += 1
            pending = self.fail.get(what, [])
            failure = pending.pop(0) if pending else None
        if failure == "500":
            return 500, {"title": "internal error (stand-in)"}
        unknown = [v for v in request["variable"] if v not in SHORT]
        if unknown:
            return 400, {"title": "invalid request", "detail": f"unknown variable {unknown[0]}"}
        job = uuid.uuid4().hex
        with self.lock:
            self.requests.append(request)
            self.jobs[job] = ("truncate" if failure == "truncate" else "", netcdf(request), what)
        return 201, {"jobID": job, "status": "accepted", "type": "process",
                     "links": [{"rel": "monitor", "href": f"{self.url}/retrieve/v1/jobs/{job}"}]}


def _handler(standin: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/catalogue/v1/messages":
                return self._json(200, {"messages": []})
            if path.startswith("/download/"):
                return self._download(path.rsplit("/", 1)[1].removesuffix(".nc"), method == "HEAD")
            if not path.startswith("/api/retrieve/v1/"):
                return self._json(404, {"title": "not found"})
            if self.headers.get("PRIVATE-TOKEN") != standin.key:
                return self._json(401, {"title": "Authentication failed", "detail": "invalid API key"})
            parts = path.removeprefix("/api/retrieve/v1/").split("/")
            if parts[0] == "processes" and len(parts) == 2 and method == "GET":
                return self._json(200, {"id": parts[1], "links": []})
            if parts[0] == "processes" and parts[2:] == ["execution"] and method == "POST":
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                return self._json(*standin.submit(body["inputs"]))
            if parts[0] == "jobs" and parts[1] in standin.jobs:
                job = parts[1]
                if len(parts) == 2:
                    return self._json(200, {"jobID": job, "status": "successful", "processID": "era5",
                                            "metadata": {"log": []}, "links": [
                                                {"rel": "self", "href": f"{standin.url}/retrieve/v1/jobs/{job}"},
                                                {"rel": "results",
                                                 "href": f"{standin.url}/retrieve/v1/jobs/{job}/results"}]})
                if parts[2:] == ["results"]:
                    data = standin.jobs[job][1]
                    return self._json(200, {"asset": {"value": {
                        "type": "application/netcdf", "href": f"{standin.root}/download/{job}.nc",
                        "file:size": len(data)}}})
            return self._json(404, {"title": "not found", "detail": path})

        def _download(self, job: str, head: bool) -> None:
            if job not in standin.jobs:
                return self._json(404, {"title": "no such file"})
            failure, data, _ = standin.jobs[job]
            self.send_response(200)
            self.send_header("Content-Type", "application/x-netcdf")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if head:
                return
            if failure == "truncate":  # a dropped connection: half the promised bytes, then close
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._route("GET")

        def do_HEAD(self) -> None:  # noqa: N802
            self._route("HEAD")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

    return Handler
