"""MLflow behind one seam: only this package imports MLflow or builds or calls a client; the product's other modules
(``pipeline/``, ``stages/``, ``analysis/``) import only the face below (tests and benchmarks may reach inside).

- ``api``           ``Store``: one store's reads and the writes outside a trial's run (the analysis run included)
- ``store``         the one client factory (``mlflow_client``), the one ``/health`` probe, the store created once,
                    the look-ups (runs by trial identity, a parent's children), an outage told from a refusal
- ``reads``         many runs read in a few requests: runs by id, a metric's history of many runs, named files
- ``tags``          what a run holds: the tag names the driver writes and reads back, params flattened
- ``parent``        the parent run of a sweep or a fine-tune stage, opened once and found again on restore
- ``callback``      the Tune callback that writes each trial's run; each hook hands the rest to ``epochs``,
                    ``trial_end`` or ``failures`` (which see it through ``callback_view.CallbackView``)
- ``callback_view`` what ``epochs`` and ``trial_end`` read of the callback, as a protocol: no import circle
- ``epochs``        a trial's per-epoch metrics in its run (which report keys it charts), each epoch once,
                    epochs shorter than 5 s sent together
- ``failures``      a trial's failed attempts: why, whether retried, a full disk that stops the sweep
- ``buffer``        the driver's writes, made in order on one writer thread off Tune's event loop, kept on disk
                    through a tracking-server outage and replayed when it answers
- ``logged_model``  a trial's checkpoint and dataset as MLflow logs them; a registered run's final model
- ``registry``      what a finished run publishes: the parent's description and summary, the registered models
                    (each variant's best seed, its model logged then)
- ``claims``        claims on trial identities in a store several projects share: one trains, the others wait
- ``trial_end``     a trial's end-of-run MLflow work (checkpoint, dataset, run closed), on the buffer's writer thread
- ``system_metrics`` MLflow's system metrics sampled in the trial's worker
- ``ui``            the MLflow UI address of a sweep's trials
- ``server``        a real ``mlflow server`` of our own (tests, benchmarks)

The face, in two parts (``tests/unit/test_mlflow_seam.py`` pins both and who may use the second):
- the store interface, for the driver, the fine-tune stages, the submit path, the UI stage and the analysis:
  ``Store``, ``TrackingError``, ``TrackingBuffer``, ``TrialInfo``, ``ParentRun``, ``PreparedDataset``,
  ``SweepSummary``, ``tracking_uri``, and the modules ``tags`` (run tag names) and ``ui`` (UI addresses);
- the Tune run's wiring, for ``pipeline.sweep.tracked`` and ``pipeline.sweep.tuner`` alone: the callback and its
  end (``MlflowTrialCallback``, ``close_interrupted``, ``trial_outcome``, ``EPOCH_METRICS``), the parent run's life
  (``open_parent_run``, ``record_trials``, ``finish_parent``), claims (``TrialClaims``), the outage buffer's files
  (``BUFFER_FILE``, ``FINAL_WAIT_S``, ``flush_buffers``, ``park_buffer``) and the worker's system metrics
  (``MetricsTarget``, ``train_with_system_metrics``).
"""

from __future__ import annotations

import importlib
from typing import Any

# Name -> the module that defines it. Imported on first use (PEP 562): a worker that unpickles ``system_metrics``, or a
# stage that reads ``tags``, imports that module alone, not the driver's whole MLflow side.
FACE = {
    **dict.fromkeys(("Store", "TrackingError"), "api"),
    **dict.fromkeys(("TrackingBuffer", "BUFFER_FILE", "FINAL_WAIT_S", "flush_buffers", "park_buffer"), "buffer"),
    **dict.fromkeys(("TrialInfo", "MlflowTrialCallback", "close_interrupted", "trial_outcome"), "callback"),
    **dict.fromkeys(("ParentRun", "open_parent_run", "record_trials", "finish_parent"), "parent"),
    **dict.fromkeys(("MetricsTarget", "train_with_system_metrics"), "system_metrics"),
    "PreparedDataset": "logged_model",
    "SweepSummary": "registry",
    "tracking_uri": "store",
    "TrialClaims": "claims",
    "EPOCH_METRICS": "epochs",
    "tags": None,  # modules, as namespaces
    "ui": None,
}


def __getattr__(name: str) -> Any:
    if name not in FACE:
        raise AttributeError(f"{__name__} has no {name!r} (its face: {', '.join(sorted(FACE))})")
    module = importlib.import_module(f"{__name__}.{FACE[name] or name}")
    return module if FACE[name] is None else getattr(module, name)
