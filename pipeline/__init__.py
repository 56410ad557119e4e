"""The library: models, data, one trial (worker side), the sweep and pruning (driver side), measuring."""
