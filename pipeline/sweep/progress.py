"""What Ray Tune prints while a sweep runs: one compact table with the columns a reader looks for, refreshed slowly.

Ray 2.60's default output engine ignores a ``RunConfig.progress_reporter``: it prints a table of *every* reported
value after each trial's reports and keeps only the first few metrics (not the objective) in its status table. Its
legacy engine (``RAY_AIR_NEW_OUTPUT=0``, still supported in 2.60) honours a ``CLIReporter`` with chosen columns and a
refresh period. The variable changes only what is printed, never a result, and a value the user set wins.
"""

from __future__ import annotations

import os

from ray import tune

from pipeline.sweep.manifest import METRIC
from pipeline.trial.report import ETA_KEY

# Trial config keys and report keys -> column titles. Tune's own ``training_iteration`` / ``time_total_s`` give the
# elapsed time per trial; the header line gives the sweep's running time.
PARAMETER_COLUMNS = {"variant": "variant", "seed": "seed"}
METRIC_COLUMNS = {
    "epoch": "epoch",
    "train_loss": "train_loss",
    METRIC: METRIC,
    "images_per_s": "images/s",
    "time_total_s": "time (s)",
    ETA_KEY: "ETA (s)",
}
REFRESH_S = 120  # at most one table per 2 minutes while trials run, and the final one: hours of training stay readable


class SweepReporter(tune.CLIReporter):
    """``CLIReporter`` that starts printing once a trial has reported an epoch (a table of trials that are all still
    PENDING says nothing the next one will not), without the blank lines after each table and without the "Result
    logdir" line, which names Ray's node-local staging folder, not ``sweep.storage_path`` where results land."""

    def should_report(self, trials: list, done: bool = False) -> bool:
        started = any(METRIC in trial.last_result for trial in trials)
        return done or (started and super().should_report(trials, done))

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        lines = self._progress_str(trials, done, *sys_info).rstrip().splitlines()
        print("\n".join(line for line in lines if not line.startswith("Result logdir:")))


def progress_reporter() -> tune.CLIReporter:
    """The sweep's progress table (variant, seed, epoch, train loss, test accuracy, images/s, time, ETA), best trial
    first.

    Switches Ray to its legacy output engine unless the user chose one (see the module docstring): call it before
    ``Tuner.fit``.
    """
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    return SweepReporter(
        parameter_columns=PARAMETER_COLUMNS,
        metric_columns=METRIC_COLUMNS,
        sort_by_metric=True,  # on TuneConfig's metric and mode (Tune refuses them here as well)
        max_report_frequency=REFRESH_S,
        print_intermediate_tables=True,  # with verbose=1 the legacy engine would print only the last table
    )
