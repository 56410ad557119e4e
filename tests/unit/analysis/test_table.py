"""The accuracy table shows exactly its inputs, says why a row is empty, and never raises on partial input."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.table import (
    BEST_LABEL,
    DISPLAY_COLUMNS,
    FLOPS_FULL_LABEL,
    FLOPS_PAPER_LABEL,
    accuracy_table,
    format_table,
    metrics_summary,
    to_latex,
    to_markdown,
    write_metrics,
    write_table,
)
from pipeline.measure.reference import PAPER_FIGURES

SETTING = {"dataset": "digits", "image_size": 16, "epochs": 4, "widths": {"hidden": 32, "ffn": 64}}


def _run(variant: str, seed: int, acc: float, best: float, status: str = "finished", epochs: int = 4) -> dict:
    return {
        "variant": variant, "seed": seed, "status": status, "test_acc": acc, "best_test_acc": best,
        "epochs": epochs, "params": 1234, "flops_paper": 5e9, "flops_full": 7e9,
    }  # fmt: skip


RUNS = pd.DataFrame(
    [
        _run("sa_quadratic_9", 0, 0.80, 0.85),
        _run("sa_quadratic_9", 1, 0.90, 0.91),
        _run("sa_quadratic_9", 2, 0.70, 0.75),
        _run("sa_quadratic_9", 3, float("nan"), float("nan"), status="error", epochs=1),
        _run("resnet18", 0, 0.95, 0.96),
        _run("sa_learned_9", 0, float("nan"), float("nan"), status="error"),
        _run("sa_learned_9", 1, float("nan"), float("nan"), status="error"),
    ]
)


def _row(table: pd.DataFrame, variant: str) -> dict:
    return table.set_index("variant").loc[variant].to_dict()


def test_rows_follow_the_papers_order_with_its_labels_and_figures() -> None:
    table = accuracy_table(RUNS, expected_epochs=4)
    assert table["variant"].tolist() == list(PAPER_FIGURES)
    assert table["model"].tolist() == [f.label for f in PAPER_FIGURES.values()]
    assert _row(table, "sa_quadratic_9")["paper_acc"] == PAPER_FIGURES["sa_quadratic_9"].accuracy
    assert _row(table, "sa_quadratic_16")["paper_flops"] == PAPER_FIGURES["sa_quadratic_16"].flops
    assert math.isnan(_row(table, "sa_quadratic_16")["paper_acc"])  # the paper gives none


def test_seeds_aggregate_as_mean_std_n_of_the_finished_runs() -> None:
    row = _row(accuracy_table(RUNS, expected_epochs=4), "sa_quadratic_9")
    assert row["n"] == 3
    assert row["test_acc_mean"] == pytest.approx(0.80)
    assert row["test_acc_std"] == pytest.approx(np.std([0.8, 0.9, 0.7], ddof=1))
    assert row["best_test_acc_mean"] == pytest.approx(np.mean([0.85, 0.91, 0.75]))
    assert (row["params"], row["flops_paper"], row["flops_full"]) == (1234, 5e9, 7e9)
    assert "1 of 4 runs left out (error)" in row["note"]
    shown = format_table(accuracy_table(RUNS)).set_index("model").loc["SA quadratic"]
    assert shown.iloc[0] == "80.00 ± 10.00 (n=3)"
    assert shown[BEST_LABEL] == "83.67 ± 8.08 (n=3)"
    assert shown["paper test acc %"] == "93.80"
    assert shown["params (ours / paper)"] == "1,234 / 12,086,844"
    assert shown[f"FLOPs, {FLOPS_PAPER_LABEL} (ours / paper)"] == "5G / 6.176G"
    assert shown[f"FLOPs, {FLOPS_FULL_LABEL} (ours)"] == "7G"


def test_single_seed_has_no_std_and_missing_rows_say_why() -> None:
    table = accuracy_table(RUNS, expected_epochs=4)
    resnet = _row(table, "resnet18")
    assert resnet["n"] == 1 and resnet["test_acc_mean"] == 0.95 and math.isnan(resnet["test_acc_std"])
    assert _row(table, "sa_learned_9")["note"] == "all seeds failed"
    assert _row(table, "sa_learned_9")["n"] == 0
    assert _row(table, "sa_generalized_9")["note"] == "not run"
    assert _row(table, "sa_generalized_9_pruned")["note"] == "pruned row: no prune manifest yet"
    shown = format_table(table).set_index("model")
    assert shown.loc["ResNet18"].iloc[0] == "95.00 (n=1)"
    assert shown.loc["SA learned"].iloc[0] == "–"


def test_runs_short_of_the_expected_epochs_are_left_out() -> None:
    runs = pd.DataFrame([_run("resnet18", 0, 0.5, 0.6, epochs=2), _run("resnet18", 1, 0.7, 0.8, epochs=4)])
    row = _row(accuracy_table(runs, expected_epochs=4), "resnet18")
    assert row["n"] == 1 and row["test_acc_mean"] == 0.7
    assert "fewer than 4 epochs" in row["note"]


@pytest.mark.parametrize(
    "runs",
    [
        None,
        pd.DataFrame(),
        pd.DataFrame({"variant": ["resnet18", "not_a_paper_model"], "test_acc": [0.9, 0.1]}),  # no status column
        pd.DataFrame({"variant": ["resnet18"], "status": [None], "test_acc": ["garbage"]}),
    ],
)
def test_partial_input_never_raises(runs: pd.DataFrame | None, tmp_path) -> None:
    table = accuracy_table(runs, expected_epochs=4)
    assert len(table) == len(PAPER_FIGURES) and (table["n"] == 0).all()
    write_table(table, SETTING, tmp_path / "accuracy")
    json.dumps(metrics_summary(runs), allow_nan=False)


def test_writers(tmp_path) -> None:
    table = accuracy_table(RUNS, expected_epochs=4)
    paths = write_table(table, SETTING, tmp_path / "tables" / "accuracy")
    md = paths[0].read_text(encoding="utf-8")
    first = md.splitlines()[0]
    assert first == "Setting: dataset: digits; image size: 16; epochs: 4; widths: hidden=32, ffn=64"
    assert md.count("\n| ") == len(PAPER_FIGURES) + 1  # header + one line per model
    assert FLOPS_PAPER_LABEL in md and FLOPS_FULL_LABEL in md and "selected on the test set" in md
    back = pd.read_csv(paths[1])
    assert back["test_acc_mean"].iloc[1] == pytest.approx(0.80)
    tex = paths[2].read_text(encoding="utf-8")
    assert r"\begin{tabular}" in tex and r"$\pm$" in tex and "93.80" in tex
    assert to_markdown(table, {}).startswith("Setting: not given")
    assert to_latex(table, SETTING).count(r" \\") == len(PAPER_FIGURES) + 1
    assert list(format_table(table).columns) == DISPLAY_COLUMNS


def test_metrics_summary_is_strict_json(tmp_path) -> None:
    summary = metrics_summary(RUNS, expected_epochs=4)
    assert summary["sa_quadratic_9"] == {
        "test_acc_mean": pytest.approx(0.8),
        "test_acc_std": pytest.approx(0.1),
        "n": 3,
        "params": 1234,
        "flops_paper": 5_000_000_000,
        "flops_full": 7_000_000_000,
    }
    assert summary["sa_learned_9"]["test_acc_mean"] is None
    path = write_metrics(summary, tmp_path / "metrics.json")
    assert json.loads(path.read_text())["resnet18"]["n"] == 1
