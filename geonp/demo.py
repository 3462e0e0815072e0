"""``geonp demo``: fill synthetic clouds over a real SST map, offline, in about half a minute on 2 CPU cores.

The field is HadISST sea-surface temperature (August 2012, 1 degree, global) as shipped inside the
cartopy wheel (``cartopy/data/netcdf/HadISST1_SST_update.nc``), so nothing is downloaded. The demo
hides 30% of the ocean under smooth random clouds, fills the clouds with the bundled ``te-pt-tnp``
weights (fine-tuned for a few steps on the scene's own visible cells), and with ``linear``
interpolation and ``kriging`` as references, scores all on the hidden cells, and writes:

* ``<out>/sst_filled.zarr`` — the te-pt-tnp infill (``sst``, ``sst_std``, ``sst_flag`` and two
  coherent samples, ``sst_sample``), CF;
* ``<out>/sst_map.png`` — observed, filled, 1-sigma, error and two sample maps;
* ``<out>/skill.md`` and ``summary.json`` — RMSE, MAE, NLL, CRPS, coverage, interval score, time.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from geonp.fill.options import FitOptions
from geonp.metrics import gaussian_skill
from geonp.tasks.clouds import random_clouds

DEMO_MODELS = ("te-pt-tnp", "linear", "kriging")
CLOUD_COVER = 0.3
#: Coherent samples the demo's store holds and its map draws (``--samples``).
DEMO_SAMPLES = 2
CLOUD_SCALE = 4.0  # cells (degrees): clouds a few hundred km across


def demo_models() -> tuple[str, ...]:
    """``(filler, *references)``: te-pt-tnp with its bundled weights, else kriging; linear (and kriging)."""
    from geonp.fill.predictor import bundled_checkpoint

    return DEMO_MODELS if bundled_checkpoint(DEMO_MODELS[0]) else ("kriging", "linear")


def hadisst_path() -> Path:
    """The HadISST file inside the installed cartopy package (ValueError when cartopy is absent)."""
    try:
        import cartopy
    except ImportError:
        raise ValueError("the demo reads HadISST from the cartopy package: pip install cartopy") from None
    path = Path(cartopy.__file__).parent / "data" / "netcdf" / "HadISST1_SST_update.nc"
    if not path.is_file():
        raise ValueError(f"{path}: not found in this cartopy installation")
    return path


def cloudy_scene(seed: int = 0) -> tuple[xr.Dataset, np.ndarray, xr.DataArray]:
    """HadISST with synthetic clouds: ``(dataset with sst and valid, hidden [1, lat, lon] bool, true sst)``."""
    from geonp.data import open_cube

    # HadISST's time units, "hours since 1-1-1 00:00:0.0", make xarray warn at each decode that it
    # reads the year as 0001, which is right; the warning would only puzzle a first-time user. The
    # units are written padded, so the filled store does not carry them on to the next decode.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Ambiguous reference date string", category=xr.SerializationWarning)
        ds = open_cube(hadisst_path()).compute()
    for var in ds.variables.values():
        if "units" in var.encoding:
            var.encoding["units"] = var.encoding["units"].replace("since 1-1-1 ", "since 0001-01-01 ")
    truth = ds["sst"].values
    sea = np.isfinite(truth[0])
    clouds = random_clouds(sea.shape, CLOUD_COVER, np.random.default_rng(seed), CLOUD_SCALE)
    hidden = (clouds & sea)[None]
    truth = ds["sst"].copy()
    ds["sst"] = ds["sst"].where(~hidden)
    ds["valid"] = (("lat", "lon"), sea)
    return ds, hidden, truth


def run_demo(out: str | Path = "geonp-demo", fit_steps: int = FitOptions().steps, device: str = "auto",
             overwrite: bool = False, verbose: bool = True) -> dict:
    """``geonp demo``: fill synthetic clouds over HadISST SST and score three models there.

    Writes ``sst_filled.zarr`` (the first model's CF output), ``sst_map.png``, ``skill.md`` and
    ``summary.json`` into ``out``.

    Args:
        out: the output folder (created; an existing one is refused unless ``overwrite``).
        fit_steps: fine-tuning steps of te-pt-tnp on the scene's visible cells.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        overwrite: replace an existing ``out``.
        verbose: print progress and the skill table.

    Returns:
        The summary written to ``summary.json``: ``fit_steps``, ``hidden_cells``, ``wall_s`` and
        per model its scores on the hidden cells (degC; see
        :func:`geonp.metrics.gaussian_skill`) with its ``wall_s``.

    Raises:
        ValueError: ``out`` exists without ``overwrite``, or ``fit_steps < 0``.
    """
    from geonp.fill.engine import infill, infill_to_zarr
    from geonp.maps import plot_infill

    out = Path(out)
    if fit_steps < 0:
        raise ValueError(f"--fit-steps must be >= 0, got {fit_steps}")
    from geonp.device import resolve_device

    resolve_device(device)  # a device that is not there fails now, before the folder exists
    if out.exists():
        if not overwrite:
            raise ValueError(f"output folder {out} exists: pass --overwrite or choose another -o")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    say = print if verbose else (lambda *a, **k: None)
    start = time.perf_counter()
    ds, hidden, truth = cloudy_scene()
    say(f"HadISST SST 2012-08, {int(ds.valid.sum())} ocean cells, {int(hidden.sum())} hidden under synthetic "
        f"clouds ({CLOUD_COVER:.0%})")
    models = demo_models()
    if models[0] != DEMO_MODELS[0]:
        say(f"note: no bundled {DEMO_MODELS[0]} weights in this installation (geonp/weights/); the demo fills with "
            f"{models[0]} instead. Train them with `python -m pipelines.release.pretrain`.")
    rows, summary = [], {"fit_steps": fit_steps, "hidden_cells": int(hidden.sum()), "models": {}}
    filled = None
    for name in models:
        t0 = time.perf_counter()
        if name == models[0]:  # the product: a CF Zarr store, as `geonp infill` writes it
            store = infill_to_zarr(ds, out / "sst_filled.zarr", "sst", name, source=str(hadisst_path()),
                                   fit_steps=fit_steps if name == DEMO_MODELS[0] else 0, device=device,
                                   progress=verbose, command="geonp demo", samples=DEMO_SAMPLES)
            result = filled = xr.open_zarr(store).compute()
        else:
            result = infill(ds, "sst", name, device=device)
        wall = time.perf_counter() - t0
        scores = gaussian_skill(truth.values[hidden], result["sst"].values[hidden],
                                result["sst_std"].values[hidden])
        rows.append({"model": name, **scores, "wall_s": round(wall, 1)})
        summary["models"][name] = rows[-1]
    png = plot_infill(filled, "sst", out / "sst_map.png", truth=truth, hidden=xr.DataArray(hidden, dims=truth.dims),
                      title=f"HadISST SST, August 2012: synthetic clouds filled by {models[0]}",
                      samples=DEMO_SAMPLES)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    table = _table(rows)
    (out / "skill.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    say("\nskill on the hidden cells (degC; NLL in nats per cell; lower is better except coverage):")
    say(table)
    say(f"\nwritten: {out}/sst_filled.zarr, {png}, {out}/skill.md, {out}/summary.json ({summary['wall_s']} s)")
    return summary


def _table(rows: list[dict]) -> str:
    cols = [("model", "model", "{}"), ("RMSE", "rmse", "{:.3f}"), ("MAE", "mae", "{:.3f}"), ("NLL", "nll", "{:.3f}"),
            ("CRPS", "crps", "{:.3f}"), ("cov90", "coverage_90", "{:.3f}"), ("cov95", "coverage_95", "{:.3f}"),
            ("wall s", "wall_s", "{}")]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt.format(r[key]) for _, key, fmt in cols) + " |" for r in rows]
    return "\n".join(lines)
