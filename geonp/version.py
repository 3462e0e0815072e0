"""geonp's version, in a module of its own so that low floors (checkpoint headers) can record it
without importing the package's ``__init__``, which loads the accessor."""

__version__ = "0.1.0"
