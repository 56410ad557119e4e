"""Per-trial fixed cost of a finished sweep, read from its MLflow store: where a trial's time goes besides training.

For every trial run (a run with ``epoch_time_s``), from the run's start and end and each epoch's metric timestamp
(the driver logs an epoch's metrics when its report arrives):

- ``start-up``: run created (Tune starts the trial) -> first report, minus the first epoch's training pass and one
  epoch's between-report overhead: the worker's process and imports on a new actor, data, model, the epoch-0
  measurements;
- ``per epoch``: the median time between two reports minus the later epoch's training pass: evaluation, the
  locality measurement, the checkpoint and the report;
- ``end``: last report -> run ended (the model logged and the run closed by the driver's background thread);
- ``fixed``: run duration minus the sum of ``epoch_time_s``, as the issue measured it (all of the above).

Runs are listed in start order; the first ``max_concurrent_trials`` of a sweep start new actors, later ones reuse
an actor (Tune's ``reuse_actors``). Wall times: on a loaded machine they include what other processes take.

    python -m benchmarks.trial_fixed_cost                      # the project's store (sqlite:///mlflow.db)
    python -m benchmarks.trial_fixed_cost --tracking-uri http://127.0.0.1:5000 --parent <run id>
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.common import make_parser, text_table

NUMERIC = {"epochs", "duration s", "epochs s", "fixed s", "start-up s", "per epoch s", "end s"}


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("trial_fixed_cost", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: sqlite:///mlflow.db of the working directory)"
    )
    parser.add_argument("--parent", help="only the trials of this parent run (default: every trial run)")
    return parser


def trial_rows(client: object, parent: str | None) -> list[dict[str, str]]:
    """One row per ended trial run of the store (or of ``parent``), in start order."""
    from pipeline.sweep.tracking.tags import PARENT_TAG

    runs = [
        run
        for experiment in client.search_experiments()
        for run in client.search_runs([experiment.experiment_id], max_results=5000)
        if "epoch_time_s" in run.data.metrics and run.info.end_time
        if parent is None or run.data.tags.get(PARENT_TAG) == parent
    ]
    rows = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        epochs = sorted(client.get_metric_history(run.info.run_id, "epoch_time_s"), key=lambda m: m.step)
        seconds = [m.value for m in epochs]
        reported = [m.timestamp / 1000 for m in epochs]
        start, end = run.info.start_time / 1000, run.info.end_time / 1000
        gaps = [later - earlier - s for earlier, later, s in zip(reported, reported[1:], seconds[1:], strict=False)]
        per_epoch = statistics.median(gaps) if gaps else 0.0
        rows.append(
            {
                "run": run.info.run_name or run.info.run_id,
                "status": run.info.status,
                "epochs": str(len(epochs)),
                "duration s": f"{end - start:.1f}",
                "epochs s": f"{sum(seconds):.1f}",
                "fixed s": f"{end - start - sum(seconds):.1f}",
                "start-up s": f"{reported[0] - start - seconds[0] - per_epoch:.1f}",
                "per epoch s": f"{per_epoch:.2f}",
                "end s": f"{end - reported[-1]:.1f}",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    uri = args.tracking_uri or f"sqlite:///{Path('mlflow.db').resolve()}"
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        parser.error(f"--tracking-uri {uri}: no such sqlite store (run `make repro` first, or name the store)")
    from pipeline.sweep.tracking.store import mlflow_client

    rows = trial_rows(mlflow_client(uri), args.parent)
    if not rows:
        print(f"no ended trial runs in {uri}")
        return 0
    print(f"{uri}: {len(rows)} ended trial run(s), in start order")
    print(text_table(rows, numeric=NUMERIC))
    return 0


if __name__ == "__main__":
    sys.exit(main())
