"""The sweep's trials: every variant of ``sweep.variants`` x every seed of ``sweep.seeds``, and what to do with each.

A trial is named by its identity (``identity.trial_key``); whether it is reused, resumed or trained is looked up in
the tracking store by that key (``reuse``). Both the sweep and its dry run start here.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import Params
from pipeline.sweep.identity import trial_key
from pipeline.sweep.reuse import TrialDecision, decide_trials


def trial_grid(params: Params) -> list[dict[str, Any]]:
    """One row per trial (variants x seeds), with the resources each one asks Ray for."""
    resources = params.sweep.resources.model_dump()
    return [{"variant": v, "seed": s, **resources} for s in params.sweep.seeds for v in params.sweep.variants]


def sweep_decisions(
    params: Params, data_hash: str, uri: str, experiment_id: str | None, **lookup: Any
) -> list[TrialDecision]:
    """Per trial of the grid (variants x seeds, in that order): reuse, resume or train (``pipeline.sweep.reuse``;
    ``lookup``: its ``store`` and ``seen``)."""
    trials = [(v, s, trial_key(params, v, s, data_hash)) for s in params.sweep.seeds for v in params.sweep.variants]
    return decide_trials(uri, experiment_id, trials, params.train.epochs, retrain=params.sweep.retrain, **lookup)
