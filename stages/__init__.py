"""Thin DVC stage entry points (``python -m stages.<name> --help``): read params, call the library, write outputs.

- ``prepare``    the dataset as tensors (``data/prepared``)
- ``tune``       every variant x seed as a Ray Tune trial, tracked in MLflow (``results/tune``)
- ``prune``      degenerate heads cut and the pruned models fine-tuned (``results/prune``)
- ``transform``  the trained ResNet18 rebuilt as an exactly equal attention network, fine-tuned (``results/transform``)
- ``analyze``    tables, figures and the report from the manifests' runs (``results/``)
- ``describe``   the parameter / FLOP table of the paper's models
- ``submit``     the whole pipeline as one Ray job from a workstation, its outputs and dvc.lock brought back
- ``pipeline``   what that job runs on the cluster's head (``dvc repro``, then its outputs published)
- ``ui``         the MLflow UI's address of the last sweep
- ``band``       the seed band (``params/band.yaml``'s keys) as one ``dvc exp run -S`` experiment
- ``_cli``       what every stage shares: parsing conventions, logging, clean failures and exit codes
- ``_finetune``  one stage of the fine-tune family given its recipe (prune, transform): plan, dry run, run, outputs
- ``_job``       what ``submit`` and ``pipeline`` share: the interpreter DVC starts, the bundle of outputs
"""
