"""``ds.geonp``: the command-line tools as methods of an xarray Dataset, for notebooks.

    import xarray as xr, geonp
    ds = xr.open_dataset("scene.nc")
    out = ds.geonp.infill(model="te-pt-tnp")        # = geonp infill scene.nc (in memory)
    out.geonp.plot("sst", time=0)                    # = geonp plot (a Figure; or path= for a PNG)
    ds.geonp.evaluate("sst", ["te-pt-tnp", "kriging"])   # = geonp evaluate, as a dict

Each method is a thin call into the function the CLI uses, after the same coordinate handling
(:func:`geonp.data.cube.to_convention`), so it returns the same arrays. Registered on
``import geonp``; torch, matplotlib and cartopy load only when a method runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import xarray as xr

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@xr.register_dataset_accessor("geonp")
class GeonpAccessor:
    """The ``geonp`` namespace of an ``xarray.Dataset``: ``ds.geonp.infill/evaluate/plot``.

    Args:
        ds: the Dataset (xarray passes it; you write ``ds.geonp``).
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def _cube(self) -> xr.Dataset:
        """The dataset as ``open_cube`` gives a file (every variable kept, as the CLI opens it)."""
        from geonp.data.cube import to_convention

        return to_convention(self._ds, source=str(self._ds.encoding.get("source") or "the dataset"))

    def infill(self, variables: str | list[str] | None = None, model: str = "te-pt-tnp",
               **options: Any) -> xr.Dataset:
        """Fill the gaps, as ``geonp infill`` does, in memory.

        Args:
            variables: the variable or variables to fill; default every gridded field.
            model: a registry name (``geonp models``); default the bundled te-pt-tnp.
            options: checkpoint, valid_mask, elevation, progress, and how to fill: ``options``
                (a :class:`geonp.fill.FillOptions`) or its keywords (fit_steps, default 30 as on
                the command line, window, device, batch_size, seed, nugget, calibrate_sigma,
                threads, samples); see :func:`geonp.fill.engine.infill`.

        Returns:
            ``v``, ``v_std`` (1-sigma, ``v``'s units) and ``v_flag`` (0 observed, 1 infilled,
            2 outside the valid area) per variable, with ``samples=N`` also ``v_sample`` (N
            coherent samples, ``[sample, *v.dims]``), on this dataset's own dimensions and
            coordinates (so ``xr.align(ds, out, join="exact")`` holds).
        """
        from geonp.fill.engine import infill

        return infill(self._cube(), variables, model, like=self._ds, **options)

    def evaluate(self, variable: str, models: str | list[str], **options: Any) -> dict[str, Any]:
        """Hide observed cells and score models there, as ``geonp evaluate``.

        Args:
            variable: the field to evaluate.
            models: a model name or names, all scored on the same hidden cells.
            options: :func:`geonp.evaluate.evaluate`'s keywords (valid_mask, checkpoints,
                fit_steps, seed, ...).

        Returns:
            The result dict of :func:`geonp.evaluate.evaluate`: what was hidden, and a row of
            scores per model (RMSE, CRPS, coverage, by distance to the nearest observation).
        """
        from geonp.evaluate import evaluate

        names = [models] if isinstance(models, str) else list(models)
        return evaluate(self._cube(), variable, names, **options)

    def plot(self, variable: str | None = None, path: str | Path | None = None, **options: Any) -> Figure | Path:
        """Map panels of an infill output, as ``geonp plot``.

        Args:
            variable: the filled variable; default the dataset's only one.
            path: write a PNG there instead of returning a Figure.
            options: time, truth, hidden, region, projection_name, point, title, select (and
                dpi with ``path``); see :func:`geonp.maps.map_figure`.

        Returns:
            A matplotlib ``Figure``, or the PNG's ``Path`` when ``path`` is given.

        Raises:
            ValueError: no variable named while the dataset holds several (or no) filled ones.
        """
        from geonp.maps import map_figure, plot_infill
        from geonp.maps.figure import filled_variables

        if variable is None:
            filled = filled_variables(self._ds)
            if len(filled) != 1:
                raise ValueError(f"name the variable to plot: the dataset holds {len(filled)} filled variables "
                                 f"({', '.join(filled) or 'none'})")
            variable = filled[0]
        if path is not None:
            return plot_infill(self._ds, variable, path, **options)
        return map_figure(self._ds, variable, **options)
