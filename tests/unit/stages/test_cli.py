"""What every stage entry point shares (stages/_cli.py): how a stage stops."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# A stage that says it has started, then works for 10 s.
WORKING_STAGE = """
import sys, time
from stages._cli import make_parser, run

def stage(args, params):
    print("started", flush=True)
    time.sleep(10)
    return 0

sys.exit(run(stage, make_parser(None).parse_args(["--params", sys.argv[1]])))
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stage_started_with_sigint_ignored_still_stops_like_ctrl_c(stop: signal.Signals) -> None:
    """As a background job of a shell without job control starts it (SIGINT ignored): it stops at once, exit 130."""
    stage = subprocess.Popen(
        [sys.executable, "-c", WORKING_STAGE, str(ROOT / "params.yaml")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as the shell does
    )
    assert stage.stdout.readline() == "started\n"
    stage.send_signal(stop)
    _, err = stage.communicate(timeout=60)
    assert stage.returncode == 130 and "interrupted" in err, err
