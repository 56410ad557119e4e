"""benchmarks/sweep_overhead.py at its smallest size, on the session's Ray: it runs, and the driver makes exactly one
MLflow request per epoch (a count, not a timing); benchmarks/trial_end.py, benchmarks/tracking_load.py and
benchmarks/sweep_at_scale.py at small sizes."""

from __future__ import annotations

import ast
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


def test_tracking_load_logs_every_epoch_once_through_a_real_server(ray_address: str, capsys) -> None:
    """benchmarks/tracking_load.py at a small size on the session's Ray: 8 trials x 3 epochs, 4 at a time, through its
    own ``mlflow server``; every epoch checked on the server, writes/s printed (a figure, not an asserted speed). Per
    trial: its run, a log_batch of params, one per epoch, its closing tags, its end."""
    from benchmarks import tracking_load

    assert tracking_load.main(["--trials", "8", "--epochs", "3", "--concurrent", "4", "--epoch-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "checked: 8 runs FINISHED, every epoch logged exactly once, no write lost" in out, out
    assert re.search(r"requests: \d+ \(create_run 8, log_batch 40, set_terminated 8\)", out), out
    assert float(re.search(r"sustained writes/s: ([\d.]+)", out).group(1)) > 0


def test_sweep_at_scale_makes_the_same_requests_per_trial_at_every_size(ray_address: str, capsys) -> None:
    """benchmarks/sweep_at_scale.py at two tiny sizes on the session's Ray: every trial of both ways ran, and our
    driver's MLflow requests grow with the trials, not faster (the same count per trial at 1 and 2 trials, per method),
    each trial's run holding the same metric rows (counts, not timings)."""
    from benchmarks import sweep_at_scale

    assert sweep_at_scale.main(["--trials", "2", "--sizes", "1", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    rows = {(r.split()[0], r.split()[1]): r.split() for r in out.splitlines() if re.match(r"^ +[12] +(ours|bare)", r)}
    assert set(rows) == {("1", "ours"), ("1", "bare"), ("2", "ours"), ("2", "bare")}, out
    assert rows["1", "ours"][6] == rows["2", "ours"][6]  # requests per trial
    assert rows["1", "ours"][-1] == rows["2", "ours"][-1]  # metric rows per trial
    by_method = {
        int(n): ast.literal_eval(methods)
        for n, methods in re.findall(r"^(\d+) trials, MLflow requests by method: (\{.*\})$", out, re.M)
    }
    assert {method: count / 2 for method, count in by_method[2].items()} == by_method[1], by_method
    # Per trial of one epoch: its run, one batch each for its start, its epoch, and its end's and checkpoint's tags
    # together, the checkpoint's upload, the run's end, and for its model the run's tags (the model's name) and its
    # dataset input; no lone set_tag, and no fluent run around the model (3 more requests: read, RUNNING, FINISHED).
    assert by_method[1] == {
        "create_run": 1,
        "log_batch": 3,
        "log_artifacts": 1,
        "get_run": 1,
        "log_inputs": 1,
        "set_terminated": 1,
    }, by_method
    assert re.search(r"^overhead: [\d.-]+ % \(ours\), [\d.-]+ % \(bare Ray Tune\)$", out, re.M), out
