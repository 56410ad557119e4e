"""The fine-tune manifests keep the format the prune and transform stages wrote before they shared one module: the
same keys at the top and per model (the analysis and older manifests read them), ``skipped`` only in prune's, and the
same ``metrics.json`` figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.finetune.manifest import FineTuneManifest, read_finetune_manifest, write_finetune_manifest
from pipeline.finetune.prune import PrunedModel
from pipeline.finetune.transform import TransformedModel

TOP = {"experiment_id", "experiment_name", "flop_conventions", "models", "parent_run_id", "ray_experiment_path"}
TOP |= {"rule", "stage", "tracking_uri", "tune_experiment_name"}
PRUNED = {"acc_after_finetune", "acc_after_pruning", "acc_before_pruning", "checkpoint_dir", "decisions"}
PRUNED |= {"epochs_completed", "flops_after", "flops_before", "heads_per_layer", "metrics", "params_after"}
PRUNED |= {"params_before", "prune_key", "pruned_checkpoint_dir", "pruned_heads", "reused", "run_id", "run_name"}
PRUNED |= {"seed", "source_run_id", "source_trial_id", "status", "variant"}
TRANSFORMED = {"checkpoint_dir", "converted_checkpoint_dir", "converted_layers", "epochs_completed", "flops"}
TRANSFORMED |= {"flops_source", "max_logit_diff_float32", "max_logit_diff_float64", "metrics", "name", "params"}
TRANSFORMED |= {"params_source", "reused", "run_id", "run_name", "seed", "source_run_id", "source_test_acc"}
TRANSFORMED |= {"source_trial_id", "source_variant", "status", "test_acc", "test_acc_step0", "transform_key"}


def _pruned(seed: int, after: float | None, start: str = "/ray/pruned/a") -> PrunedModel:
    counts = {"paper": 1, "full": 2}
    run = ("run", "r", "finished", 2)
    return PrunedModel(
        "src", "t", "sa_generalized_9", seed, *run, [1], [8], 9, 8, counts, counts, 0.5, 0.4, after, start, None, [[]]
    )


def _transformed(seed: int, after: float, start: str = "/ray/converted/a") -> TransformedModel:
    counts = {"paper": 1, "full": 2}
    run, exact = ("run", "r", "finished", 2), (0.3, 0.3, 1e-7, 1e-15)
    return TransformedModel(
        "t_resnet18", "resnet18", "src", "t", seed, *run, ["stem.0"], *exact, after, 10, 12, counts, counts, start, None
    )


def _manifest(models: list, stage: str, skipped: list | None) -> FineTuneManifest:
    return FineTuneManifest(
        f"{stage}-x", "/ray/x", "tune-x", "sqlite:///x.db", "1", "p", {}, models, skipped, stage=stage
    )


def test_both_formats_are_as_before_and_read_back(tmp_path: Path) -> None:
    for stage, entry, models, skipped, keys in (
        ("prune", PrunedModel, [_pruned(0, 0.6, str(tmp_path / "a"))], [], TOP | {"skipped"}),
        ("transform", TransformedModel, [_transformed(0, 0.4, str(tmp_path / "a"))], None, TOP),
    ):
        path = tmp_path / f"{stage}.json"
        write_finetune_manifest(path, _manifest(models, stage, skipped), entry, tmp_path)
        written = json.loads(path.read_text())
        assert set(written) == keys and set(written["models"][0]) == (PRUNED if stage == "prune" else TRANSFORMED)
        assert read_finetune_manifest(path, stage, entry, tmp_path).models == models


def test_metrics_are_per_variant_means_of_the_models_that_finished() -> None:
    pruned = _manifest([_pruned(0, 0.6), _pruned(1, 0.8), _pruned(2, None)], "prune", [])
    figures = pruned.metrics_summary()["sa_generalized_9_pruned"]
    assert list(figures) == ["acc_after_pruning", "test_acc", "seeds"] and figures["seeds"] == 2
    assert math.isclose(figures["test_acc"], 0.7) and math.isclose(figures["acc_after_pruning"], 0.4)
    transformed = _manifest([_transformed(0, 0.4), _transformed(1, 0.6)], "transform", None).metrics_summary()
    assert transformed == {"t_resnet18": {"test_acc_step0": 0.3, "test_acc": 0.5, "seeds": 2}}
