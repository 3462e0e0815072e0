"""Convert Natural Earth from the ``world-atlas`` TopoJSON into the shapefiles geonp ships.

    npm pack world-atlas@2.0.2 && tar xzf world-atlas-2.0.2.tgz
    python -m pipelines.release.natural_earth package/      # writes geonp/maps/natural_earth/...

``world-atlas`` 2.0.2 packages Natural Earth 4.1.0 (public domain) as quantised TopoJSON, one file
per scale holding the ``countries`` and ``land`` collections on one shared set of arcs. The
coastline layer is every ring of the ``land`` polygons; the land-border layer is every arc that
two different countries share. Both are written as POLYLINE shapefiles with a ``.prj`` (WGS 84),
in cartopy's folder layout, so cartopy (or any GIS) reads them as the Natural Earth layers.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import shapefile  # pyshp, a dependency of cartopy

from geonp.maps.natural_earth import SCALES, shapefile_path

WGS84_PRJ = ('GEOGCS["GCS_WGS_1984",DATUM["D_WGS_1984",SPHEROID["WGS_1984",6378137.0,298.257223563]],'
             'PRIMEM["Greenwich",0.0],UNIT["Degree",0.0174532925199433]]')


def decode_arcs(topology: dict) -> list[np.ndarray]:
    """The topology's arcs as ``[n, 2]`` lon/lat arrays (undo the delta coding and quantisation)."""
    (sx, sy), (tx, ty) = topology["transform"]["scale"], topology["transform"]["translate"]
    out = []
    for arc in topology["arcs"]:
        q = np.cumsum(np.asarray(arc, dtype=np.float64), axis=0)
        out.append(np.column_stack([q[:, 0] * sx + tx, q[:, 1] * sy + ty]))
    return out


def polygons(geometry: dict) -> list[list[list[int]]]:
    """A Polygon or MultiPolygon geometry as a list of polygons, each a list of rings of arc refs."""
    if geometry["type"] == "Polygon":
        return [geometry["arcs"]]
    if geometry["type"] == "MultiPolygon":
        return geometry["arcs"]
    return []


def ring(arcs: list[np.ndarray], refs: list[int]) -> np.ndarray:
    """The closed ring ``[n, 2]`` joining arcs ``refs`` (``~i`` is arc ``i`` reversed)."""
    parts = [arcs[i] if i >= 0 else arcs[~i][::-1] for i in refs]
    return np.concatenate([parts[0]] + [p[1:] for p in parts[1:]])  # consecutive arcs share an end point


def coastlines(topology: dict, arcs: list[np.ndarray]) -> list[np.ndarray]:
    """Every ring of the ``land`` polygons, less the edges that are not coast: the cuts along the
    antimeridian (Chukotka, Fiji) and Antarctica's closing edge along the data's southern limit."""
    south = topology["bbox"][1]
    return [line for g in topology["objects"]["land"]["geometries"] for poly in polygons(g) for r in poly
            for line in split_at_cuts(ring(arcs, r), south)]


def split_at_cuts(line: np.ndarray, south: float, tol: float = 1e-6) -> list[np.ndarray]:
    """``line`` broken where an edge runs along lon = +-180 or along latitude ``south``, or crosses
    the antimeridian (world-atlas stitches Fiji and Chukotka across it: drawn in lon/lat, such an
    edge would run the width of the map)."""
    lon, lat = line[:, 0], line[:, 1]
    on_meridian = (np.abs(lon) >= 180 - tol)
    cut = (on_meridian[:-1] & on_meridian[1:] & (np.sign(lon[:-1]) == np.sign(lon[1:]))) | (
        (lat[:-1] <= south + tol) & (lat[1:] <= south + tol)) | (np.abs(np.diff(lon)) > 180)
    pieces, start = [], 0
    for edge in np.flatnonzero(cut):
        pieces.append(line[start:edge + 1])
        start = edge + 1
    pieces.append(line[start:])
    if len(pieces) > 1 and np.array_equal(line[0], line[-1]):  # a ring: its last piece runs on into the first
        pieces = [np.concatenate([pieces[-1], pieces[0][1:]])] + pieces[1:-1]
    return [p for p in pieces if len(p) >= 2]


def borders(topology: dict, arcs: list[np.ndarray]) -> list[np.ndarray]:
    """Every arc used by two different countries (arcs on one country only are coast)."""
    users: Counter[int] = Counter()
    for g in topology["objects"]["countries"]["geometries"]:
        users.update({i if i >= 0 else ~i for poly in polygons(g) for r in poly for i in r})
    return [piece for i, n in sorted(users.items()) if n >= 2
            for piece in split_at_cuts(arcs[i], topology["bbox"][1])]


def write_lines(path: Path, lines: list[np.ndarray], feature: str) -> None:
    """A POLYLINE shapefile (``.shp/.shx/.dbf/.prj``) with one record per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with shapefile.Writer(str(path.with_suffix("")), shapeType=shapefile.POLYLINE) as writer:
        writer.field("featurecla", "C", size=40)
        for line in lines:
            writer.line([np.round(line, 6).tolist()])
            writer.record(feature)
    path.with_suffix(".prj").write_text(WGS84_PRJ)


def convert(package: Path) -> list[Path]:
    """Write the coastline and border shapefiles of every shipped scale from ``package``'s TopoJSON."""
    written = []
    for scale in SCALES:
        topology = json.loads((package / f"countries-{scale}.json").read_text())
        arcs = decode_arcs(topology)
        for layer, lines, feature in (("coastline", coastlines(topology, arcs), "Coastline"),
                                      ("borders", borders(topology, arcs), "International boundary (verify)")):
            path = shapefile_path(layer, scale)
            write_lines(path, lines, feature)
            written.append(path)
            print(f"{path}: {len(lines)} lines, {sum(len(c) for c in lines)} points")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="the unpacked world-atlas npm package (holds countries-110m.json)")
    convert(parser.parse_args().package)


if __name__ == "__main__":
    main()
