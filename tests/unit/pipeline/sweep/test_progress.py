"""What the console shows while a sweep runs: Tune's progress text made compact, and Ray's token advice replaced."""

from __future__ import annotations

import logging
import os

import pytest
from ray._private.authentication import authentication_token_setup

from pipeline.sweep import session
from pipeline.sweep.progress import compact
from stages._cli import setup_logging

# Ray 2.60's legacy reporter, as it printed a sweep of two trials (captured from a real Tuner.fit with SweepReporter).
TUNE_OUTPUT = """== Status ==
Current time: 2026-11-25 07:27:39 (running for 00:00:13.05)
Using FIFO scheduling algorithm.
Logical resource usage: 1.0/2 CPUs, 0/0 GPUs
Current best trial: a75f2_00000 with test_acc=0.30277777777777776 and parameters={'variant': 'sa_quadratic_9', 'seed': 0}
Number of trials: 2/2 (2 TERMINATED)
+-----------------------+------------+----------------+----------------+--------+---------+--------------+------------+------------+------------+-----------+
| Trial name            | status     | loc            | variant        |   seed |   epoch |   train_loss |   test_acc |   images/s |   time (s) |   ETA (s) |
|-----------------------+------------+----------------+----------------+--------+---------+--------------+------------+------------+------------+-----------|
| trainable_a75f2_00000 | TERMINATED | 192.0.2.2:4877 | sa_quadratic_9 |      0 |       2 |      2.33333 |   0.302778 |    1234.57 |  0.0663657 |   12.3456 |
| trainable_a75f2_00001 | TERMINATED | 192.0.2.2:4879 | resnet18       |      0 |       2 |      2.33333 |   0.302778 |    1234.57 |  0.0288258 |   12.3456 |
+-----------------------+------------+----------------+----------------+--------+---------+--------------+------------+------------+------------+-----------+
Result logdir: /tmp/ray/session/artifacts/driver_artifacts"""  # noqa: E501


def test_the_progress_table_is_compact_and_rounded() -> None:
    lines = compact(TUNE_OUTPUT).splitlines()
    assert "Current best trial: sa_quadratic_9 seed 0 (a75f2_00000), test_acc 0.3028" in lines
    header = next(line for line in lines if "status" in line)
    assert "loc" not in header.split("|")[3] and "192.0.2.2" not in "".join(lines)  # one node: no address column
    row = next(line for line in lines if "sa_quadratic_9" in line and "TERMINATED" in line)
    assert [cell.strip() for cell in row.strip("|").split("|")] == [
        "a75f2_00000", "TERMINATED", "sa_quadratic_9", "0", "2", "2.3333", "0.3028", "1235", "0", "12",
    ]  # fmt: skip
    ray_width = max(len(line) for line in TUNE_OUTPUT.splitlines() if line.startswith("|"))
    assert max(len(line) for line in lines) <= ray_width - 25  # 155 -> 130 characters
    assert not any("Result logdir" in line for line in lines)


def test_the_address_column_stays_when_trials_run_on_several_nodes() -> None:
    several = TUNE_OUTPUT.replace("192.0.2.2:4879", "192.0.2.7:4879")
    assert "192.0.2.7:4879" in compact(several)


def test_rays_opt_out_advice_is_replaced_by_a_true_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(session.TOKEN_SETUP_LOGGER)
    before = list(logger.filters)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        session.quiet_token_advice()
        session.quiet_token_advice()  # once only
        with caplog.at_level(logging.INFO, logger=session.log.name):
            authentication_token_setup._warn_token_auth_enabled()  # Ray's own call, as a local ray.init makes it
            authentication_token_setup._warn_token_auth_disabled()  # other advice passes
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before
    assert len(seen) == 1 and "Token authentication is disabled" in seen[0]
    assert "the pipeline keeps it on" in caplog.text and "opt out" not in caplog.text


def test_stages_draw_no_progress_bars_into_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    setup_logging()
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false" and os.environ["TQDM_DISABLE"] == "1"


def test_the_dashboard_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(session.DASHBOARD_ENV, raising=False)
    assert not session.wants_dashboard()
    for value, wanted in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv(session.DASHBOARD_ENV, value)
        assert session.wants_dashboard() is wanted
