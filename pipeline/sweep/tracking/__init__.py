"""MLflow behind one seam: every module of the driver that talks to an MLflow store is in this package.

- ``store``         the one client factory (``mlflow_client``), the store created once, the look-ups (runs by trial
                    identity, a parent's children), an outage told from a refusal
- ``tags``          what a run holds: the tag names the driver writes and reads back, params flattened
- ``parent``        the parent run of a sweep or a prune run, opened once and found again on restore
- ``callback``      the Tune callback that writes each trial's run: the trial -> run map and the runs opened or
                    continued; each hook hands the rest to ``epochs``, ``trial_end`` or ``failures``
- ``epochs``        a trial's per-epoch metrics in its run (which report keys it charts), each epoch once
- ``failures``      a trial's failed attempts: why, whether retried, a full disk that stops the sweep
- ``buffer``        the driver's writes, made in order on one writer thread off Tune's event loop, kept on disk
                    through a tracking-server outage and replayed when it answers
- ``logged_model``  a trial's final model and dataset as MLflow logs them
- ``registry``      what a finished run publishes: the parent's description and summary, the registered models
- ``claims``        claims on trial identities in a store several projects share: one trains, the others wait
- ``trial_end``     a trial's end-of-run MLflow work (checkpoint, model, run closed), on the buffer's writer thread
- ``system_metrics`` MLflow's system metrics sampled in the trial's worker
- ``ui``            the MLflow UI address of a sweep's trials
- ``server``        a real ``mlflow server`` of our own (tests, benchmarks)
"""
