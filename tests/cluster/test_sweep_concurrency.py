"""benchmarks/sweep_concurrency.py at its smallest size: its own two-node cluster (declared CPUs), its own lab store
(PostgreSQL + a bucket), 8 trials 4 at a time through the tune stage's path and through bare Ray Tune. Counts, not
timings: every trial of both ways ended, one FINISHED run per trial in the store (the script checks the store and
exits 1 otherwise), one run created per trial, and the writer thread's lag measured over every write (finite)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab_store import postgresql_missing

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TRIALS = 8


def test_sweep_concurrency_ends_every_trial_with_one_run_and_measures_the_writer_lag() -> None:
    if missing := postgresql_missing():
        pytest.skip(missing)
    command = ["-m", "benchmarks.sweep_concurrency", "--concurrency", "4", "--trials", str(TRIALS), "--nodes", "2"]
    # From the repository root: the cluster's Ray workers import the project from the driver's working directory.
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert f"checked: every trial of both ways ended, one FINISHED run per trial ({TRIALS})" in out, out[-3000:]
    rows = {m.group(1): m.group(2).split() for m in re.finditer(r"^(ours|bare Ray Tune) +(\d.*)$", out, re.M)}
    assert set(rows) == {"ours", "bare Ray Tune"}, out[-3000:]
    assert all(int(cells[0]) == TRIALS for cells in rows.values()), rows  # trials ended, each way
    requests = re.search(r"^MLflow requests by method \(our client's\): \{.*'create_run': (\d+)", out, re.M)
    assert requests and int(requests.group(1)) == TRIALS, out[-3000:]  # one run per trial, none made twice
    lag = re.search(r"^writer lag: (\d+) writes, max ([\d.]+|nan) s, p95 ([\d.]+|nan) s", out, re.M)
    assert lag, out[-3000:]
    writes, worst, p95 = int(lag.group(1)), float(lag.group(2)), float(lag.group(3))
    assert writes >= 4 * TRIALS  # each trial's run, its start, its epoch and its end: each a write on the thread
    assert math.isfinite(worst) and math.isfinite(p95) and 0 <= p95 <= worst, lag.group(0)
    ratio = re.search(r"^wall ratio to bare Ray Tune: ([\d.]+)$", out, re.M)
    assert ratio and float(ratio.group(1)) > 0, out[-3000:]
