"""Prune the degenerate attention heads of the trained sweep's models, then fine-tune them (App. A.1 of the paper).

Reads:  params.yaml sections prune (rule, thresholds or fraction, lr_factor, epochs), train, model, variants, sweep;
        results/tune/manifest.json (the tune stage): the finished trials of prune.variants (default: every
        generalized-quadratic variant) and their last checkpoints; data.prepared_dir (for evaluation and fine-tuning).
Writes: results/prune/manifest.json  per pruned model: source and fine-tuning run ids, heads cut per layer and the
                                     per-head decisions (eigenvalues, criteria, why), params and FLOPs before/after
                                     (both conventions), test accuracy before pruning, right after, after fine-tuning
        results/prune/metrics.json   per pruned variant: test accuracy right after pruning and after fine-tuning
        results/prune/test_acc.json  the accuracy after fine-tuning alone: the stage's metrics for `dvc exp show`
Side effects: pruned checkpoints and Ray results under sweep.storage_path/prune-<hash>; MLflow runs (a prune-<hash>
parent in the sweep's experiment, one child per model, metrics from step 0 = right after pruning).
Refused before Ray starts: a missing or stale tune manifest, a checkpoint neither on disk nor in MLflow, a variant
without covariances (learned encoding, ResNet18). --dry-run prints which heads would go, what it saves and whether each
model's fine-tuning reuses a finished run, resumes one or trains; trains nothing.
A pruned model's identity is its source trial's identity plus the prune section: a finished fine-tuning run of it is
reused (sweep.retrain: true trains anew), so a grown sweep prunes and fine-tunes only its new models.
An http tracking server that stops answering mid-run does not stop the fine-tuning: as in the tune stage, MLflow
writes are buffered in <Ray experiment>/mlflow_buffer.jsonl and flushed when it answers again; still down at the end:
the manifest is written, one line says what is buffered where, exit code 75; the next run flushes the buffer first.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.config import Params
from stages._cli import main_for, make_parser
from stages._finetune import finetune_stage


def stage(args: argparse.Namespace, params: Params) -> int:
    return finetune_stage("prune", args, params)  # the recipe: pipeline/finetune/prune.py


parser = make_parser(__doc__)
parser.add_argument(
    "--dry-run", action="store_true", help="print which heads would be cut and what it saves; train nothing"
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
