"""The analysis stage against real MLflow stores: runs built by hand, named by real manifests, fetched by id.

A study of tiny models (hidden 8, 2 layers, 8x8 images): quadratic 9 heads x 2 seeds, generalized 9 heads (one seed
finished, one whose run MLflow does not have), learned 9 heads, a learned 2-head variant the paper does not have, a
failed ResNet18 without artifacts, and a pruned generalized model in a prune manifest; the paper's quadratic 16 heads
is not run. The local checkpoint folders the manifests name are deleted before the analysis runs: everything must
come through MLflow.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest
import torch
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis.palette import variant_style
from analysis.runs import RUN_COLOUR_TAG
from analysis.table import BEST_LABEL, TEST_SELECTED_LABEL, VAL_SELECTED_LABEL
from pipeline.config import PAPER_VARIANTS, ModelConfig, VariantConfig
from pipeline.finetune.manifest import FineTuneManifest, write_finetune_manifest
from pipeline.finetune.prune import PrunedModel
from pipeline.measure.counting import count_parameters
from pipeline.models import build_model
from pipeline.sweep.manifest import TrialRecord, TuneManifest, write_tune_manifest
from pipeline.trial.checkpoint import head_snapshot, save_model_checkpoint
from pipeline.trial.locality import measure_locality

if TYPE_CHECKING:
    from conftest import MlflowServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EPOCHS = 3
IMAGE = (3, 8, 8)


VARIANTS = {
    **PAPER_VARIANTS,
    "sa_learned_heads2": VariantConfig(arch="sa", encoding="learned", heads=2),
    "sa_gpsa_9": VariantConfig(arch="sa", encoding="gpsa", heads=9),  # beyond the paper: ConViT's gated heads
}


def _config(variant: str) -> ModelConfig:
    return VARIANTS[variant].apply(ModelConfig(hidden=8, layers=2, ffn=8, learned_dim=4, resnet_width=4))


def _model(variant: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = _config(variant)
    return build_model(cfg, image_size=IMAGE[1], in_channels=IMAGE[0], num_classes=10), cfg


def _checkpoint(directory: Path, variant: str, seed: int, prune: list[list[int]] | None = None) -> torch.nn.Module:
    """A checkpoint folder as a trial leaves it: weights and, per epoch, head centres and every head's locality."""
    model, cfg = _model(variant, seed)
    history, locality = [], []
    images = torch.randn(4, *IMAGE, generator=torch.Generator().manual_seed(seed))
    if prune is not None:
        model.prune_heads(prune)
    for epoch in range(EPOCHS + 1):
        if (per_layer := measure_locality(model, images)) is not None:
            locality.append({"epoch": epoch, "layers": per_layer})
        snapshot = head_snapshot(model, epoch)
        if snapshot is not None:
            history.append(snapshot)
            with torch.no_grad():
                for layer in model.layers:
                    layer.attention.encoding.centres.mul_(1.3)
    save_model_checkpoint(directory, model, cfg, image_shape=IMAGE, num_classes=10)
    if history:
        (directory / "head_history.json").write_text(json.dumps(history))
    if locality:
        (directory / "locality_history.json").write_text(json.dumps(locality))
    return model


def _acc(seed: int, epoch: int, bump: float = 0.0) -> float:
    return 0.3 + 0.1 * epoch + 0.05 * seed + bump


def build_study(tmp_path: Path, uri: str, experiment: str) -> dict:
    """MLflow runs + tune and prune manifests in ``tmp_path``; returns what the analysis must find."""
    client = MlflowClient(uri)
    location = (tmp_path / "mlartifacts").as_uri() if uri.startswith("sqlite") else None
    experiment_id = client.create_experiment(experiment, artifact_location=location)
    parent = client.create_run(experiment_id, run_name="sweep").info.run_id
    ray_dir = tmp_path / "ray"
    trials, expected = [], {"params": {}, "final": {}}
    plan = [
        ("sa_quadratic_9", 0, "finished"),
        ("sa_quadratic_9", 1, "finished"),
        ("sa_generalized_9", 0, "finished"),
        ("sa_learned_9", 0, "finished"),
        ("sa_learned_heads2", 0, "finished"),
        ("sa_gpsa_9", 0, "finished"),
        ("resnet18", 0, "error"),
    ]
    for variant, seed, status in plan:
        tags = {"mlflow.parentRunId": parent, "variant": variant, "seed": str(seed), "device": "cpu"}
        run_id = client.create_run(experiment_id, run_name=f"{variant}-seed{seed}", tags=tags).info.run_id
        client.log_param(run_id, "train.epochs", str(EPOCHS))
        for key, value in _config(variant).model_dump().items():  # as the sweep logs a trial's model config
            client.log_param(run_id, f"model.{key}", str(value))
        epochs = EPOCHS if status == "finished" else 1
        metrics = [Metric("test_acc", _acc(seed, e), 0, e) for e in range(1, epochs + 1)]
        metrics += [Metric("train_loss", 2.0 / e, 0, e) for e in range(1, epochs + 1)]
        if variant == "sa_learned_heads2":  # trained with a validation set: its best epoch on validation is epoch 2
            metrics += [Metric("val_acc", acc, 0, e) for e, acc in enumerate([0.5, 0.9, 0.6], start=1)]
        client.log_batch(run_id, metrics=metrics)
        checkpoint = ray_dir / f"{variant}-{seed}" / "checkpoint_000002"
        if status == "finished":
            model = _checkpoint(checkpoint, variant, seed)
            client.log_artifacts(run_id, str(checkpoint), artifact_path="checkpoint")
            expected["params"][variant] = count_parameters(model)
        client.set_terminated(run_id, "FINISHED" if status == "finished" else "FAILED")
        trials.append(
            TrialRecord(
                f"t{len(trials)}",
                run_id,
                f"{variant}-seed{seed}",
                variant,
                seed,
                status,
                epochs,
                {"test_acc": _acc(seed, epochs)},
                str(checkpoint),
                str(checkpoint / "head_history.json"),
                {"checkpoint": f"runs:/{run_id}/checkpoint"},
            )
        )
    # A run the manifest names that MLflow does not have (e.g. a store restored from an older backup).
    trials.append(
        TrialRecord(
            "tx",
            "0" * 32,
            "sa_generalized_9-seed1",
            "sa_generalized_9",
            1,
            "finished",
            EPOCHS,
            {"test_acc": 0.9},
            str(ray_dir / "gone"),
            None,
            {},
        )
    )
    tune = TuneManifest("hash", "tune-hash", str(ray_dir), "test_acc", "max", uri, experiment_id, parent, trials)
    write_tune_manifest(tmp_path / "results/tune/manifest.json", tune, tmp_path)

    source = next(t for t in trials if t.variant == "sa_generalized_9" and t.seed == 0)
    prune_parent = client.create_run(experiment_id, run_name="prune").info.run_id
    run_id = client.create_run(
        experiment_id, run_name="sa_generalized_9-seed0-pruned", tags={"mlflow.parentRunId": prune_parent}
    ).info.run_id
    client.log_batch(run_id, metrics=[Metric("test_acc", _acc(0, e, 0.01), 0, e) for e in range(0, 3)])
    pruned_dir = ray_dir / "pruned" / "checkpoint_000001"
    keep = [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6, 7]]  # heads 7, 8 of layer 1 and 8 of layer 2 cut
    pruned_model = _checkpoint(pruned_dir, "sa_generalized_9", 0, prune=keep)
    client.log_artifacts(run_id, str(pruned_dir), artifact_path="checkpoint")
    client.set_terminated(run_id, "FINISHED")
    decisions = [
        [{"layer": layer, "head": head, "pruned": head not in keep[layer]} for head in range(9)] for layer in range(2)
    ]
    pruned = PrunedModel(
        source.run_id,
        source.trial_id,
        "sa_generalized_9",
        0,
        run_id,
        "pruned",
        "finished",
        2,
        [2, 1],
        [7, 8],
        1,
        1,
        {"paper": 1, "full": 1},
        {"paper": 1, "full": 1},
        0.6,
        0.31,
        0.51,
        str(pruned_dir),
        str(pruned_dir),
        decisions,
    )
    prune = FineTuneManifest(
        "prune-hash", str(ray_dir), "tune-hash", uri, experiment_id, prune_parent, {}, [pruned], [], stage="prune"
    )
    write_finetune_manifest(tmp_path / "results/prune/manifest.json", prune, PrunedModel, tmp_path)
    expected["params"]["sa_generalized_9_pruned"] = count_parameters(pruned_model)
    shutil.rmtree(ray_dir)  # reading a manifest's local checkpoint path would now fail
    return expected


def _project(tmp_path: Path) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def _analysis_runs(uri: str, experiment_id: str) -> list:
    return MlflowClient(uri).search_runs([experiment_id], "tags.`analysis.role` = 'analysis'")


def test_analysis_stage_on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from stages.analyze import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    expected = build_study(tmp_path, uri, "it-analysis")
    monkeypatch.chdir(_project(tmp_path))
    with caplog.at_level(logging.INFO):
        assert main([]) == 0

    table = pd.read_csv(tmp_path / "results/tables/accuracy.csv").set_index("variant")
    quad = table.loc["sa_quadratic_9"]
    finals = pd.Series([_acc(0, EPOCHS), _acc(1, EPOCHS)])
    assert quad["n"] == 2 and quad["test_acc_mean"] == pytest.approx(finals.mean())
    assert quad["test_acc_std"] == pytest.approx(finals.std(ddof=1))  # two seeds: mean ± std
    assert quad["params"] == expected["params"]["sa_quadratic_9"] and quad["flops_paper"] > 0
    assert table.loc["sa_learned_9", "test_acc_mean"] == pytest.approx(_acc(0, EPOCHS))
    assert table.loc["resnet18", "note"] == "all seeds failed"
    assert "sa_quadratic_16" not in table.index  # the paper's list decides no row: it was not run
    other = table.loc["sa_learned_heads2"]  # a variant the paper does not have: a row like any other
    assert other["model"] == "SA learned, 2 heads" and other["test_acc_mean"] == pytest.approx(_acc(0, EPOCHS))
    assert not other["in_paper"] and pd.isna(other["paper_acc"]) and pd.isna(other["paper_params"])
    generalized = table.loc["sa_generalized_9"]
    assert generalized["n"] == 1 and "1 of 2 runs left out (missing)" in generalized["note"]
    assert generalized["paper_acc"] == 0.934 and generalized["model"] == "SA quadratic generalized"
    pruned = table.loc["sa_generalized_9_pruned"]
    assert pruned["test_acc_mean"] == pytest.approx(_acc(0, 2, 0.01))
    assert pruned["params"] == expected["params"]["sa_generalized_9_pruned"] < expected["params"]["sa_generalized_9"]
    markdown = (tmp_path / "results/tables/accuracy.md").read_text()
    assert "± 3.54 (n=2)" in markdown  # std of 0.65 and 0.70 in %
    assert "| SA learned, 2 heads" in markdown and "not in the paper" in markdown
    # One variant has validation metrics: its best epoch is selected on them, the authors' column kept and labelled.
    assert other["val_selected_test_acc_mean"] == pytest.approx(_acc(0, 2)) and other["val_selected_n"] == 1
    assert other["best_test_acc_mean"] == pytest.approx(_acc(0, EPOCHS)) and quad["val_selected_n"] == 0
    header = [cell.strip() for cell in markdown.splitlines()[2].split("|")]
    assert header.index(TEST_SELECTED_LABEL) == header.index(VAL_SELECTED_LABEL) + 1 and BEST_LABEL not in header
    csv_text = (tmp_path / "results/tables/accuracy.csv").read_text()
    assert f",{expected['params']['sa_quadratic_9']}," in csv_text  # integers written as integers

    runs = pd.read_csv(tmp_path / "results/tables/runs.csv")
    missing = runs[runs["status"] == "missing"]
    assert len(missing) == 1 and "not found" in missing["reason"].iloc[0]
    failed = runs[runs["variant"] == "resnet18"]
    assert (
        "trial error" in failed["reason"].iloc[0] and "no checkpoint/checkpoint.pt artifact" in failed["reason"].iloc[0]
    )

    curves = pd.read_csv(tmp_path / "results/plots/accuracy.csv")
    assert list(curves.columns) == ["variant", "model", "colour", "seed", "epoch", "test_acc"]
    pruned_curve = curves[curves["variant"] == "sa_generalized_9_pruned"].sort_values("epoch")
    assert pruned_curve["epoch"].tolist() == [EPOCHS, EPOCHS + 1, EPOCHS + 2]  # after its source's last epoch
    assert set(curves["variant"]) == {
        "sa_quadratic_9",
        "sa_generalized_9",
        "sa_learned_9",
        "sa_learned_heads2",
        "sa_gpsa_9",
        "sa_generalized_9_pruned",
    }
    assert curves.groupby("variant")["colour"].nunique().eq(1).all()

    locality = pd.read_csv(tmp_path / "results/plots/locality.csv")
    assert list(locality.columns) == [
        "variant",
        "model",
        "colour",
        "seed",
        "epoch",
        "layer",
        "mean_distance",
        "entropy",
        "peak_probability",
    ]
    assert sorted(locality[locality["variant"] == "sa_learned_9"]["epoch"].unique()) == list(range(EPOCHS + 1))
    assert sorted(locality["layer"].unique()) == [1, 2]
    assert locality[locality["variant"] == "sa_generalized_9_pruned"]["epoch"].min() == EPOCHS

    heads = pd.read_csv(tmp_path / "results/tables/heads.csv")
    assert {"variant", "seed", "run_id", "layer", "head", "mean_distance", "entropy", "peak_probability"} <= set(
        heads.columns
    )
    per_run = heads.groupby(["variant", "seed"]).size()
    assert per_run[("sa_quadratic_9", 1)] == 18 and per_run[("sa_generalized_9_pruned", 0)] == 15
    assert heads["layer"].min() == 1 and heads["head"].min() == 1  # numbered as in the figures
    conv_like = pd.read_csv(tmp_path / "results/tables/conv_like_heads.csv")
    assert set(conv_like["variant"]) == set(heads["variant"])
    assert conv_like.set_index(["variant", "layer"]).loc[("sa_learned_heads2", 1), "heads"] == 2

    metrics = json.loads((tmp_path / "results/analysis/metrics.json").read_text())
    assert "sa_quadratic_16" not in metrics
    # Accuracies are the tune and prune stages' metrics: here only sizes and the finding's derived numbers.
    sizes = {"params": quad["params"], "flops_paper": quad["flops_paper"], "flops_full": quad["flops_full"]}
    finding = {"gap_to_resnet18_points", "layer1_displacement", "layer1_heads_at_distinct_shifts"}
    assert set(metrics["sa_quadratic_9"]) == set(sizes) | finding
    assert {key: metrics["sa_quadratic_9"][key] for key in sizes} == sizes
    assert metrics["sa_learned_heads2"]["params"] == other["params"]

    names = sorted(p.name for p in (tmp_path / "results/figures").glob("*.png"))
    per_variant = {
        "sa_quadratic_9": "contours",
        "sa_generalized_9": "contours",
        "sa_generalized_9_pruned": "contours",
        "sa_learned_9": "attention",
        "sa_learned_heads2": "attention",
        "sa_gpsa_9": "contours",  # its positional part's Gaussians
    }
    assert names == sorted(
        ["fig4_accuracy.png", "locality_distance.png", "fig2_trajectories.png", "theorem1_error_vs_alpha.png"]
        + ["trajectories_sa_generalized_9.png", "trajectories_sa_gpsa_9.png"]  # every kind with centres; Fig. 2 too
        + ["beyond_nonlocality.png", "beyond_gates_sa_gpsa_9.png"]  # Beyond the paper: GPSA beside SA quadratic
        + [f"{kind}_{variant}.png" for variant, kind in per_variant.items()]
        + [f"conv_likeness_{variant}.png" for variant in per_variant]
    )
    report = (tmp_path / "results/report.md").read_text()
    setting = report.splitlines()[0]
    assert setting.startswith("Setting: dataset: digits; image size: 8x8; tokens: 4x4 of 2x2 px; epochs: 3")
    assert "; device: cpu; seeds: 0, 1" in setting and "smoke" not in setting
    assert "smaller than the paper's setting: dataset digits (paper: cifar10)" in setting
    # The report opens with the claims: one row per claim, each verdict one of the rules' three, none worded by hand.
    assert report.split("\n## ")[1].startswith("Claims and verdicts")
    claims = pd.read_csv(tmp_path / "results/tables/claims.csv").set_index("claim")
    assert len(claims) == 9 and set(claims["by"]) == {"paper", "ours"}
    assert set(claims["verdict"].str.strip("*")) <= {"holds", "does not hold", "cannot tell at this scale"}
    assert claims.filter(like="Theorem 1", axis=0)["verdict"].iloc[0] == "**holds**"
    assert "no finished run of resnet18" in claims.filter(like="as accurate as ResNet18", axis=0)["test"].iloc[0]
    compute = pd.read_csv(tmp_path / "results/tables/compute.csv")
    assert len(compute) == len(runs) and {"device_s", "train_s", "run_id"} <= set(compute.columns)
    assert "## Compute" in report

    # The finding's numbers, from the runs' own head histories: the builder scales every centre by 1.3 per epoch, so
    # after 3 epochs each head moved 1.3**3 - 1 times its initial distance from the query.
    motion = pd.read_csv(tmp_path / "results/tables/head_motion.csv")
    assert set(motion["variant"]) == {"sa_quadratic_9", "sa_generalized_9", "sa_gpsa_9"}  # centres, from init
    assert sorted(motion["epoch"].unique()) == list(range(EPOCHS + 1)) and sorted(motion["layer"].unique()) == [1, 2]
    end = motion[motion["epoch"] == EPOCHS].set_index(["variant", "seed", "layer"])
    init = motion[motion["epoch"] == 0].set_index(["variant", "seed", "layer"])
    assert end["displacement"].to_numpy() == pytest.approx((1.3**3 - 1) * init["centre_norm"].to_numpy())
    finding = report.split("## The paper's finding, measured")[1].split("\n## ")[0]
    first = end.loc[("sa_quadratic_9", 0, 1)]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in finding.splitlines() if line[:1] == "|"]
    (row,) = [r for r in rows if r[:3] == ["SA quadratic", "0", "1"]]
    assert row[3] == f"{first['displacement']:.2f}"
    assert row[4] == f"{init.loc[('sa_quadratic_9', 0, 1), 'centre_norm']:.2f} -> {first['centre_norm']:.2f}"
    assert "Accuracy gap to ResNet18: not measured, ResNet18 has no completed run." in finding
    assert "](figures/fig2_trajectories.png)" in finding  # Fig. 2 sits beside its numbers
    assert f"Layer 1: the heads moved {first['displacement']:.2f} tokens" in finding
    assert f"mass on {first['heads_at_distinct_shifts']} distinct shifts near the query" in finding  # counts
    firsts = end.xs(1, level="layer").loc["sa_quadratic_9"]  # both seeds' first layer: dvc metrics has their mean
    assert metrics["sa_quadratic_9"]["layer1_displacement"] == pytest.approx(firsts["displacement"].mean(), abs=1e-4)
    assert metrics["sa_quadratic_9"]["layer1_heads_at_distinct_shifts"] == firsts["heads_at_distinct_shifts"].mean()
    assert metrics["sa_quadratic_9"]["gap_to_resnet18_points"] is None  # ResNet18 failed
    assert "layer1_displacement" not in metrics["sa_learned_9"]
    for name in names:
        assert (tmp_path / "results/figures" / name).read_bytes()[:8] == PNG_MAGIC
        assert f"](figures/{name})" in report  # each figure appears, under its title, with its sentence
    assert "The paper's models not run in this study: SA quadratic, 16 heads." in report
    assert "The prune stage cut 3 heads" in report and "Fig. 7: head contours of SA quadratic generalized" in report
    assert "## Convolution-like heads per layer" in report and "| SA learned, 2 heads" in report
    assert "Quoted from the literature" in report and "ConvMixer-256/8, kernel 5, patch 2 (quoted)" in report
    beyond = report.split("## Beyond the paper")[1].split("\n## ")[0]
    # _acc(0, 3); these runs log no train.lr, so no "trained at lr" (test_beyond_paper.py checks that clause)
    assert "**SA GPSA, 9 heads** (sa_gpsa_9): final test accuracy 60.0%" in beyond
    assert "**SA quadratic** (sa_quadratic_9)" in beyond  # the position-only reference beside it
    assert "mean per layer 1..2: 0.73, 0.73 (init 0.73" in beyond  # the builder trains no gate
    assert "](figures/beyond_gates_sa_gpsa_9.png)" in beyond and "](figures/beyond_nonlocality.png)" in beyond
    gates = pd.read_csv(tmp_path / "results/tables/beyond_paper_gates.csv")
    assert len(gates) == 18 and gates["gate"].to_numpy() == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert "resnet18 seed 0: trial error" in caplog.text

    experiment_id = json.loads((tmp_path / "results/tune/manifest.json").read_text())["experiment_id"]
    (analysis,) = _analysis_runs(uri, experiment_id)
    assert analysis.data.tags["analysis.tune_parent_run_id"] and analysis.data.tags["analysis.prune_parent_run_id"]
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(analysis.info.run_id, "figures")}
    assert "figures/fig4_accuracy.png" in artifacts
    # Each trial's run drawn in the MLflow UI in its variant's figure colour; a colour picked in the UI stays.
    client = MlflowClient(uri)
    manifest = json.loads((tmp_path / "results/tune/manifest.json").read_text())
    trials = [t for t in manifest["trials"] if t["status"] == "finished" and t["run_id"] != "0" * 32]  # in MLflow
    for trial in trials:
        assert client.get_run(trial["run_id"]).data.tags[RUN_COLOUR_TAG] == variant_style(trial["variant"]).colour
    client.set_tag(trials[0]["run_id"], RUN_COLOUR_TAG, "#123456")
    assert main([]) == 0  # same inputs: the analysis run is reused, not duplicated
    assert [r.info.run_id for r in _analysis_runs(uri, experiment_id)] == [analysis.info.run_id]
    assert client.get_run(trials[0]["run_id"]).data.tags[RUN_COLOUR_TAG] == "#123456"


def test_without_prune_manifest_the_pruned_model_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.analyze import main

    build_study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "it-analysis-noprune")
    (tmp_path / "results/prune/manifest.json").unlink()
    stale = tmp_path / "results/tables/an_earlier_runs_table.csv"  # outputs persist (dvc.yaml): the stage clears them
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("variant\nsa_generalized_9_pruned\n")
    monkeypatch.chdir(_project(tmp_path))
    assert main(["--no-mlflow"]) == 0
    assert not stale.exists()
    table = pd.read_csv(tmp_path / "results/tables/accuracy.csv").set_index("variant")
    assert "sa_generalized_9_pruned" not in table.index
    report = (tmp_path / "results/report.md").read_text()
    assert "No heads are marked: no prune manifest yet." in report and "no prune manifest yet: the pruned" in report


def test_missing_tune_manifest_is_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    from stages.analyze import main

    monkeypatch.chdir(_project(tmp_path))
    assert main([]) == 2
    assert not (tmp_path / "results").exists()


def test_analysis_over_an_mlflow_server(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    from analysis.runs import load_study
    from pipeline.finetune.manifest import read_finetune_manifest
    from pipeline.sweep.manifest import read_tune_manifest

    expected = build_study(tmp_path, mlflow_server.uri, f"it-analysis-server-{tmp_path.name}")
    tune = read_tune_manifest(tmp_path / "results/tune/manifest.json", tmp_path)
    prune = read_finetune_manifest(tmp_path / "results/prune/manifest.json", "prune", PrunedModel, tmp_path)
    study = load_study(tune, prune, tmp_path / "cache")
    frame = study.frame().set_index(["variant", "seed"])
    assert frame.loc[("sa_quadratic_9", 1), "params"] == expected["params"]["sa_quadratic_9"]
    assert frame.loc[("sa_generalized_9_pruned", 0), "params"] == expected["params"]["sa_generalized_9_pruned"]
    downloaded = study.by_variant("sa_quadratic_9")[0].checkpoint_dir
    assert downloaded.is_relative_to(tmp_path / "cache") and (downloaded / "head_history.json").is_file()


@pytest.mark.parametrize("history_seeds", [None, 1])
def test_a_study_reads_one_checkpoint_per_architecture_and_its_first_seeds_histories(
    mlflow_server: MlflowServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    history_seeds: int | None,
) -> None:
    """``benchmarks.analysis_at_scale`` at its smallest size with seeds (the default study's six variants twice, 2
    epochs) through a real server: per architecture one ``checkpoint.pt`` (seed 0's: its model gives both seeds' counts
    and structure), per run up to its variant's ``HISTORY_SEEDS``-th the history files its model has (the locality
    history of an attention model, the head history of Gaussian heads: at most 2), the whole study one search and one
    bulk history request per metric the runs logged (per hundred runs). With ``HISTORY_SEEDS`` at 1, seed 1 of each
    variant costs no request of its own."""
    import analysis.runs
    from benchmarks import analysis_at_scale

    if history_seeds is not None:
        monkeypatch.setattr(analysis.runs, "HISTORY_SEEDS", history_seeds)
    seeds_read = 2 if history_seeds is None else history_seeds
    assert analysis_at_scale.main(["--runs", "12", "--epochs", "2", "--tracking-uri", mlflow_server.uri]) == 0
    out = capsys.readouterr().out
    requests = ast.literal_eval(out.split("load_study requests: ", 1)[1].splitlines()[0])
    assert requests.pop("server GET server-info", 1) == 1  # MLflow's client asks once what the server supports
    attention, gaussian = 5, 4  # variants with a locality history (not ResNet18), with a head history (not learned)
    files = {
        "checkpoint.pt": 6,
        "locality_history.json": attention * seeds_read,
        "head_history.json": gaussian * seeds_read,
    }
    assert requests == {f"server GET artifact checkpoint/{name}": n for name, n in files.items()} | {
        "server GET /health": 1,  # the stage's check that the manifest's server answers
        "server POST runs/search": 1,
        "server GET metrics/get-history-bulk": 3,  # test_acc, train_loss, epoch_time_s (no validation set: no val_acc)
    }
    assert (files["locality_history.json"] + files["head_history.json"]) / 12 < 2
    assert "analyze over 12 runs: " in out
