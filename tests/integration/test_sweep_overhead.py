"""The driver's overhead benchmarks that need Ray, at small sizes on the session's Ray: benchmarks/tracking_load.py
(every epoch logged once through a real server) and benchmarks/sweep_at_scale.py (the same MLflow requests per trial,
by method and HTTP endpoint, at every size; counts, not timings)."""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest

pytestmark = pytest.mark.slow


def test_tracking_load_logs_every_epoch_once_through_a_real_server(ray_address: str, capsys) -> None:
    """benchmarks/tracking_load.py at a small size on the session's Ray: 8 trials x 3 epochs, 4 at a time, through its
    own ``mlflow server``; every epoch checked on the server, writes/s printed (a figure, not an asserted speed). Per
    trial: its run, a log_batch of params, one of its three epochs together (shorter than SEND_EVERY_S: held until
    its end), its closing tags, its end."""
    from benchmarks import tracking_load

    assert tracking_load.main(["--trials", "8", "--epochs", "3", "--concurrent", "4", "--epoch-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "checked: 8 runs FINISHED, every epoch logged exactly once, no write lost" in out, out
    assert re.search(r"requests: \d+ \(create_run 8, log_batch 24, set_terminated 8\)", out), out
    assert float(re.search(r"sustained writes/s: ([\d.]+)", out).group(1)) > 0


def test_sweep_at_scale_makes_the_same_requests_per_trial_at_every_size(ray_address: str, capsys) -> None:
    """benchmarks/sweep_at_scale.py at two tiny sizes on the session's Ray, through a real ``mlflow server``: every
    trial of both ways ran, and our driver's MLflow requests grow with the trials, not faster (the same count per trial
    at 1 and 2 trials, per method and per HTTP endpoint), each trial's run holding the same metric rows (counts, not
    timings)."""
    from benchmarks import sweep_at_scale

    assert sweep_at_scale.main(["--trials", "2", "--sizes", "1", "--epochs", "1", "--server"]) == 0
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
    # Per trial of one epoch: its run, one batch each for its start, its epochs (held until its end: shorter than
    # SEND_EVERY_S, so the same count at any number of epochs), and its end's and checkpoint's tags
    # together, the checkpoint's upload, its dataset input, the run's end; no lone set_tag, no read of the run, and no
    # model (logged at registration, for the best seed of each variant only).
    assert by_method[1] == {"create_run": 1, "log_batch": 3, "log_artifacts": 1, "log_inputs": 1, "set_terminated": 1}
    by_endpoint = {
        int(n): Counter(ast.literal_eval(endpoints))
        for n, endpoints in re.findall(r"^(\d+) trials, HTTP requests by endpoint: (\{.*\})$", out, re.M)
    }
    # What one more trial adds, every HTTP request the driver makes (MLflow's own included): the above, and no read
    # of the run (its artifact root is known since its creation). The registered model's requests (its files, its
    # records, the metric histories it links) are made once per variant, at both sizes alike.
    assert by_endpoint[2] - by_endpoint[1] == {
        "POST runs/create": 1,
        "POST runs/log-batch": 3,
        "PUT artifact checkpoint/checkpoint.pt": 1,
        "POST runs/log-inputs": 1,
        "POST runs/update": 1,
    }, by_endpoint
    assert by_endpoint[1] - by_endpoint[2] == {}, by_endpoint
    assert by_endpoint[1]["PUT artifact MLmodel"] == by_endpoint[2]["PUT artifact MLmodel"] == 1  # the registered one
    assert re.search(r"^overhead: [\d.-]+ % \(ours\), [\d.-]+ % \(bare Ray Tune\)$", out, re.M), out
    ratio = re.search(r"^wall ratio to bare Ray Tune: ([\d.]+)$", out, re.M)
    assert ratio and float(ratio.group(1)) > 0, out
    assert re.search(
        r"^CPU s per trial: our driver [\d.]+, its tracking server [\d.]+; bare Ray Tune's driver [\d.]+$", out, re.M
    )
    added = r"^driver CPU s per trial added from 1 to 2 trials: ours -?[\d.]+, bare Ray Tune -?[\d.]+$"
    assert re.search(added, out, re.M), out
