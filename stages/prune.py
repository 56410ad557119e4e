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
import logging
import sys
from pathlib import Path
from typing import Any

from pipeline.config import Params
from pipeline.prune.manifest import write_prune_manifest
from pipeline.sweep.location import store_root
from pipeline.sweep.lock import hold_stage_lock
from pipeline.sweep.manifest import read_tune_manifest
from pipeline.sweep.orphans import reap_dead_sessions
from pipeline.sweep.session import prepare_driver_env
from stages._cli import main_for, make_parser

log = logging.getLogger("stages.prune")
OUT_DIR = Path("results/prune")  # relative to the working directory, like every path in params.yaml


def stage(args: argparse.Namespace, params: Params) -> int:
    root = store_root(Path.cwd())  # where the stores live; the outputs go to the workspace, where DVC collects them
    if not args.dry_run:  # one prune at a time per project; refused before Ray starts
        hold_stage_lock(root / "results/.prune.lock", "prune")
    prepare_driver_env(params.sweep)  # before Ray is imported: loopback, token auth
    reap_dead_sessions()  # the local Rays of drivers that died (SIGKILL) end here: no orphaned agents
    from pipeline.prune.plan import check_fresh, format_plans, plan_pruning, select_sources
    from stages._finetune import TUNE_MANIFEST, checkpoints_here, finish

    manifest = read_tune_manifest(TUNE_MANIFEST, root)  # a DVC dep: in the workspace; its paths name the project
    check_fresh(params, manifest, TUNE_MANIFEST, Path.cwd())
    sources, skipped = select_sources(params, manifest)
    plans = [plan_pruning(params, source) for source in checkpoints_here(params, root, manifest, sources)]
    from pipeline.prune.run import Prune, run_prune

    if args.dry_run:
        actions = {key: d.words() for key, d in Prune.decisions(params, manifest, plans).items()} if plans else {}
        print(format_plans(plans, skipped, params, actions))
        return 0
    from pipeline.data.prepared import load_prepared

    data = load_prepared(Path(params.data.prepared_dir))  # a DVC dep: in the workspace (dvc runs stages from its root)
    outcome = run_prune(params, data, root, manifest, plans, skipped)
    return finish(outcome, OUT_DIR, write_prune_manifest, root, describe, log)


def describe(model: Any) -> None:
    """One line per pruned model in the log: what was cut, what it saved, what it cost."""
    log.info(
        "%s seed %d: heads cut %s, params %s -> %s, test acc %.4f before, %.4f right after pruning, %s after "
        "%d fine-tuning epochs",
        model.variant,
        model.seed,
        model.pruned_heads,
        f"{model.params_before:,}",
        f"{model.params_after:,}",
        model.acc_before_pruning,
        model.acc_after_pruning,
        f"{model.acc_after_finetune:.4f}" if model.acc_after_finetune is not None else "-",
        model.epochs_completed,
    )


parser = make_parser(__doc__)
parser.add_argument(
    "--dry-run", action="store_true", help="print which heads would be cut and what it saves; train nothing"
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
