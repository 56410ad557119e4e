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
