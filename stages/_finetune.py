"""What the prune and transform stages share: one stage of the fine-tune family (``pipeline.finetune``), given its
recipe. The sweep's runs it starts from are checked before any work; the end writes the manifest, the metrics, one
line per model and the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from pathlib import Path

from pipeline.config import Params
from pipeline.sweep.location import store_root
from pipeline.sweep.lock import hold_stage_lock
from pipeline.sweep.manifest import read_tune_manifest
from pipeline.sweep.orphans import reap_dead_sessions
from pipeline.sweep.session import prepare_driver_env
from stages._cli import EXIT_TRACKING_BUFFERED, say_buffered

TUNE_MANIFEST = Path("results/tune/manifest.json")


def finetune_stage(recipe_name: str, args: argparse.Namespace, params: Params) -> int:
    """Plan, then (unless ``--dry-run``) fine-tune, then write ``results/<stage>/``: manifest, ``metrics.json`` and
    ``test_acc.json``. Exit code: 130 when interrupted (nothing written), 1 when a fine-tuning failed,
    ``EXIT_TRACKING_BUFFERED`` while MLflow writes wait for the server, else 0."""
    root = store_root(Path.cwd())  # where the stores live; the outputs go to the workspace, where DVC collects them
    if not args.dry_run:  # one such stage at a time per project; refused before Ray starts
        hold_stage_lock(root / f"results/.{recipe_name}.lock", recipe_name)
    prepare_driver_env(params.sweep)  # before Ray is imported: loopback, token auth
    reap_dead_sessions()  # the local Rays of drivers that died (SIGKILL) end here: no orphaned agents
    from pipeline.finetune.plan import check_fresh, checkpoints_here, format_plans, plan_model
    from pipeline.finetune.stage import decisions, run_finetune

    recipe = importlib.import_module(f"pipeline.finetune.{recipe_name}").RECIPE  # after Ray's environment is set
    log = logging.getLogger(f"stages.{recipe_name}")
    manifest = read_tune_manifest(TUNE_MANIFEST, root)  # a DVC dep: in the workspace; its paths name the project
    check_fresh(params, manifest, TUNE_MANIFEST, Path.cwd())
    chosen, skipped = recipe.sources(params, manifest, TUNE_MANIFEST)  # a recipe's refusal: raised here
    local = checkpoints_here(params, root, manifest, [trial for _, trial in chosen], TUNE_MANIFEST)
    plans = [plan_model(recipe, params, name, trial) for (name, _), trial in zip(chosen, local, strict=True)]
    if args.dry_run:
        actions = {key: d.words() for key, d in decisions(recipe, params, manifest, plans).items()} if plans else {}
        print(format_plans(recipe, plans, skipped, params, actions))
        return 0
    from pipeline.data.prepared import load_prepared
    from pipeline.finetune.manifest import write_finetune_manifest
    from pipeline.io import write_stage_metrics

    data = load_prepared(Path(params.data.prepared_dir))  # a DVC dep: in the workspace (dvc runs stages from its root)
    recipe.check(params, plans, data)
    outcome = run_finetune(recipe, params, data, root, manifest, plans, skipped)
    if outcome.interrupted:
        say_buffered(outcome.tracked)
        return 130
    out_dir = Path("results") / recipe_name  # relative to the working directory, like every path in params.yaml
    write_finetune_manifest(out_dir / "manifest.json", outcome.manifest, recipe.entry, root)
    write_stage_metrics(out_dir, outcome.manifest.metrics_summary())
    for model in outcome.manifest.models:
        log.info(recipe.log_line(model))
    log.info("wrote %s", out_dir / "manifest.json")
    if outcome.failed:
        log.error("some fine-tuning trials failed after their retries; re-run to resume them from their checkpoints")
    if outcome.tracked is not None and say_buffered(outcome.tracked):
        return EXIT_TRACKING_BUFFERED
    return 1 if outcome.failed else 0
