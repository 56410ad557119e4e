"""A Ray trial folder's checkpoints, in a local folder or a bucket: the newest one that loads.

A crash or a full disk can leave a trial's newest checkpoint truncated: a resume from an earlier sweep and a
checkpoint upload replayed after a tracking outage take the newest one that loads, warning about one that does not.
"""

from __future__ import annotations

import logging

from pipeline.sweep.storage import StoragePath
from pipeline.trial.report import CHECKPOINT_FILE

log = logging.getLogger(__name__)


def checkpoint_epoch(directory: StoragePath) -> int | None:
    """The epoch of the checkpoint in ``directory`` (local or in a bucket); None, with a warning naming the file, when
    there is none or it does not load (truncated by a crash, deleted by Tune's ``num_to_keep``)."""
    from pipeline.trial.checkpoint import CorruptCheckpointError, load_checkpoint  # torch: only when one is read

    if not (directory / CHECKPOINT_FILE).is_file():
        log.warning("skipping %s: it holds no %s", directory, CHECKPOINT_FILE)
        return None
    try:
        with directory.as_local() as local:
            return int(load_checkpoint(local)["epoch"])
    except (FileNotFoundError, CorruptCheckpointError) as err:
        log.warning("skipping %s: %s", directory, err)
        return None


def newest_checkpoint(trial_path: StoragePath) -> tuple[StoragePath, int] | None:
    """The newest ``checkpoint_*`` dir under a Ray trial folder (local or in a bucket) whose checkpoint loads, with
    its epoch; one that does not load is skipped for the one before it (``checkpoint_epoch``)."""
    try:
        directories = trial_path.subdirs("checkpoint_")
    except OSError as err:  # a bucket or endpoint an earlier run recorded and that is gone: nothing to resume from
        log.warning("not resuming from %s: %s", trial_path, str(err).splitlines()[0][:200])
        return None
    for directory in reversed(directories):
        if (epoch := checkpoint_epoch(directory)) is not None:
            return directory, epoch
    return None


def newest_loading_checkpoint(preferred: StoragePath, trial_dir: StoragePath) -> StoragePath | None:
    """``preferred`` when it still loads, else the trial's newest checkpoint that does (None: none does)."""
    if checkpoint_epoch(preferred) is not None:
        return preferred
    found = newest_checkpoint(trial_dir)
    return found[0] if found else None
