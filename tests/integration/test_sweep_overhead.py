"""benchmarks/sweep_overhead.py at its smallest size, on the session's Ray: it runs, and the driver makes exactly one
MLflow request per epoch (a count, not a timing)."""

from __future__ import annotations

import re

import pytest

from benchmarks import sweep_overhead

pytestmark = pytest.mark.slow


def test_sweep_overhead_reports_one_mlflow_request_per_epoch(ray_address: str, capsys) -> None:
    assert sweep_overhead.main(["--epochs", "2", "--variants", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "trials: 1 x 2 epochs" in out and "the Ray already running" in out
    ratio = float(re.search(r"overhead ratio wall / trials: ([\d.]+)", out).group(1))
    assert ratio >= 1.0  # the sweep's wall time contains the trial's own time
    assert re.search(r"MLflow requests per epoch: 1\.00 \(log_batch, 2 epochs\)", out), out


def test_trial_end_benchmark_times_both_ways(ray_address: str, capsys) -> None:
    """benchmarks/trial_end.py on the session's Ray at its reduced size, 2 trials each way: both ways measured, the
    background trial ends ran on the worker thread (a worker time) (figures, not asserted speeds)."""
    from benchmarks import trial_end

    assert trial_end.main(["--trials", "2", "--reduced"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"reduced size \(([\d.]+) MiB checkpoint\), 2 trials each", out), out
    event_loop = re.search(r"^event loop +([\d.]+) +([\d.]+) +- +([\d.]+) +\d/1$", out, re.M)
    background = re.search(r"^background +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +\d/1$", out, re.M)
    assert event_loop and background, out
    assert float(background.group(3)) > 0  # the upload and the model happened, on the worker thread
