"""The library: models, data, one trial (worker side), the sweep and the fine-tune family (driver side), measuring.

- ``config``     ``params.yaml`` -> typed, validated configuration (errors name the key and the file)
- ``encodings``  the registry of encodings and attention kinds: each one's class, config fields and what it reports
- ``overlay``    a params overlay (``params/band.yaml``) as ``dvc exp run -S`` overrides, checked first
- ``io``         atomic writes, output-location checks, the failures that count as bad input
- ``models/``    the encodings, the attention layer, the SA classifier, ResNet18 (and rebuilt as attention), Theorem 1,
                 the pruning rule
- ``data/``      the prepared format trials load, and where the images come from
- ``trial/``     everything a Ray worker runs: the training loop, checkpoints, locality, the Tune trainable
- ``sweep/``     the driver: the sweep, the tracked-run sequence tune, prune and transform share, MLflow behind
                 ``tracking/``
- ``finetune/``  the prune and transform stages: one driver, plan, dry run and manifest; each stage a recipe (the
                 model built from a trained source, the rule and its note)
- ``measure/``   parameter and FLOP counts, speed against the hardware, the paper's reference figures
"""
