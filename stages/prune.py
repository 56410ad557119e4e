"""Prune the degenerate attention heads of the trained sweep's models, then fine-tune them (App. A.1 of the paper).

Reads:  params.yaml sections prune (rule, thresholds or fraction, lr_factor, epochs), train, model, variants, sweep;
        results/tune/manifest.json (the tune stage): the finished trials of prune.variants (default: every
        generalized-quadratic variant) and their last checkpoints; data.prepared_dir (for evaluation and fine-tuning).
Writes: results/prune/manifest.json  per pruned model: source and fine-tuning run ids, heads cut per layer and the
                                     per-head decisions (eigenvalues, criteria, why), params and FLOPs before/after
                                     (both conventions), test accuracy before pruning, right after, after fine-tuning
        results/prune/metrics.json   those accuracies, params and FLOPs per pruned variant, for `dvc metrics show`
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

from pipeline.config import Params
from pipeline.io import check_store, check_tracking_server, write_json_atomic
from pipeline.prune.manifest import write_prune_manifest
from pipeline.sweep.location import adopt_default_store, store_root
from pipeline.sweep.lock import hold_stage_lock
from pipeline.sweep.manifest import read_tune_manifest
from pipeline.sweep.orphans import reap_dead_sessions
from pipeline.sweep.session import prepare_driver_env
from stages._cli import EXIT_TRACKING_BUFFERED, main_for, make_parser, say_buffered

log = logging.getLogger("stages.prune")
TUNE_MANIFEST = Path("results/tune/manifest.json")
OUT_DIR = Path("results/prune")  # relative to the working directory, like every path in params.yaml


def stage(args: argparse.Namespace, params: Params) -> int:
    root = store_root(Path.cwd())  # where the stores live; the outputs go to the workspace, where DVC collects them
    if not args.dry_run:  # one prune at a time per project; refused before Ray starts
        hold_stage_lock(root / "results/.prune.lock", "prune")
    prepare_driver_env(params.sweep)  # before Ray is imported: loopback, token auth
    reap_dead_sessions()  # the local Rays of drivers that died (SIGKILL) end here: no orphaned agents
    from pipeline.prune.plan import check_fresh, format_plans, local_sources, plan_pruning, select_sources
    from pipeline.sweep.storage import driver_dir, storage_dir
    from pipeline.sweep.tracking.store import check_runs_exist

    manifest = read_tune_manifest(TUNE_MANIFEST, root)  # a DVC dep: in the workspace; its paths name the project
    check_fresh(params, manifest, TUNE_MANIFEST, Path.cwd())
    sources, skipped = select_sources(params, manifest)
    if sources:
        check_tracking_server(manifest.tracking_uri, f"{TUNE_MANIFEST} (tracking_uri)")
        check_store(manifest.tracking_uri, TUNE_MANIFEST)  # missing or corrupt: never a new empty store
        adopt_default_store(manifest.tracking_uri, params.tracking.uri, root)  # a copied or moved project's own
        check_runs_exist(manifest.tracking_uri, [s.run_id for s in sources], TUNE_MANIFEST)
        cache = driver_dir(storage_dir(params, root), root) / "downloaded-checkpoints"
        sources = local_sources(sources, manifest.tracking_uri, cache, TUNE_MANIFEST)
    plans = [plan_pruning(params, source) for source in sources]
    from pipeline.prune.run import Prune, run_prune

    if args.dry_run:
        actions = {key: d.words() for key, d in Prune.decisions(params, manifest, plans).items()} if plans else {}
        print(format_plans(plans, skipped, params, actions))
        return 0
    from pipeline.data.prepared import load_prepared

    data = load_prepared(Path(params.data.prepared_dir))  # a DVC dep: in the workspace (dvc runs stages from its root)
    outcome = run_prune(params, data, root, manifest, plans, skipped)
    if outcome.interrupted:
        say_buffered(outcome.tracked)
        return 130
    write_prune_manifest(OUT_DIR / "manifest.json", outcome.manifest, root)
    write_json_atomic(OUT_DIR / "metrics.json", outcome.manifest.metrics_summary())
    for model in outcome.manifest.models:
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
    log.info("wrote %s", OUT_DIR / "manifest.json")
    if outcome.failed:
        log.error("some fine-tuning trials failed after their retries; re-run to resume them from their checkpoints")
    if outcome.tracked is not None and say_buffered(outcome.tracked):
        return EXIT_TRACKING_BUFFERED
    return 1 if outcome.failed else 0


parser = make_parser(__doc__)
parser.add_argument(
    "--dry-run", action="store_true", help="print which heads would be cut and what it saves; train nothing"
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
