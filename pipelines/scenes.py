"""The single-scene benchmarks' crops, read from ``pipelines/scenes.yaml`` (their one definition).

Each split maps a scene name to ``(path, variable, open_satellite keywords, crop)``, the crop a
``{dim: slice}`` for ``Dataset.isel``: ``TEST`` (satellite_cv's crops), ``VALIDATION`` (the
accuracy ablation's) and ``MORE_VALIDATION`` (further validation crops, named ``scene@row:col``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

_SPEC = yaml.safe_load((Path(__file__).with_name("scenes.yaml")).read_text())
#: Rows, cols of a further validation crop.
CROP_SIZE: tuple[int, int] = tuple(_SPEC["more_validation"]["size"])
#: Top-left cells of the further validation crops, per product.
MORE_CORNERS: dict[str, list[tuple[int, int]]] = {
    name: [tuple(c) for c in corners] for name, corners in _SPEC["more_validation"]["corners"].items()}


def _split(crops: dict[str, dict[str, list[int]]]) -> dict[str, tuple]:
    out = {}
    for name, crop in crops.items():
        product = _SPEC["products"][name]
        out[name] = (product["path"], product["variable"], dict(product.get("open", {})),
                     {dim: slice(*bounds) for dim, bounds in crop.items()})
    return out


TEST = _split(_SPEC["test"])
VALIDATION = _split(_SPEC["validation"])
MORE_VALIDATION = {
    f"{name}@{r}:{c}": (*VALIDATION[name][:3], {rows: slice(r, r + CROP_SIZE[0]), cols: slice(c, c + CROP_SIZE[1])})
    for name, (rows, cols) in (("modis", ("y", "x")), ("olci", ("lat", "lon")))
    for r, c in MORE_CORNERS[name]
}
#: The wide-clouds benchmark's splits: ``{split: {path, variable, clouds_of, target, donor}}``, the
#: crops as ``{dim: [start, stop]}``.
WIDE_CLOUDS: dict[str, dict] = _SPEC["wide_clouds"]
