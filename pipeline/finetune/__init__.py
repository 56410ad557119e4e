"""The fine-tune family: models built from the sweep's trained trials, then fine-tuned (the prune and transform stages).

- ``recipe``     what a recipe gives: the sources it takes, the model it builds, the rule and its note
- ``prune``      the recipe of App. A.1: degenerate heads cut; ``transform``: Theorem 1's exact rebuild of ResNet18
- ``plan``       the family's plan before Ray starts (sources checked, models built and counted) and its dry run
- ``stage``      the driver: identity and reuse, start weights saved, the tracked Tune run, the manifest's entries
- ``manifest``   ``results/<stage>/manifest.json``: schema, writer, reader (no Ray, no MLflow)
"""
