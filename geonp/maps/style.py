"""Colours shared by the map panels and the time series."""

OUTSIDE_COLOUR = "lightgrey"
#: Status flag colours and names: 0 observed, 1 infilled, 2 outside the valid area.
FLAG_COLOURS = ("#4c72b0", "#dd8452", OUTSIDE_COLOUR)
FLAG_NAMES = ("observed", "infilled", "outside")
#: Colour maps of the value (observed, truth, mean), sigma and error panels.
CMAPS = {"value": "viridis", "std": "magma", "error": "RdBu_r"}
