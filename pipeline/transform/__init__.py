"""The transform stage's driver: Theorem 1 on a trained network (``python -m stages.transform``).

- ``plan``       which trained ResNet18 each ``transform`` variant is built from, the refusals, the conversion and its
                 exactness check, before Ray starts
- ``run``        fine-tuning the converted networks through ``pipeline.sweep.finetune``, as prune does
- ``manifest``   ``results/transform/manifest.json``: schema, writer, reader (no Ray, no MLflow)
"""
