"""The catalogue of model classes by name: what ``@register`` fills and :mod:`geonp.models.registry` reads.

A model module registers its class here (``@register("te-pt-tnp", presets=...)``); the registry,
which builds, saves and loads models by name, imports the model modules. The catalogue sits below
both, so no model module imports the registry that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from geonp.models.base import NeuralProcess

#: Model classes by registered name.
MODELS: dict[str, type[NeuralProcess]] = {}
#: Each name's presets: preset name -> build keyword overrides.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {}


def register(name: str, presets: dict[str, dict[str, Any]] | None = None) -> Callable[[type], type]:
    """Class decorator: make a model buildable as ``build(name, ...)``.

    ``presets`` maps a preset name to keyword overrides; ``"paper"`` is always the
    class defaults (the TE-TNP paper's appendix F sizes).
    """

    def add(cls: type[NeuralProcess]) -> type[NeuralProcess]:
        if name in MODELS:
            raise ValueError(f"model name {name!r} registered twice")
        MODELS[name] = cls
        PRESETS[name] = {"paper": {}, **(presets or {})}
        cls.registry_name = name
        return cls

    return add
