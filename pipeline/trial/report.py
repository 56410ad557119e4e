"""What a trial hands to the driver: the keys of its per-epoch report and the files of its checkpoint directory.

The contract between the worker (``pipeline.trial``) and the driver (``pipeline.sweep``): the driver logs these
metrics to MLflow and finds these files in a trial's checkpoint, without importing the training code or torch.
"""

from __future__ import annotations

# Every epoch's report, in order. ``epoch`` counts completed epochs (an int, from 1) and is the MLflow step.
METRIC_KEYS = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "epoch_time_s", "images_per_s")
# With a validation set (``data.validation_fraction`` > 0) the report adds these after ``METRIC_KEYS``, from one
# evaluation of the validation images after each epoch: the analysis selects the best epoch on ``val_acc``.
VALIDATION_KEYS = ("val_acc", "val_loss")
# A self-attention model's report also holds, per layer, the mean over its heads of each locality metric
# (``pipeline.trial.locality``), as ``locality/layer<l>/<metric>`` with layers from 1: MLflow's UI groups the
# ``locality/`` charts together.
LOCALITY_PREFIX = "locality/"
LOCALITY_METRICS = ("mean_distance", "entropy", "peak_probability")


def locality_key(layer: int, metric: str) -> str:
    """``locality/layer<layer>/<metric>``; ``layer`` counts from 1."""
    return f"{LOCALITY_PREFIX}layer{layer}/{metric}"


def epoch_metrics(report: dict[str, float]) -> dict[str, float]:
    """The values of an epoch's report (or a checkpoint's ``metrics_history`` entry) that are MLflow metrics: the
    training metrics (with the validation ones when there are), the locality metrics, without ``epoch`` (the step)
    or Ray's keys."""
    return {
        key: float(value)
        for key, value in report.items()
        if (key in METRIC_KEYS and key != "epoch") or key in VALIDATION_KEYS or key.startswith(LOCALITY_PREFIX)
    }


# The first epoch's report also holds what was measured before training (the locality of epoch 0, at init or right
# after pruning), each key under this prefix: the driver logs them at MLflow step 0, so every locality curve starts
# where training did. In the first report only, so a resumed trial never sends them twice.
INITIAL_PREFIX = "initial/"


def initial_metrics(report: dict[str, float]) -> dict[str, float]:
    """The values of ``report`` measured before training (``INITIAL_PREFIX`` keys), without the prefix: MLflow's
    metrics at step 0. Empty for every report but a fresh trial's first."""
    return {key.removeprefix(INITIAL_PREFIX): float(v) for key, v in report.items() if key.startswith(INITIAL_PREFIX)}


# For Tune's progress table only (not an MLflow metric): seconds left for this trial at its last epoch's pace.
ETA_KEY = "eta_s"
# Where the trial runs (node, device, precision), reported under this key and logged as run tags.
WHERE_KEY = "trial_tags"

CHECKPOINT_FILE = "checkpoint.pt"
HEAD_HISTORY_FILE = "head_history.json"
# Every self-attention model's per-head locality per epoch (epoch 0 = before training): ``pipeline.trial.locality``.
LOCALITY_HISTORY_FILE = "locality_history.json"
# In the trial's storage folder: the failure a retry cannot fix, so a retried or restored trial re-raises it at once.
UNRETRYABLE_FILE = "unretryable_failure.json"


class UnretryableTrialError(RuntimeError):
    """A trial failure that a retry cannot fix (divergence, a config the trial cannot run): the trial fails once.

    Ray Tune retries every error up to ``sweep.max_failures`` times; a retried trial that finds this failure recorded
    (``UNRETRYABLE_FILE``) raises it again before training. ``reason`` says what happened and what to change; the
    driver records it on the MLflow run and in the manifest.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
