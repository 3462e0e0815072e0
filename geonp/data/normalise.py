"""Normalisation of fields and input coordinates, fitted on the training region only.

A model sees values ``(y - mean) / std`` per variable and inputs ``(x - offset) / scale``
per input (lat, lon, time, elevation, ...). The statistics are computed lazily (dask) over
the training region, recorded in the model checkpoint's header, and inverted on the way out
so predictions come back in the user's units and coordinates.

Time is the one input whose scale is not its spread over the training data: a record of
several years has a time standard deviation of thousands of hours, which would squeeze a
30-hour window to nothing. Time is measured in hours and divided by ``time_scale_hours``
(default 24, so one unit is one day).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dask
import numpy as np
import torch
import xarray as xr
from torch.distributions import Normal

from geonp.data.calendar import from_hours, hours_since_epoch
from geonp.data.regions import crop_to_region, get_region

SUFFIX = ".normalisation.json"


@dataclass
class Normaliser:
    """Affine maps for values and inputs.

    Attributes:
        values: per variable ``[mean, std]`` in the variable's units.
        inputs: per input ``[offset, scale]``; time in hours since 1970, lat/lon in degrees,
            elevation in metres.
        region: the training region the statistics were computed over (for the record).
    """

    values: dict[str, list[float]] = field(default_factory=dict)
    inputs: dict[str, list[float]] = field(default_factory=dict)
    region: dict[str, list[float]] | None = None

    # -- values -----------------------------------------------------------------------
    def normalise_values(self, name: str, y: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Values of variable ``name`` in its units to model units, ``(y - mean) / std``.

        Args:
            name: the variable (a key of ``values``).
            y: values in the variable's units, any shape.

        Returns:
            The standardised values, same shape and type as ``y``.
        """
        mean, std = self._value(name)
        return (y - mean) / std

    def denormalise_values(self, name: str, y: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """Model units back to variable ``name``'s units, ``y * std + mean``.

        Args:
            name: the variable (a key of ``values``).
            y: standardised values, any shape.

        Returns:
            The values in the variable's units, same shape and type as ``y``.
        """
        mean, std = self._value(name)
        return y * std + mean

    def denormalise_prediction(self, prediction: Normal, variables: list[str]) -> Normal:
        """Map a predictive ``Normal`` back to the variables' units.

        Args:
            prediction: a ``Normal`` over ``[..., Dy]`` in model units, one channel per variable.
            variables: the variables' names in channel order (``len(variables) == Dy``).

        Returns:
            A ``Normal`` of the same shape whose mean and standard deviation are in the
            variables' units.
        """
        stats = torch.tensor([self._value(v) for v in variables], dtype=prediction.mean.dtype,
                             device=prediction.mean.device)
        return Normal(prediction.mean * stats[:, 1] + stats[:, 0], prediction.stddev * stats[:, 1])

    # -- inputs -----------------------------------------------------------------------
    def normalise_input(self, name: str, x: np.ndarray) -> np.ndarray:
        """One input column in the user's units to model units, ``(x - offset) / scale``.

        Args:
            name: the input (``lat``, ``lon``, ``time``, ``elevation``, ...).
            x: its values: degrees, metres, or datetime64 / cftime dates for ``time``.

        Returns:
            float64 array of ``x``'s shape in model units.
        """
        offset, scale = self._input(name)
        raw = hours_since_epoch(x) if name == "time" else np.asarray(x, dtype=np.float64)
        return (raw - offset) / scale

    def denormalise_input(self, name: str, x: np.ndarray, like: np.ndarray | None = None) -> np.ndarray:
        """Model units back to degrees / metres; time back to dates.

        Args:
            name: the input (``lat``, ``lon``, ``time``, ``elevation``, ...).
            x: its values in model units.
            like: for ``time``, values on the calendar to return (the cube's time axis);
                default datetime64[s].

        Returns:
            Array of ``x``'s shape: float64 in the input's units, or dates for ``time``.
        """
        offset, scale = self._input(name)
        raw = np.asarray(x, dtype=np.float64) * scale + offset
        if name == "time":
            return from_hours(raw, like)
        return raw

    # -- files ------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the statistics as JSON.

        Args:
            path: a JSON file, or a ``.safetensors`` checkpoint path: then the file beside it
                (``model.normalisation.json``, see :func:`beside`).

        Returns:
            The path written.
        """
        path = Path(path)
        if path.suffix == ".safetensors":
            path = beside(path)
        path.write_text(json.dumps({"geonp_normalisation": 1, **asdict(self)}, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Normaliser:
        """Read the statistics back.

        Args:
            path: a JSON file written by :meth:`save`, or a checkpoint: the record ``geonp train``
                writes into a cube-trained model's header (older runs: the JSON file beside it).

        Returns:
            The ``Normaliser``.

        Raises:
            ValueError: the file is not a geonp normalisation, or the checkpoint was not
                trained on a cube.
            FileNotFoundError: no normalisation file where one was expected.
        """
        path = Path(path)
        if path.suffix == ".safetensors" and not path.exists() and beside(path).exists():
            path = beside(path)  # a normalisation saved beside a checkpoint that is not written yet
        elif path.suffix == ".safetensors":
            from geonp.checkpoint import read_checkpoint

            record = read_checkpoint(path)[1].get("inputs", {})
            if "normalisation" in record:
                return cls(**record["normalisation"])
            if not beside(path).exists():
                raise ValueError(f"checkpoint {path}: no normalisation (trained on {record.get('kind', 'unrecorded')} "
                                 "inputs, not on a cube)")
            path = beside(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no normalisation file (expected beside the checkpoint)") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a geonp normalisation file ({err})") from None
        if data.pop("geonp_normalisation", None) != 1:
            raise ValueError(f"{path}: not a geonp normalisation file")
        return cls(**data)

    def _value(self, name: str) -> tuple[float, float]:
        if name not in self.values:
            raise ValueError(f"no normalisation for variable {name!r}; known: {', '.join(self.values) or 'none'}")
        mean, std = self.values[name]
        return mean, std

    def _input(self, name: str) -> tuple[float, float]:
        if name not in self.inputs:
            raise ValueError(f"no normalisation for input {name!r}; known: {', '.join(self.inputs) or 'none'}")
        offset, scale = self.inputs[name]
        return offset, scale


def beside(checkpoint: str | Path) -> Path:
    """Where the normalisation of ``checkpoint`` lives: ``model.safetensors`` → ``model.normalisation.json``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name.removesuffix(".safetensors") + SUFFIX)


def fit_normaliser(
    ds: xr.Dataset,
    variables: list[str],
    inputs: list[str],
    region=None,
    time_scale_hours: float = 24.0,
) -> Normaliser:
    """Compute the statistics over the training region (lazily, in one dask pass).

    Args:
        ds: a cube from ``open_cube`` (regular lat/lon grid or projected with 2-D lat/lon).
        variables: fields to normalise (their NaNs are ignored).
        inputs: input names: ``lat``, ``lon``, ``time`` or static variables on the grid
            (``elevation``, ...).
        region: a ``Region`` (or anything ``tasks.region`` accepts); None for the whole cube.
        time_scale_hours: hours per normalised time unit.

    Returns:
        A ``Normaliser``; a constant field or input gets scale 1 instead of 0.
    """
    bounds = None
    if region is not None:
        reg = get_region(region)
        ds = crop_to_region(ds, reg)
        bounds = {"lat": list(reg.lat), "lon": list(reg.lon)}
    lazy = {}
    for v in variables:
        if v not in ds.data_vars:
            raise ValueError(f"unknown variable {v!r}")
        lazy[v] = (ds[v].mean(), ds[v].std())
    for name in inputs:
        if name == "time":
            continue
        if name not in ds.variables:
            raise ValueError(f"unknown input {name!r}: not a coordinate or variable of the cube")
        lazy[name] = (ds[name].mean(), ds[name].std())
    (computed,) = dask.compute(lazy)
    values = {v: _stats(computed[v], v) for v in variables}
    spread = {n: _stats(computed[n], n) for n in inputs if n != "time"}
    if "time" in inputs:
        if "time" not in ds.coords:
            raise ValueError("input 'time' asked for, but the cube has no time axis")
        hours = hours_since_epoch(ds["time"].values)
        spread["time"] = [float(hours.mean()), float(time_scale_hours)]
    return Normaliser(values=values, inputs={n: spread[n] for n in inputs}, region=bounds)


def _stats(pair, name: str) -> list[float]:
    mean, std = float(pair[0]), float(pair[1])
    if not np.isfinite(mean):
        raise ValueError(f"{name!r} has no finite value in the training region")
    return [mean, std if std > 0 and np.isfinite(std) else 1.0]
