"""Train every model variant x seed of the sweep as a Ray Tune trial, tracked in MLflow.

Reads:  params.yaml sections model, train, variants, sweep, tracking, seed; data.prepared_dir (stages.prepare).
Writes: results/tune/manifest.json  MLflow tracking URI, experiment and parent run ids, and per trial: run id,
                                    variant, seed, status, final metrics, last checkpoint dir, head-centre history
        results/tune/metrics.json   final test accuracy per variant (mean/std over seeds)
        results/tune/test_acc.json  the mean alone, per variant: the sweep's metrics for `dvc metrics show` / `exp show`
Side effects (never DVC outs): MLflow runs (tracking.uri, default sqlite <project>/mlflow.db) and Ray results
(sweep.storage_path/tune-<params hash>: a folder, or a bucket such as s3://bucket/ray). An interrupted run (Ctrl-C)
is restored from there by the next run. The project is the DVC repository ($DVC_ROOT): a queued or --temp `dvc exp
run` keeps its runs in the real project. The manifest's paths inside the project are relative to it.
Trials are found by identity (model, train config with seed, prepared data, trial code) in the MLflow store: a
finished run is reused, an unfinished one continues from its checkpoint, only the rest train (sweep.retrain or
--retrain: train every trial anew). A grown sweep (a seed or a variant more) trains only its new trials.
Ray: attaches to sweep.ray_address or $RAY_ADDRESS when set (token from $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or
~/.ray/auth_token; this checkout shipped as the job's working_dir), else starts a local Ray. --dry-run starts
nothing and prints per trial "reuse run X", "resume run X from epoch k" or "train".
Projects sharing one store (tracking.uri) never train a trial at once: a trial another driver has claimed is waited
for, then reused (pipeline.sweep.tracking.claims; a dead driver's claim is taken over after tracking.claim_timeout_s).
--submit: the same sweep as a Ray job on the cluster (code and prepared data uploaded, the job's log followed here);
its manifest and metrics come back through the tracking server into results/tune, with this checkout's git commit.
Checked first (also by --dry-run): a local machine can hold one trial's sweep.resources, sweep.storage_path can be
written, an http(s) tracking.uri answers; on a cluster, that it answers with this token within seconds and, with
several nodes, that every node shares sweep.storage_path and imports the driver's trial code, and tracking.uri is
not an sqlite file (unless tracking.sqlite_on_cluster).
An http tracking server that stops answering mid-run does not stop the training: MLflow writes are buffered in
<Ray experiment>/mlflow_buffer.jsonl (results/ray-driver/<experiment>/ with a bucket) and flushed when it answers
again (this run waits up to a minute for it at the end). Still down at the end: the manifest is written, one line
says what is buffered where, exit code 75; the next run flushes the buffer before it plans anything. The first write
to a dead server hands over to that buffer within a second: trials train on at full speed.
A full (over-quota, read-only) sweep.storage_path is not retried: the sweep stops, its runs are closed KILLED with
the reason (tune.stop_reason), and one line names the path and what to do, exit 1; a re-run continues the sweep.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pipeline.config import Params
from pipeline.io import HEADLINE_FILE, METRICS_FILE, write_stage_metrics
from pipeline.sweep.location import store_root
from pipeline.sweep.lock import hold_stage_lock
from pipeline.sweep.manifest import ERROR, write_tune_manifest
from pipeline.sweep.orphans import reap_dead_sessions
from pipeline.sweep.session import prepare_driver_env, send_token_if_available
from stages._cli import EXIT_TRACKING_BUFFERED, main_for, make_parser, say_buffered

log = logging.getLogger("stages.tune")
OUT_DIR = Path("results/tune")  # relative to the working directory, like every path in params.yaml
OUTPUTS = ("manifest.json", METRICS_FILE, HEADLINE_FILE)  # the stage's DVC outputs in OUT_DIR


def stage(args: argparse.Namespace, params: Params) -> int:
    root = store_root(Path.cwd())  # where the stores live; the outputs go to the workspace, where DVC collects them
    if not args.dry_run:  # one tune at a time per project; refused before Ray starts
        hold_stage_lock(root / "results/.tune.lock", "tune")
    if args.retrain:
        params = params.model_copy(update={"sweep": params.sweep.model_copy(update={"retrain": True})})
    if args.submit is not None:
        return submitted(args, params)
    prepare_driver_env(params.sweep)  # before Ray is imported: loopback, token auth
    reap_dead_sessions()  # the local Rays of drivers that died (SIGKILL) end here: no orphaned agents
    # These import Ray and MLflow: after params are valid, so --help and bad params stay fast.
    from pipeline.sweep.dry_run import dry_run_text
    from pipeline.sweep.preflight import preflight
    from pipeline.sweep.run import run_sweep, tune_manifest

    if args.dry_run:
        print(dry_run_text(params, root))
        preflight(params, root)  # after the plan, so a problem is the last thing on screen
        return 0
    from pipeline.data.prepared import load_prepared
    from pipeline.sweep.submit import SubmittedJob, publish_outputs

    job = SubmittedJob(args.as_job, args.git_commit or "unknown") if args.as_job else None
    data = load_prepared(Path(params.data.prepared_dir))  # a DVC dep: in the workspace (dvc runs stages from its root)
    outcome = run_sweep(params, data, root, submitted=job)
    if outcome.interrupted:
        say_buffered(outcome)
        return 130
    manifest = tune_manifest(outcome)
    write_tune_manifest(OUT_DIR / "manifest.json", manifest, root)
    write_stage_metrics(OUT_DIR, manifest.metrics_summary())
    if job is not None and not outcome.buffered:  # the workstation downloads them from the parent run (server up)
        publish_outputs(outcome.parent.tracking_uri, outcome.parent.parent_run_id, [OUT_DIR / n for n in OUTPUTS], job)
    log.info(
        "wrote %s (parent run %s, %s; %d trial(s) trained or resumed, %d reused)",
        OUT_DIR / "manifest.json",
        outcome.parent.parent_run_id,
        "restored" if outcome.restored else "new",
        outcome.trained,
        len(manifest.trials) - outcome.trained,
    )
    if outcome.failed:
        failed = [t for t in manifest.trials if t.status == ERROR]
        for trial in (t for t in failed if t.failure_reason):  # a re-run would fail the same way: say what to change
            log.error("%s seed %d failed, not retried: %s", trial.variant, trial.seed, trial.failure_reason)
        if any(not t.failure_reason for t in failed):
            log.error("some trials failed after their retries; re-run to resume them from their checkpoints")
    if say_buffered(outcome):
        return EXIT_TRACKING_BUFFERED
    return 1 if outcome.failed else 0


def submitted(args: argparse.Namespace, params: Params) -> int:
    """--submit: the sweep as a Ray job on the cluster; its manifest and metrics written here when it ends."""
    send_token_if_available()  # before Ray is imported
    from pipeline.sweep.submit import job_address, submit_sweep

    status = submit_sweep(
        params, Path.cwd(), job_address(args.submit), args.params, OUT_DIR, list(OUTPUTS), verbose=args.verbose
    )
    return {"SUCCEEDED": 0, "STOPPED": 130}.get(status, 1)


parser = make_parser(__doc__)
parser.add_argument("--dry-run", action="store_true", help="print the trial grid and where it would run; start nothing")
parser.add_argument(
    "--retrain",
    action="store_true",
    help="train every trial anew, even where a finished run of it exists (as "
    "sweep.retrain: true; `dvc exp run -S sweep.retrain=true` records it in params)",
)
parser.add_argument(
    "--submit",
    nargs="?",
    const="",
    metavar="URL",
    help="run the sweep as a Ray job on the cluster whose dashboard (job server) is at URL, default "
    "$RAY_API_SERVER_ADDRESS; uploads the code and prepared data, follows the job's log and writes its manifest and "
    "metrics here (needs an http(s) tracking.uri, and a sweep.storage_path that is absolute and shared, or a bucket)",
)
parser.add_argument("--as-job", metavar="ID", help=argparse.SUPPRESS)  # set by --submit: the job's submission id
parser.add_argument("--git-commit", help=argparse.SUPPRESS)  # set by --submit: the workstation's commit
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
