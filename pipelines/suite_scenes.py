"""The scene suite's scenes, drawn by the rule in ``pipelines/suite.yaml`` (read it first).

    python -m pipelines.suite_scenes                 # list both splits' scenes
    python -m pipelines.suite_scenes --split test

:func:`draw` turns the rule into :class:`Scene` records (which product, which steps, which crop,
which gap mask), the same on every machine for the same data; :func:`load` turns one into what
``geonp.evaluate`` takes: the cube, its variable and the hide-under mask. The benchmark
(``pipelines.benchmarks.suite``) scores the scenes, ``pipelines.suite_rule`` decides with them.
"""

from __future__ import annotations

import argparse
import functools
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import yaml

from geonp.data.readers import data_folder
from pipelines.products import open_product

SPEC: dict[str, Any] = yaml.safe_load(Path(__file__).with_name("suite.yaml").read_text())
SPLITS = ("validation", "test")
_TRIES = 2000  # draws before a product is declared unable to give a scene (the rule, not a tuning knob)


@dataclass(frozen=True)
class MaskDraw:
    """Where a scene's gap mask comes from: a layer of a product, cropped, its cells blown up ``zoom`` times.

    ``source`` is ``"own"`` (the scene's product, another step at the same crop), ``"donor:I"``
    (the product's I-th donor layer, same crop) or ``"pool:I"`` (the I-th mask product);
    ``step`` its time step, ``corner`` the top-left cell of the source crop (rows, cols).
    """

    source: str
    step: int
    corner: tuple[int, int]
    zoom: int = 1


@dataclass(frozen=True)
class Scene:
    """One scene of the suite: a crop of a product, its steps, and the mask its target is hidden under.

    ``steps`` are the product's time steps in the scene (``[start, stop)``), ``target`` the one
    hidden (an index into the product, inside ``steps``), ``corner`` the crop's top-left cell and
    ``shape`` its (rows, cols).
    """

    name: str
    product: str
    split: str
    kind: str
    variable: str
    steps: tuple[int, int]
    target: int
    corner: tuple[int, int]
    shape: tuple[int, int]
    mask: MaskDraw

    def describe(self) -> str:
        """One line: product, steps, crop and mask."""
        r, c = self.corner
        when = f"step {self.target}" if self.kind == "single" else \
            f"steps {self.steps[0]}-{self.steps[1] - 1}, target {self.target}"
        zoom = f" x{self.mask.zoom}" if self.mask.zoom > 1 else ""
        return (f"{self.variable}, {when}, rows {r}:{r + self.shape[0]}, cols {c}:{c + self.shape[1]}; "
                f"gaps of {mask_label(self.product, self.mask)} step {self.mask.step} at "
                f"{self.mask.corner[0]},{self.mask.corner[1]}{zoom}")


def mask_label(product: str, mask: MaskDraw) -> str:
    """A mask source in words: ``own``, the donor layer's variable, or the pool product's file and variable."""
    kind, _, index = mask.source.partition(":")
    if kind == "own":
        return f"{product} (own)"
    entry = SPEC["products"][product]["donors"][int(index)] if kind == "donor" else SPEC["masks"][int(index)]
    return f"{Path(entry.get('path', SPEC['products'][product].get('path', ''))).name} {entry['variable']}"


# -- opening, once per process ---------------------------------------------------------------

def _product_entry(name: str) -> dict[str, Any]:
    try:
        return SPEC["products"][name]
    except KeyError:
        raise ValueError(f"unknown product {name!r}; pipelines/suite.yaml has {', '.join(SPEC['products'])}") from None


@functools.lru_cache(maxsize=4)
def product(name: str) -> xr.Dataset:
    """The product ``name`` of the suite as :func:`pipelines.products.open_product` gives it."""
    entry = _product_entry(name)
    return open_product(data_folder(), entry["variable"], path=entry.get("path"), opener=entry.get("opener"),
                        satellite=entry.get("satellite", True), open_kwargs=entry.get("open"))


def gap_layers(source: str, owner: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(gaps [S, R, C], valid [R, C])`` of a mask source: True where the source's valid area has no value.

    ``source`` is ``"pool:I"`` or ``"donor:I"`` (of product ``owner``) or ``"own"`` (``owner``)."""
    return _gap_layers(source, "" if source.startswith("pool") else owner)


@functools.lru_cache(maxsize=16)
def _gap_layers(source: str, owner: str) -> tuple[np.ndarray, np.ndarray]:
    kind, _, index = source.partition(":")
    if kind == "own":
        ds, variable = product(owner), _product_entry(owner)["variable"]
    else:
        entry = _product_entry(owner)["donors"][int(index)] if kind == "donor" else SPEC["masks"][int(index)]
        base = _product_entry(owner) if kind == "donor" else {}
        ds = open_product(data_folder(), entry["variable"], path=entry.get("path", base.get("path")),
                          open_kwargs=entry.get("open", base.get("open")))
        variable = entry["variable"]
        if kind == "donor":  # a donor layer lends its clouds, inside the scene product's own valid area
            ds["valid"] = ds["valid"] & product(owner)["valid"].values
    valid = ds["valid"].values.astype(bool)
    return ~np.isfinite(ds[variable].values) & valid, valid


# -- the draw --------------------------------------------------------------------------------

def draw(split: str | None = None) -> list[Scene]:
    """Every scene of ``split`` (None: both), products in ``suite.yaml`` order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")
    return [scene for name, entry in SPEC["products"].items() if split in (None, entry["split"])
            for scene in draw_product(name)]


def draw_product(name: str) -> list[Scene]:
    """The scenes of one product, by the rule (module docstring of ``suite.yaml``)."""
    entry = _product_entry(name)
    rng = np.random.default_rng([SPEC["seed"], zlib.crc32(name.encode())])
    ds = product(name)
    field, valid = ds[entry["variable"]].values, ds["valid"].values.astype(bool)
    n_steps, n_rows, n_cols = field.shape
    rows, cols = _bounds(entry, ds, n_rows, n_cols)
    shape = (min(SPEC["crop"], rows[1] - rows[0]), min(SPEC["crop"], cols[1] - cols[0]))
    scenes = []
    for i, kind in enumerate(entry["kinds"]):
        for _ in range(_TRIES):
            t = int(rng.integers(n_steps))
            r0 = int(rng.integers(rows[0], rows[1] - shape[0] + 1))
            c0 = int(rng.integers(cols[0], cols[1] - shape[1] + 1))
            crop = (slice(r0, r0 + shape[0]), slice(c0, c0 + shape[1]))
            seen = np.isfinite(field[t][crop]) & valid[crop]
            if valid[crop].mean() >= SPEC["min_valid"] and seen.mean() >= SPEC["min_observed"]:
                break
        else:
            raise ValueError(f"{name}: no crop of {shape} is {SPEC['min_valid']:.0%} valid and "
                             f"{SPEC['min_observed']:.0%} observed in {_TRIES} draws")
        steps = _window(t, n_steps, entry.get("history", 1) if kind == "multi" else 1)
        mask = _draw_mask(name, entry, rng, t, (r0, c0), seen)
        scenes.append(Scene(f"{name}#{i}", name, entry["split"], kind, entry["variable"], steps, t, (r0, c0),
                            shape, mask))
    return scenes


def _bounds(entry: dict, ds: xr.Dataset, n_rows: int, n_cols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rows and columns a crop may take: the whole grid, or ``within`` (index ranges by dimension)."""
    within = entry.get("within", {})
    rdim, cdim = ds[entry["variable"]].dims[-2:]
    return tuple(within.get(rdim, (0, n_rows))), tuple(within.get(cdim, (0, n_cols)))


def _window(t: int, n_steps: int, length: int) -> tuple[int, int]:
    """``length`` consecutive steps holding ``t``, centred on it where the stack allows."""
    length = min(length, n_steps)
    start = min(max(0, t - length // 2), n_steps - length)
    return start, start + length


def _draw_mask(name: str, entry: dict, rng: np.random.Generator, t: int, corner: tuple[int, int],
               seen: np.ndarray) -> MaskDraw:
    """A gap mask hiding ``hidden[0]..hidden[1]`` of the target's observed cells ``seen`` [rows, cols]."""
    low, high = SPEC["hidden"]
    shape = seen.shape
    if entry["gaps"] == "own":
        sources = ["own"] + [f"donor:{i}" for i in range(len(entry.get("donors", [])))]
        options = [(s, step) for s in sources for step in range(gap_layers(s, name)[0].shape[0])
                   if not (s == "own" and step == t)]
        for k in rng.permutation(len(options)):
            source, step = options[k]
            under = gap_layers(source, name)[0][step][corner[0]:corner[0] + shape[0], corner[1]:corner[1] + shape[1]]
            if low <= (under & seen).sum() / seen.sum() <= high:
                return MaskDraw(source, step, corner)
    elif entry["gaps"] != "pool":
        raise ValueError(f"{name}: gaps must be 'own' or 'pool', got {entry['gaps']!r}")
    for _ in range(_TRIES):
        source = f"pool:{int(rng.integers(len(SPEC['masks'])))}"
        zoom = int(rng.choice(SPEC["zooms"]))
        gaps, valid = gap_layers(source)
        need = (math.ceil(shape[0] / zoom), math.ceil(shape[1] / zoom))
        if need[0] > gaps.shape[1] or need[1] > gaps.shape[2]:
            continue
        step = int(rng.integers(gaps.shape[0]))
        r, c = int(rng.integers(gaps.shape[1] - need[0] + 1)), int(rng.integers(gaps.shape[2] - need[1] + 1))
        if valid[r:r + need[0], c:c + need[1]].mean() < 0.9:
            continue
        mask = MaskDraw(source, step, (r, c), zoom)
        if low <= (under_mask(mask, shape, name) & seen).sum() / seen.sum() <= high:
            return mask
    raise ValueError(f"{name}: no mask of the pool hides {low:.0%}-{high:.0%} of a scene's observed cells")


def under_mask(mask: MaskDraw, shape: tuple[int, int], owner: str) -> np.ndarray:
    """The gap mask ``[rows, cols]`` a :class:`MaskDraw` gives a scene of ``shape``, True under a gap."""
    gaps = gap_layers(mask.source, owner)[0][mask.step]
    z = mask.zoom
    r, c = mask.corner
    crop = gaps[r:r + math.ceil(shape[0] / z), c:c + math.ceil(shape[1] / z)]
    return np.repeat(np.repeat(crop, z, axis=0), z, axis=1)[: shape[0], : shape[1]]


def load(scene: Scene) -> tuple[xr.Dataset, str, np.ndarray]:
    """``(cube, variable, hide-under mask [T, rows, cols])`` of a scene, for ``geonp.evaluate``.

    The cube holds the scene's steps and crop (``variable`` and ``valid``); the mask is True only
    on the target step, under the drawn gaps."""
    ds = product(scene.product)
    rdim, cdim = ds[scene.variable].dims[-2:]
    (r, c), (nr, nc) = scene.corner, scene.shape
    cube = ds.isel(time=slice(*scene.steps), **{rdim: slice(r, r + nr), cdim: slice(c, c + nc)})
    under = np.zeros(cube[scene.variable].shape, bool)
    under[scene.target - scene.steps[0]] = under_mask(scene.mask, scene.shape, scene.product)
    cube = cube.copy()
    cube.attrs["geonp_source"] = scene.name
    return cube, scene.variable, under


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=SPLITS, default=None)
    args = parser.parse_args()
    for scene in draw(args.split):
        print(f"{scene.split:10} {scene.name:24} {scene.kind:6} {scene.describe()}")


if __name__ == "__main__":
    main()
