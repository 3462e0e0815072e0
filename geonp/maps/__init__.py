"""Maps of infill outputs: Cartopy panels, a cell's time series, offline Natural Earth coastlines.

``map_figure``/``plot_infill`` draw an output in memory; ``plot_file`` is ``geonp plot``.
matplotlib and cartopy load only when a figure is drawn.
"""

from geonp.maps.figure import map_figure, plot_infill
from geonp.maps.files import plot_file

__all__ = ["map_figure", "plot_file", "plot_infill"]
