"""Tracebacks in a stage's output, less the one Ray prints at random when it stops a trial's worker.

Ray 2.60's worker turns SIGTERM into ``SystemExit`` from a Python signal handler. When Tune's clean-up stops an idle
trial actor while the actor's main thread happens to run a weak-reference callback, Python cannot raise there and
prints "Exception ignored in: ..." with a traceback ending in Ray's ``sigterm_handler`` (seen once in CI: the worker
had finished its trial, and the stage exited 0). That is Ray's teardown, not a failure of the stage; every other
traceback, a worker's or the driver's, still fails the test that asks for none.
"""

from __future__ import annotations

import re

START = "Traceback (most recent call last):"
# Ray prefixes a worker's lines with its name and process id, coloured on a terminal: "(train_trial pid=2602) ".
WORKER_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\((?P<process>[^()]*pid=\d+[^()]*)\)(?:\x1b\[[0-9;]*m)? ?")


def tracebacks(output: str) -> list[str]:
    """Each traceback in ``output``, its frames taken from the lines of the same process, Ray's teardown left out."""
    by_process: dict[str, list[str]] = {}
    for line in output.splitlines():
        worker = WORKER_PREFIX.match(line)
        by_process.setdefault(worker["process"] if worker else "", []).append(line[worker.end() :] if worker else line)
    found = []
    for lines in by_process.values():
        for start, line in enumerate(lines):
            if START in line:
                end = start + 1  # frames are indented (or blank); the exception's own line ends the traceback
                while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
                    end += 1
                found.append("\n".join(lines[start : end + 1]))
    return [block for block in found if not _ray_stopping_a_worker(block)]


def _ray_stopping_a_worker(traceback: str) -> bool:
    last = traceback.splitlines()[-1]
    return "ray/_private/worker.py" in traceback and "in sigterm_handler" in traceback and last.startswith("SystemExit")
