"""The transform stage's driver: Theorem 1 on a trained network (``python -m stages.transform``).

plan.py (which trained ResNet18 each ``transform`` variant is built from, the refusals, the conversion and its
exactness check), run.py (fine-tuning the converted networks as Tune trials through ``pipeline.sweep.tracked``, as the
prune stage does), manifest.py (``results/transform/manifest.json``: schema, writer, reader; no Ray, no MLflow).
The conversion itself is trial code: ``pipeline.models.transformed_resnet``.
"""
