"""The library: models, data, one trial (worker side), the sweep, pruning and the transform stage (driver side),
measuring."""
