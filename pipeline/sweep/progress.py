"""What Ray Tune prints while a sweep runs: one compact table with the columns a reader looks for, refreshed slowly.

Ray 2.60's default output engine ignores ``RunConfig.progress_reporter`` and prints every reported value; its legacy
engine (``RAY_AIR_NEW_OUTPUT=0``) honours a ``CLIReporter`` with chosen columns and a refresh period. The variable
changes only what is printed, and a value the user set wins.
"""

from __future__ import annotations

import ast
import os
import re

from ray import tune
from tabulate import tabulate  # the writer Tune's own reporter vendors (ray._private.thirdparty); ours is a dependency

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
# Digits per column of the table (Tune prints 6 significant digits, ``0.000399351`` seconds); others as Tune wrote them.
DECIMALS = {"train_loss": 4, METRIC: 4, "images/s": 0, "time (s)": 0, "ETA (s)": 0}
TRIAL_NAME = re.compile(r"^\w+_([0-9a-f]{5}_\d{5})$")  # <trainable>_<trial id>: the id says it all
BEST_TRIAL = re.compile(r"^Current best trial: (\S+) with (\S+)=(\S+) and parameters=(\{.*\})$")
REFRESH_S = 120  # at most one table per 2 minutes while trials run, and the final one: hours of training stay readable


class SweepReporter(tune.CLIReporter):
    """``CLIReporter`` that starts printing once a trial has reported an epoch (a table of trials that are all still
    PENDING says nothing the next one will not), without the blank lines after each table and without the "Result
    logdir" line, which names Ray's node-local staging folder, not ``sweep.storage_path`` where results land."""

    def should_report(self, trials: list, done: bool = False) -> bool:
        started = any(METRIC in trial.last_result for trial in trials)
        return done or (started and super().should_report(trials, done))

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        print(compact(self._progress_str(trials, done, *sys_info)))


def compact(progress: str) -> str:
    """Tune's progress text made readable: the best trial named by variant and seed with its metric rounded, the
    trial table's names shortened to the trial id, its numbers rounded (``DECIMALS``), its ``loc`` column dropped
    while every trial runs on one node (the node's address says nothing then); no "Result logdir" line."""
    out: list[str] = []
    table: list[list[str]] = []
    for line in progress.rstrip().splitlines():
        if line.startswith("Result logdir:"):
            continue
        if line.startswith(("+", "|")):  # Tune's psql table: borders, header, rows
            if line.startswith("| "):
                table.append([cell.strip() for cell in line.strip()[1:-1].split("|")])
            continue
        if table:
            out.append(_table(table))
            table = []
        out.append(_best_trial(line))
    if table:
        out.append(_table(table))
    return "\n".join(out)


def _best_trial(line: str) -> str:
    match = BEST_TRIAL.match(line)
    if match is None:
        return line
    trial_id, metric, value, parameters = match.groups()
    try:
        config = ast.literal_eval(parameters)
        trial = f"{config['variant']} seed {config['seed']} ({trial_id})"
        return f"Current best trial: {trial}, {metric} {float(value):.4f}"
    except (ValueError, SyntaxError, KeyError, TypeError):
        return line


def _table(rows: list[list[str]]) -> str:
    header, body = rows[0], rows[1:]
    keep = list(range(len(header)))
    if "loc" in header:
        loc = header.index("loc")
        if len({row[loc].split(":")[0] for row in body if row[loc]}) <= 1:
            keep.remove(loc)
    numeric = set()
    for i, title in enumerate(header):
        for row in body:
            if i == 0:
                row[0] = TRIAL_NAME.sub(r"\1", row[0])
            if title in DECIMALS and row[i]:
                try:
                    row[i] = f"{float(row[i]):.{DECIMALS[title]}f}"
                    numeric.add(i)
                except ValueError:
                    pass
    if header and header[0] == "Trial name":
        header[0] = "trial"
    align = ["right" if i in numeric or header[i] in ("seed", "epoch") else "left" for i in keep]
    return tabulate(
        [[row[i] for i in keep] for row in body],
        headers=[header[i] for i in keep],
        tablefmt="psql",
        disable_numparse=True,
        colalign=align,
    )


def progress_reporter() -> tune.CLIReporter:
    """The sweep's progress table, best trial first. Switches Ray to its legacy output engine unless the user chose
    one (the module docstring): call it before ``Tuner.fit``."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    return SweepReporter(
        parameter_columns=PARAMETER_COLUMNS,
        metric_columns=METRIC_COLUMNS,
        sort_by_metric=True,  # on TuneConfig's metric and mode (Tune refuses them here as well)
        max_report_frequency=REFRESH_S,
        print_intermediate_tables=True,  # with verbose=1 the legacy engine would print only the last table
    )
