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
import logging
import sys
from pathlib import Path
from typing import Any

from pipeline.config import Params
from pipeline.sweep.location import store_root
from pipeline.sweep.lock import hold_stage_lock
from pipeline.sweep.manifest import read_tune_manifest
from pipeline.sweep.orphans import reap_dead_sessions
from pipeline.sweep.session import prepare_driver_env
from pipeline.transform.manifest import write_transform_manifest
from stages._cli import main_for, make_parser

log = logging.getLogger("stages.transform")
OUT_DIR = Path("results/transform")  # relative to the working directory, like every path in params.yaml


def stage(args: argparse.Namespace, params: Params) -> int:
    root = store_root(Path.cwd())
    if not args.dry_run:  # one transform at a time per project; refused before Ray starts
        hold_stage_lock(root / "results/.transform.lock", "transform")
    prepare_driver_env(params.sweep)  # before Ray is imported: loopback, token auth
    reap_dead_sessions()
    from pipeline.prune.plan import check_fresh
    from pipeline.transform.plan import format_plans, plan_transform, select_sources
    from stages._finetune import TUNE_MANIFEST, checkpoints_here, finish

    manifest = read_tune_manifest(TUNE_MANIFEST, root)
    check_fresh(params, manifest, TUNE_MANIFEST, Path.cwd())
    chosen = select_sources(params, manifest, TUNE_MANIFEST)  # a missing or unfinished source: refused here
    local = checkpoints_here(params, root, manifest, [trial for _, trial in chosen])
    plans = [plan_transform(name, trial) for (name, _), trial in zip(chosen, local, strict=True)]
    from pipeline.transform.run import Transform, run_transform

    if args.dry_run:
        actions = {k: d.words() for k, d in Transform.decisions(params, manifest, plans).items()} if plans else {}
        print(format_plans(plans, params, actions))
        return 0
    from pipeline.data.prepared import load_prepared
    from pipeline.transform.plan import check_exact
    from pipeline.trial.loop import DeviceData

    data = load_prepared(Path(params.data.prepared_dir))
    on_cpu = DeviceData.from_prepared(data, "cpu") if plans else None
    for plan in plans:  # Theorem 1 before any training, on every run: a rebuild that is not exact never trains
        exact = check_exact(plan, on_cpu, params.train.eval_batch_size)
        log.info(
            "%s: %d convolutions as attention; test acc %.4f = its source's %.4f before training; largest logit "
            "difference %.2g (float32), %.2g (float64)",
            plan.key,
            len(plan.model.converted),
            exact["test_acc_step0"],
            exact["source_test_acc"],
            exact["max_logit_diff_float32"],
            exact["max_logit_diff_float64"],
        )
    outcome = run_transform(params, data, root, manifest, plans)
    return finish(outcome, OUT_DIR, write_transform_manifest, root, describe, log)


def describe(model: Any) -> None:
    """One line per converted network in the log: its accuracy before training and after fine-tuning."""
    log.info(
        "%s seed %d: test acc %.4f before training (source %.4f), %s after %d fine-tuning epochs",
        model.name,
        model.seed,
        model.test_acc_step0,
        model.source_test_acc,
        f"{model.test_acc:.4f}" if model.test_acc is not None else "-",
        model.epochs_completed,
    )


parser = make_parser(__doc__)
parser.add_argument(
    "--dry-run", action="store_true", help="print what would be converted and fine-tuned; train nothing"
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
