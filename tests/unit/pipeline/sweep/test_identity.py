"""A trial's identity: exactly what determines its result, stable across processes and places."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import Params, params_hash, parse_params
from pipeline.sweep import identity
from pipeline.sweep.identity import PROJECT_ROOT, TRIAL_CODE, model_values, sweep_hash, trial_code, trial_key

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


def test_the_key_hashes_the_model_s_own_values_the_train_section_the_data_and_the_code() -> None:
    """Finished runs are found by their key, so its recipe is fixed: all the data (``data_fraction`` 1) is left out of
    the train section, and the model's values are those of its own encoding."""
    default = Params()
    for variant in default.sweep.variants:
        train = default.train.model_copy(update={"seed": 3}).model_dump(mode="json")
        del train["data_fraction"]
        model = default.model_for(variant)
        identity = {"model": model_values(model), "train": train, "data": DATA}
        expected = params_hash({**identity, "code": trial_code(model.arch, model.encoding)})
        assert trial_key(default, variant, 3, DATA) == expected, variant


def test_another_encoding_s_field_is_not_part_of_a_model_s_key() -> None:
    """``model.learned_dim`` reaches learned trials only: a quadratic trial keeps its key, a learned one changes."""
    learned = {"sa_learned": {"arch": "sa", "encoding": "learned", "heads": 9}}
    base = params(variants={**learned, "sa_quadratic_9": QUADRATIC}, sweep={"variants": ["sa_learned"]})
    wider = params(
        variants={**learned, "sa_quadratic_9": QUADRATIC}, model={"learned_dim": 12}, sweep={"variants": ["sa_learned"]}
    )
    assert trial_key(wider, "sa_quadratic_9", 0, DATA) == trial_key(base, "sa_quadratic_9", 0, DATA)
    assert trial_key(wider, "sa_learned", 0, DATA) != trial_key(base, "sa_learned", 0, DATA)
    assert "learned_dim" not in model_values(base.model_for("sa_quadratic_9"))


def test_a_variant_s_train_field_is_the_same_trial_as_the_same_train_section() -> None:
    """The key hashes what a trial trains with, not where params.yaml says it: lr 0.05 either way is one trial."""
    variant = {"sa_quadratic_9": {**QUADRATIC, "train.lr": 0.05}, "resnet18": {"arch": "resnet18"}}
    assert trial_key(params(variants=variant), "sa_quadratic_9", 0, DATA) == trial_key(
        params(train={"lr": 0.05}), "sa_quadratic_9", 0, DATA
    )


def test_the_key_and_the_sweep_change_with_the_trial_code(monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = sweep_hash(params(), DATA)
    monkeypatch.setattr(identity, "trial_code", lambda arch, encoding, **_: f"edited-{arch}-{encoding}")
    assert trial_key(params(), "sa_quadratic_9", 0, DATA) != BASE
    assert sweep_hash(params(), DATA) != sweep


def test_the_sweep_identity_ignores_the_variants_and_grids_it_does_not_run() -> None:
    """A variant or grid defined but not swept (e.g. one of a new encoding, not yet in ``sweep.variants``), or another
    encoding's field, trains nothing: the sweep keeps its name."""
    base = sweep_hash(params(), DATA)
    learned = {"sa_learned": {"arch": "sa", "encoding": "learned", "heads": 9}}
    defined = {"sa_quadratic_9": QUADRATIC, "resnet18": {"arch": "resnet18"}, **learned}
    assert sweep_hash(params(variants=defined), DATA) == base
    assert (
        sweep_hash(params(grid={"g": {"arch": "sa", "axes": {"encoding": ["learned"], "heads": [1, 2]}}}), DATA) == base
    )
    assert sweep_hash(params(model={"learned_dim": 12}), DATA) == base
    assert sweep_hash(params(model={"hidden": 48}), DATA) != base


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


def test_the_trial_code_does_not_depend_on_where_the_project_is(tmp_path: Path) -> None:
    for entry in TRIAL_CODE:
        source = PROJECT_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, tmp_path / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp_path / entry)
    for arch, encoding in [("sa", "quadratic"), ("sa", "gpsa"), ("resnet18", "quadratic")]:
        assert trial_code(arch, encoding, root=tmp_path) == trial_code(arch, encoding)
