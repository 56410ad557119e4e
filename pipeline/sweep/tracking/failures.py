"""A trial's failed attempts as the driver's Tune callback sees them: why each failed, whether it was retried, and the
failures no retry can fix.

Tune tells the callback that a trial failed but not why; the reason is in the error Tune pickled and its error file.
Read here, so the stage says in one line per trial what it lost (``FailedAttempts.summary``), a trial whose every
attempt died before its first report is still known as failed, and a full disk stops the sweep at once
(``stop_on_storage_fault``) instead of failing every trial in turn.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from ray import cloudpickle

from pipeline.io import StorageFaultError, lasting_os_error
from pipeline.sweep.storage import StoragePath
from pipeline.trial.report import UnretryableTrialError


def trial_error(trial: Any) -> BaseException | None:
    """The trial's last error as Tune pickled it (None when there is none or it cannot be read)."""
    try:
        # Tune writes the error into the trial's local folder just before on_trial_error and copies it to the storage
        # (where get_pickled_error reads) only at a later sync: a trial failing before its first report had none there.
        local = trial.pickled_error_file
        if local and Path(local).is_file():
            return cloudpickle.loads(Path(local).read_bytes())
        return trial.get_pickled_error()
    except Exception:  # noqa: BLE001 - an unreadable error file only loses the reason, never the run's end
        return None


def unretryable_reason(trial: Any) -> str | None:
    """The reason of the trial's last error when it is an ``UnretryableTrialError`` (divergence, bad config), read from
    the error Tune pickled; None for any other error (or none)."""
    error = trial_error(trial)
    while error is not None:  # Ray wraps the trial's exception (RayTaskError, TuneError): walk to the cause
        if isinstance(error, UnretryableTrialError):
            return error.reason
        error = getattr(error, "cause", None) or error.__cause__
    return None


def last_failure(trial: Any) -> str:
    """One line on the trial's latest failure, from the error file Tune has just appended it to (``Failure # n
    (occurred at ...)`` and the error: a trainable's traceback ends with its exception, a lost worker's message starts
    with what happened); "" when the file cannot be read."""
    try:
        text = Path(getattr(trial, "error_file", None)).read_text()
    except (OSError, TypeError):
        return ""
    lines = [line.strip() for line in text.rsplit("Failure # ", 1)[-1].splitlines()[1:] if line.strip()]
    if not lines:
        return ""
    return (lines[-1] if lines[0].startswith("ray::") else lines[0])[:300]


def stop_on_storage_fault(trial: Any, storage: StoragePath | None) -> None:
    """A trial that failed writing to a full (read-only, over-quota...) disk: every retry, and every other trial,
    would fail the same way, so the sweep stops here, raising ``StorageFaultError`` out of ``Tuner.fit`` (Tune
    stops its trials); ``fit_tracked`` closes the runs with the reason and the stage says it in one line."""
    fault = lasting_os_error(trial_error(trial))
    if fault is None:
        return
    where = fault.filename or (str(storage) if storage is not None else trial.path)
    raise StorageFaultError(str(where), fault, what=f"trial {trial.trial_id} wrote to it")


class FailedAttempts:
    """Per trial id: its name, config and storage folder, one line per failed attempt, and whether it failed for good.
    Plain data: Tune pickles it with the callback."""

    def __init__(self) -> None:
        self.trials: dict[str, dict[str, Any]] = {}

    def count(self, trial: Any, final: bool) -> None:
        if trial.trial_id not in self.trials:
            self.trials[trial.trial_id] = {
                "trial": f"{trial.config.get('variant')} seed {trial.config.get('seed')}",
                "config": dict(trial.config),
                "folder": PurePosixPath(str(trial.path)).name,  # the trial's folder, as its result names it
                "failures": [],
            }
        self.trials[trial.trial_id]["failures"].append(last_failure(trial))
        self.trials[trial.trial_id]["final"] = final

    def failed_config(self, folder: str) -> dict[str, Any] | None:
        """The config of the trial in ``folder`` (its storage folder's name) if Tune ended it as failed, its retries
        spent; None otherwise. Also when every attempt died before its first report (Tune's result then has neither
        its error nor its config): a failed trial, not one still pending when the sweep stopped."""
        found = (k["config"] for k in self.trials.values() if k["final"] and k["folder"] == folder)
        return next(found, None)

    def summary(self) -> list[str]:
        """One line per trial that lost attempts in this run: how many, whether it was retried, the last reason."""
        lines = []
        for known in self.trials.values():
            count = len(known["failures"])
            outcome = "no retry left" if known["final"] else "retried"
            last = next((line for line in reversed(known["failures"]) if line), "see the trial's error.txt")
            lines.append(f"{known['trial']}: {count} failed attempt{'s' * (count > 1)}, {outcome} (last: {last})")
        return lines
