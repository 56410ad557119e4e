"""The prune stage's driver (App. A.1): decided before Ray starts, then run as tracked Tune trials.

- ``plan``       which trained models are pruned, which of their heads go, and what that saves
- ``run``        each planned model evaluated right after pruning, saved, and fine-tuned (``pipeline.sweep.finetune``)
- ``manifest``   the prune manifest the analysis reads: schema, writer, reader (no Ray, no MLflow)
"""
