"""The neural-process model family behind one calling convention.

``dist = model(xc, yc, xt, mask_c=None, mask_t=None)`` -> ``Normal`` with
``loc``/``scale`` ``[B, Nt, Dy]`` (see :mod:`geonp.models.base`).
"""

from geonp.models.base import NeuralProcess
from geonp.models.registry import available, build, load, presets, save

__all__ = ["NeuralProcess", "available", "build", "load", "presets", "save"]
