"""Theorem 1 on the trained ResNet18: rebuild it as an exactly equal attention network, check it, fine-tune it.

Reads:  params.yaml sections transform (variants: name -> the sweep's ResNet18 variant it is built from; epochs,
        lr_factor), train, model, variants, sweep; results/tune/manifest.json (the tune stage): the finished trial of
        each source variant for every seed and its last checkpoint; data.prepared_dir (the exactness check and the
        fine-tuning).
Writes: results/transform/manifest.json  per network (t_resnet18 seed k): source and fine-tuning run ids, the layers
                                         converted, test accuracy of the source and of the rebuild before training,
                                         the largest logit difference (float32, float64), params and FLOPs of both
                                         (both conventions), test accuracy after fine-tuning
        results/transform/metrics.json   per transform variant: test_acc_step0 and test_acc
        results/transform/test_acc.json  test_acc alone: the stage's metrics for `dvc metrics show` / `dvc exp show`
Side effects: converted checkpoints and Ray results under sweep.storage_path/transform-<hash>; MLflow runs (a
transform-<hash> parent in the sweep's experiment, one child per network, test_acc from step 0 = before training).
Every 3x3 convolution becomes a 9-head quadratic attention layer (pipeline/models/transformed_resnet.py); batch norms,
residuals, the 1x1 shortcuts and the classifier are kept. Refused before Ray starts: a missing or stale tune
manifest, a transform variant whose source has no finished trial of a sweep seed (naming the variant), and a rebuild
whose test accuracy before training differs from its source's or whose float64 logits differ by more than 1e-9
(checked on every run, reused fine-tuning or not). --dry-run prints what would be converted and whether each
fine-tuning reuses a finished run, resumes one or trains; trains nothing. A network's identity is its source trial's
identity plus the transform section: a finished fine-tuning of it is reused (sweep.retrain: true trains anew).
"""

from __future__ import annotations

import argparse
import sys

from pipeline.config import Params
from stages._cli import main_for, make_parser
from stages._finetune import finetune_stage


def stage(args: argparse.Namespace, params: Params) -> int:
    return finetune_stage("transform", args, params)  # the recipe: pipeline/finetune/transform.py


parser = make_parser(__doc__)
parser.add_argument(
    "--dry-run", action="store_true", help="print what would be converted and fine-tuned; train nothing"
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
