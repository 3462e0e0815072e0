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
#: Each name's preset when ``build`` is given none.
DEFAULT_PRESETS: dict[str, str] = {}


def register(name: str, presets: dict[str, dict[str, Any]] | None = None,
             default: str = "paper") -> Callable[[type], type]:
    """Class decorator: make a model buildable as ``build(name, ...)``.

    ``presets`` maps a preset name to keyword overrides; ``"paper"`` is the class defaults (the
    papers' sizes) unless ``presets`` names it. ``default``: the preset ``build`` takes when
    none is named (te-pt-tnp's is the shipped model, ``"shipped"``).
    """

    def add(cls: type[NeuralProcess]) -> type[NeuralProcess]:
        if name in MODELS:
            raise ValueError(f"model name {name!r} registered twice")
        MODELS[name] = cls
        PRESETS[name] = {"paper": {}, **(presets or {})}
        if default not in PRESETS[name]:
            raise ValueError(f"model {name!r}: default preset {default!r} is not one of its presets")
        DEFAULT_PRESETS[name] = default
        cls.registry_name = name
        return cls

    return add
