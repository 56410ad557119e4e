"""A trial's identity: exactly what determines its result, stable across processes and places."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import Params, params_hash, parse_params
from pipeline.sweep import identity
from pipeline.sweep.identity import PROJECT_ROOT, TRIAL_CODE, code_hash, sweep_hash, trial_key

DATA = "a" * 64


def params(**sections: dict) -> Params:
    raw: dict = {"sweep": {"variants": ["sa_quadratic_9", "resnet18"], "seeds": [0, 1]}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return parse_params(raw)


BASE = trial_key(params(), "sa_quadratic_9", 0, DATA)
QUADRATIC = {"arch": "sa", "encoding": "quadratic", "heads": 9}


@pytest.mark.parametrize(
    ("what", "key"),
    [
        ("model width", lambda: trial_key(params(model={"hidden": 48}), "sa_quadratic_9", 0, DATA)),
        ("the variant", lambda: trial_key(params(), "resnet18", 0, DATA)),
        ("the seed", lambda: trial_key(params(), "sa_quadratic_9", 1, DATA)),
        ("train.lr", lambda: trial_key(params(train={"lr": 0.05}), "sa_quadratic_9", 0, DATA)),
        ("train.epochs", lambda: trial_key(params(train={"epochs": 8}), "sa_quadratic_9", 0, DATA)),
        ("the data", lambda: trial_key(params(), "sa_quadratic_9", 0, "b" * 64)),
        # compiled training draws Inductor's own dropout masks: another result (docs/design.md), so another trial
        ("train.compile", lambda: trial_key(params(train={"compile": True}), "sa_quadratic_9", 0, DATA)),
        ("train.data_fraction", lambda: trial_key(params(train={"data_fraction": 0.5}), "sa_quadratic_9", 0, DATA)),
        (
            "a variant's train.lr",
            lambda: trial_key(
                params(variants={"sa_quadratic_9": {**QUADRATIC, "train.lr": 0.05}, "resnet18": {"arch": "resnet18"}}),
                "sa_quadratic_9",
                0,
                DATA,
            ),
        ),
    ],
)
def test_the_key_changes_with_each_input(what: str, key) -> None:
    assert key() != BASE, what


def test_all_the_data_keeps_the_keys_trials_had_before_the_data_fraction_existed() -> None:
    """Finished runs are found by their key: a sweep without a data fraction must not retrain them. Before the field,
    the key hashed the model, the train section with the seed, the data and the code."""
    default = Params()
    for variant in default.sweep.variants:
        before = default.train.model_copy(update={"seed": 3}).model_dump(mode="json")
        del before["data_fraction"]  # the one field added since
        identity_before = {"model": default.model_for(variant).model_dump(mode="json"), "train": before}
        expected = params_hash({**identity_before, "data": DATA, "code": code_hash()})
        assert trial_key(default, variant, 3, DATA) == expected, variant


def test_a_variant_s_train_field_is_the_same_trial_as_the_same_train_section() -> None:
    """The key hashes what a trial trains with, not where params.yaml says it: lr 0.05 either way is one trial."""
    variant = {"sa_quadratic_9": {**QUADRATIC, "train.lr": 0.05}, "resnet18": {"arch": "resnet18"}}
    assert trial_key(params(variants=variant), "sa_quadratic_9", 0, DATA) == trial_key(
        params(train={"lr": 0.05}), "sa_quadratic_9", 0, DATA
    )


def test_the_key_changes_with_the_trial_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "code_hash", lambda root=PROJECT_ROOT: "edited-code")
    assert trial_key(params(), "sa_quadratic_9", 0, DATA) != BASE


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"sweep": {"seeds": [0, 1, 2]}},  # the other trials of the sweep
        {"sweep": {"variants": ["sa_quadratic_9"]}},
        {"sweep": {"max_concurrent_trials": 7, "max_failures": 0, "retrain": True, "fail_once_after_epoch": 1}},
        {"sweep": {"ray_address": "127.0.0.1:6379", "storage_path": "/elsewhere/ray"}},  # where it runs
        {"sweep": {"asha": {"enabled": True}, "resources": {"cpu": 4, "gpu": 1}}},
        {"tracking": {"uri": "http://127.0.0.1:5000", "experiment": "other"}},
        {"data": {"prepared_dir": "/mnt/shared/prepared"}},
        {"prune": {"epochs": 3}},
    ],
)
def test_the_key_ignores_how_and_where_it_runs(elsewhere: dict) -> None:
    assert trial_key(params(**elsewhere), "sa_quadratic_9", 0, DATA) == BASE


def test_the_sweep_identity_ignores_where_things_live() -> None:
    base = sweep_hash(params(), DATA)
    moved = params(
        tracking={"uri": "http://127.0.0.1:5000"},
        data={"prepared_dir": "/mnt/prepared"},
        sweep={"storage_path": "/mnt/ray", "ray_address": "auto"},
    )
    assert sweep_hash(moved, DATA) == base
    assert sweep_hash(params(sweep={"seeds": [0, 1, 2]}), DATA) != base


def test_the_key_is_stable_across_processes_and_key_order() -> None:
    """A fresh interpreter (another hash seed) computing it from reordered params gets the same key."""
    script = (
        "from pipeline.config import parse_params; from pipeline.sweep.identity import trial_key;"
        "raw = {'train': {}, 'sweep': {'seeds': [0, 1], 'variants': ['sa_quadratic_9', 'resnet18']}};"
        f"print(trial_key(parse_params(raw), 'sa_quadratic_9', 0, {DATA!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=PROJECT_ROOT,
    )
    assert done.stdout.strip() == BASE


def test_the_code_hash_does_not_depend_on_where_the_project_is(tmp_path: Path) -> None:
    for entry in TRIAL_CODE:
        source = PROJECT_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, tmp_path / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp_path / entry)
    assert code_hash(tmp_path) == code_hash()
