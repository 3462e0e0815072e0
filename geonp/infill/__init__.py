"""Gap filling of gridded cubes: the output store (more arrives with the infill command)."""
