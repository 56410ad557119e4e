"""What the prune and transform stages share: the sweep's runs they start from, checked before any work, and the end
of their fine-tuning (``pipeline.sweep.finetune``): manifest, metrics, one line per model, the exit code.

Imported after ``prepare_driver_env`` (it imports the library, which imports Ray).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.config import Params
from pipeline.io import check_store, check_tracking_server, write_stage_metrics
from pipeline.prune.plan import local_sources
from pipeline.sweep.finetune import FineTuneOutcome
from pipeline.sweep.location import adopt_default_store
from pipeline.sweep.manifest import TrialRecord, TuneManifest
from pipeline.sweep.storage import driver_dir, storage_dir
from pipeline.sweep.tracking.store import check_runs_exist
from stages._cli import EXIT_TRACKING_BUFFERED, say_buffered

TUNE_MANIFEST = Path("results/tune/manifest.json")


def checkpoints_here(
    params: Params, root: Path, manifest: TuneManifest, sources: list[TrialRecord]
) -> list[TrialRecord]:
    """The sources with their checkpoints on this disk (``local_sources``), once the tracking store they name
    answers, is the sweep's, and still holds their runs: refused naming the manifest before any expensive work."""
    if not sources:
        return []
    check_tracking_server(manifest.tracking_uri, f"{TUNE_MANIFEST} (tracking_uri)")
    check_store(manifest.tracking_uri, TUNE_MANIFEST)  # missing or corrupt: never a new empty store
    adopt_default_store(manifest.tracking_uri, params.tracking.uri, root)  # a copied or moved project's own
    check_runs_exist(manifest.tracking_uri, [s.run_id for s in sources], TUNE_MANIFEST)
    cache = driver_dir(storage_dir(params, root), root) / "downloaded-checkpoints"
    return local_sources(sources, manifest.tracking_uri, cache, TUNE_MANIFEST)


def finish(
    outcome: FineTuneOutcome,
    out_dir: Path,
    write_manifest: Callable[[Path, Any, Path], None],
    root: Path,
    describe: Callable[[Any], None],
    log: logging.Logger,
) -> int:
    """Write the manifest, ``metrics.json`` and ``test_acc.json`` into ``out_dir``, ``describe`` each model in the
    log; the exit code: 130 when interrupted (nothing written), 1 when a fine-tuning failed,
    ``EXIT_TRACKING_BUFFERED`` while MLflow writes wait for the server, else 0."""
    if outcome.interrupted:
        say_buffered(outcome.tracked)
        return 130
    write_manifest(out_dir / "manifest.json", outcome.manifest, root)
    write_stage_metrics(out_dir, outcome.manifest.metrics_summary())
    for model in outcome.manifest.models:
        describe(model)
    log.info("wrote %s", out_dir / "manifest.json")
    if outcome.failed:
        log.error("some fine-tuning trials failed after their retries; re-run to resume them from their checkpoints")
    if outcome.tracked is not None and say_buffered(outcome.tracked):
        return EXIT_TRACKING_BUFFERED
    return 1 if outcome.failed else 0
