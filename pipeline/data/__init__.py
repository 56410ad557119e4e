"""The dataset: its prepared on-disk format (trial code) and where the images come from (prepare stage only)."""
