"""Coastlines and country borders from Natural Earth, shipped inside the package.

Natural Earth (https://www.naturalearthdata.com) is public domain. Cartopy downloads it on first
use, which fails on machines without internet (compute nodes, this project's CI), so geonp ships
the 1:110m and 1:50m coastline and land-border layers as shapefiles under
``geonp/maps/natural_earth/`` in cartopy's own layout
(``shapefiles/natural_earth/{physical,cultural}/ne_{scale}_{name}.shp``) and reads them directly:
cartopy's downloader is never asked. They were converted from Natural Earth 4.1.0 as packaged in
the ``world-atlas`` 2.0.2 TopoJSON (npm) by ``python -m pipelines.release.natural_earth``: the coastline is
the boundary of the ``land`` polygons, the borders are the arcs that two countries share.

A user may point :data:`cartopy.config` ``["pre_existing_data_dir"]`` at these files too:
:func:`data_dir` gives the folder.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

#: Layers shipped: our name -> (Natural Earth category, Natural Earth name).
LAYERS = {"coastline": ("physical", "coastline"), "borders": ("cultural", "admin_0_boundary_lines_land")}
SCALES = ("110m", "50m")


def data_dir() -> Path:
    """The folder holding ``shapefiles/natural_earth/...`` (usable as cartopy's pre_existing_data_dir)."""
    return Path(__file__).with_name("natural_earth")


def shapefile_path(layer: str, scale: str = "110m") -> Path:
    """The shipped ``.shp`` of ``layer`` ('coastline' or 'borders') at ``scale`` ('110m' or '50m')."""
    if layer not in LAYERS:
        raise ValueError(f"unknown map layer {layer!r}; shipped: {', '.join(LAYERS)}")
    if scale not in SCALES:
        raise ValueError(f"unknown Natural Earth scale {scale!r}; shipped: {', '.join(SCALES)}")
    category, name = LAYERS[layer]
    return data_dir() / "shapefiles" / "natural_earth" / category / f"ne_{scale}_{name}.shp"


@functools.lru_cache(maxsize=8)
def geometries(layer: str, scale: str = "110m") -> tuple[Any, ...]:
    """The shapely line geometries of a shipped layer, in lon/lat degrees (read once, then cached).

    Raises:
        FileNotFoundError: the shapefile is missing from this installation (a broken install).
    """
    from cartopy.io.shapereader import Reader

    path = shapefile_path(layer, scale)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the shipped Natural Earth {layer} ({scale}) is missing; reinstall geonp")
    reader = Reader(str(path))
    try:
        return tuple(reader.geometries())
    finally:
        reader.close()


def lines(layer: str, scale: str, bbox: tuple[float, float, float, float] | None = None) -> Any:
    """The layer as one shapely MultiLineString, clipped to ``bbox = (west, south, east, north)``.

    One geometry, not thousands: cartopy compares CRS objects once per geometry when it draws, and
    with pyproj that comparison can cost milliseconds (seconds per map for the 50m coastline).
    """
    import shapely

    merged = _merged(layer, scale)
    return merged if bbox is None else shapely.clip_by_rect(merged, *bbox)


@functools.lru_cache(maxsize=8)
def _merged(layer: str, scale: str) -> Any:
    import shapely

    return shapely.MultiLineString([g for g in geometries(layer, scale) if not g.is_empty])


def scale_for(extent_degrees: float) -> str:
    """The Natural Earth scale suited to a map ``extent_degrees`` wide: 50m below 40 degrees."""
    return "50m" if extent_degrees < 40 else "110m"
