"""Release: the recipe for what ships with geonp (the bundled weights, the Natural Earth shapes),
depending on nothing experimental."""
