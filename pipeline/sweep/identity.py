"""What names a trial and a sweep: the code each trial runs, the params its result depends on and the prepared data.

A trial's identity (``trial_key``) is exactly what determines its result: the variant's model config (the fields of
its own encoding, not those other encodings declare), its train config with the trial's seed, the prepared data's
content hash and the code it runs (``trial_code``, ``pipeline.trial.code_version``: the normalised source of the
modules a trial of that model imports, its own encoding's module and registry entry, the config's trial sections);
not where it runs or which other trials share its sweep, so a grown sweep finds its existing trials by this key
(``pipeline.sweep.reuse``). An edit of one encoding, or a docstring or comment anywhere, retrains no other trial;
editing driver, measuring or analysis code never does. ``TRIAL_CODE`` is coarser: every path trial code lives in,
exactly the training stages' code ``deps`` in ``dvc.yaml`` (a test keeps them equal, and keeps every identity's
modules inside them), so DVC re-runs the stage on any edit there and the stage reuses every unchanged trial.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.config import ModelConfig, Params, params_hash
from pipeline.encodings import encoding_fields, spec_for
from pipeline.trial.code_version import PROJECT_ROOT, TRIAL_CODE, trial_code, trial_modules

__all__ = [
    "PROJECT_ROOT",
    "TRIAL_CODE",
    "model_values",
    "trial_code",
    "trial_codes",
    "trial_modules",
    "trial_key",
    "sweep_hash",
    "experiment_name",
    "prepared_data_hash",
]


def model_values(model: ModelConfig) -> dict[str, Any]:
    """A model config's values that reach its trial: every field but those only other encodings declare (a new
    encoding's fields are no other model's)."""
    values = model.model_dump(mode="json")
    own = spec_for(model.encoding).fields
    for field in set(encoding_fields()) - set(own):
        del values[field]
    return values


def trial_codes(params: Params, variants: Iterable[str]) -> dict[str, str]:
    """Per variant, the code identity of its trials (``trial_code`` of its model)."""
    return {v: trial_code(params.model_for(v).arch, params.model_for(v).encoding) for v in variants}


def trial_key(params: Params, variant: str, seed: int, data_hash: str) -> str:
    """Identity of one trial: its model config, its train config (with its seed), the prepared data's content hash and
    the code it runs. Two trials with the same key train to the same result, so a finished one is never trained
    twice."""
    train = params.train_for(variant).model_copy(update={"seed": seed}).model_dump(mode="json")
    if train["data_fraction"] == 1.0:
        del train["data_fraction"]  # all the data: left out, as in every key since the field exists
    model = params.model_for(variant)
    identity = {
        "model": model_values(model),
        "train": train,
        "data": data_hash,
        "code": trial_code(model.arch, model.encoding),
    }
    return params_hash(identity)


def sweep_hash(params: Params, data_hash: str) -> str:
    """Identity of the sweep (its Ray experiment and MLflow parent run): its trials' models, train configs and code,
    every param of how Tune runs them and the prepared data's content hash; not where it runs, where data, results and
    runs are stored (``sweep.ray_address``, ``sweep.storage_path``, the ``data`` paths, ``tracking``), nor the variants,
    grids or encodings it does not run, so a moved project or a cluster finds the same sweep."""
    identity = params.model_dump(mode="json")
    for where in ("ray_address", "storage_path"):
        identity["sweep"].pop(where)
    identity.pop("tracking")
    identity.pop("transform")  # what the transform stage builds from the sweep afterwards, not how it trains
    for section in ("model", "variants", "grid"):  # resolved per variant below, for the variants the sweep runs
        identity.pop(section)
    codes = trial_codes(params, params.sweep.variants)
    identity["trials"] = {
        variant: {
            "model": model_values(params.model_for(variant)),
            "train": params.train_for(variant).model_dump(mode="json"),
            "code": codes[variant],
        }
        for variant in params.sweep.variants
    }
    identity["data"] = data_hash  # the content, in place of the section (which names the paths)
    return params_hash(identity)


def experiment_name(params: Params, data_hash: str) -> str:
    """The Ray experiment's folder and the MLflow parent run's name: ``tune-<sweep hash>``."""
    return f"tune-{sweep_hash(params, data_hash)}"


def prepared_data_hash(params: Params, project_root: Path) -> str | None:
    """The content hash recorded in the prepared data's manifest (checked against the tensors when they are
    loaded), or None when the prepare stage has not run."""
    manifest = project_root / params.data.prepared_dir / "manifest.json"
    return json.loads(manifest.read_text())["content_sha256"] if manifest.is_file() else None
