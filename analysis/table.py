"""The report's tables: accuracy and size of every variant (the paper's Figure 5 / Figure 9, ours beside theirs), the
convolution-like heads per layer, and the DVC metrics summary.

One row per variant the study ran (``analysis.variants``), in its order; the paper's numbers are a lookup beside the
rows of the models the paper has, and the other rows say "not in the paper". A variant whose runs all failed, are
missing or are short of epochs gets a row that says so instead of an error. Markdown is pandas' ``to_markdown``
(tabulate), LaTeX is ``Styler.to_latex`` (jinja2, booktabs rules); the CSVs keep the numbers, integers as integers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.noise import wilson_interval
from analysis.variants import Variant, describe_variants
from pipeline.measure.reference import QUOTED_BASELINES, QuotedBaseline
from pipeline.sweep.manifest import FINISHED  # a trial that trained all its epochs; other labels are no final result

RUN_COLUMNS = [
    "variant",
    "seed",
    "status",
    "test_acc",
    "best_test_acc",
    "val_selected_test_acc",
    "epochs",
    "params",
    "flops_paper",
    "flops_full",
]
INTEGER_COLUMNS = ["seed", "n", "epochs", "params", "paper_params", "flops_paper", "paper_flops", "flops_full"]

FLOPS_PAPER_LABEL = "paper convention: 2 x MACs of Linear/Conv"
FLOPS_FULL_LABEL = "full count"
BEST_LABEL = "best-epoch test acc % (selected on the test set, as the authors did)"
# With a validation set (``data.validation_fraction``) the best epoch is selected honestly, on validation accuracy, and
# the authors' protocol keeps its column beside it under this label.
VAL_SELECTED_LABEL = "best-epoch test acc % (epoch selected on validation)"
TEST_SELECTED_LABEL = "best-epoch test acc % (test-selected, as the authors)"
NOT_IN_PAPER = "not in the paper"

# Formatted column names, in order (numeric table columns are documented in ``accuracy_table``).
DISPLAY_COLUMNS = [
    "model",
    "final-epoch test acc % (mean ± std, n seeds) [binomial 95 % interval]",
    BEST_LABEL,
    "paper test acc %",
    "params (ours / paper)",
    f"FLOPs, {FLOPS_PAPER_LABEL} (ours / paper)",
    f"FLOPs, {FLOPS_FULL_LABEL} (ours)",
    "note",
]


def _complete_columns(runs: pd.DataFrame | None) -> pd.DataFrame:
    """A copy of ``runs`` with every expected column (missing ones are NaN): partial input never raises."""
    frame = pd.DataFrame(columns=RUN_COLUMNS) if runs is None else runs.copy()
    for column in RUN_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
    for column in RUN_COLUMNS[RUN_COLUMNS.index("test_acc") :]:  # every column after the run's labels is a number
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    frame["status"] = frame["status"].map(lambda s: s.lower() if isinstance(s, str) else "")  # NaN/None -> ""
    frame["variant"] = frame["variant"].astype(str)
    return frame


def as_integers(frame: pd.DataFrame, columns: Sequence[str] = INTEGER_COLUMNS) -> pd.DataFrame:
    """``frame`` with ``columns`` (those it has) as nullable integers, so a CSV writes ``12086844``, not
    ``12086844.0``, and an empty cell where a value is missing."""
    present = [c for c in columns if c in frame.columns]
    return frame.astype({c: "Int64" for c in present}) if present else frame


def _first(values: pd.Series) -> float:
    """The variant's size (identical over seeds), NaN when no run reported it."""
    values = values.dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def _mean(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else math.nan


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _variant_row(
    variant: Variant, runs: pd.DataFrame, expected_epochs: int | None, test_images: int | None
) -> dict[str, Any]:
    paper = variant.paper
    finished = runs[(runs["status"] == FINISHED) & runs["test_acc"].notna()]
    if expected_epochs is not None:
        short = finished["epochs"].notna() & (finished["epochs"] < expected_epochs)
        finished = finished[~short]
    else:
        short = pd.Series(dtype=bool)
    notes = []
    if runs.empty:
        notes.append("no run")
    elif finished.empty:
        notes.append("all seeds failed" if (runs["status"] == "error").all() else "no finished seed")
    left_out = len(runs) - len(finished)
    if left_out and not finished.empty:
        statuses = ", ".join(sorted({s or "unknown" for s in runs.loc[~runs.index.isin(finished.index), "status"]}))
        notes.append(f"{left_out} of {len(runs)} runs left out ({statuses})")
    if short.any():
        notes.append(f"{int(short.sum())} finished with fewer than {expected_epochs} epochs")
    mean = float(finished["test_acc"].mean()) if len(finished) else math.nan
    low, high = wilson_interval(mean, (test_images or 0) * len(finished))  # the seeds' answers pooled
    return {
        "variant": variant.name,
        "model": variant.label,
        "n": len(finished),
        "test_acc_mean": mean,
        "test_acc_std": _std(finished["test_acc"]),
        "test_acc_low": low,
        "test_acc_high": high,
        "best_test_acc_mean": float(finished["best_test_acc"].mean()) if len(finished) else math.nan,
        "best_test_acc_std": _std(finished["best_test_acc"].dropna()),
        "val_selected_test_acc_mean": _mean(finished["val_selected_test_acc"]),
        "val_selected_test_acc_std": _std(finished["val_selected_test_acc"].dropna()),
        "val_selected_n": int(finished["val_selected_test_acc"].notna().sum()),
        "in_paper": paper is not None,
        "paper_acc": math.nan if paper is None or paper.accuracy is None else paper.accuracy,
        "comparable": True,
        "params": _first(runs["params"]),
        "paper_params": math.nan if paper is None else float(paper.params),
        "flops_paper": _first(runs["flops_paper"]),
        "paper_flops": math.nan if paper is None or paper.flops is None else float(paper.flops),
        "flops_full": _first(runs["flops_full"]),
        "note": "; ".join(notes),
    }


def variants_of(runs: pd.DataFrame | None) -> list[Variant]:
    """The variants of ``runs`` when no better description is at hand: the paper's labels, else their names."""
    names = [] if runs is None or "variant" not in runs else list(dict.fromkeys(runs["variant"].astype(str)))
    return describe_variants({name: {} for name in names})


def accuracy_table(
    runs: pd.DataFrame | None,
    variants: Sequence[Variant] | None = None,
    expected_epochs: int | None = None,
    test_images: int | None = None,
) -> pd.DataFrame:
    """One row per variant (``variants``, default: every variant of ``runs``), in that order, from one row per run.

    ``runs`` columns (missing ones count as NaN): variant, seed, status (the sweep's label; only ``finished``
    runs with a test_acc count), test_acc (final epoch), best_test_acc (best over epochs: selected on the test set),
    val_selected_test_acc (test_acc at the epoch of best val_acc; NaN without a validation set), epochs (completed),
    params, flops_paper, flops_full. Runs with fewer than ``expected_epochs`` are left out.

    Returns columns: variant, model (display name), n, test_acc_mean, test_acc_std, best_test_acc_mean,
    best_test_acc_std, val_selected_test_acc_mean, val_selected_test_acc_std, val_selected_n (runs with validation
    metrics), in_paper, paper_acc, params, paper_params, flops_paper, paper_flops, flops_full, note; the
    paper's columns are NaN for a model the paper does not have (or a figure it does not give).
    """
    frame = _complete_columns(runs)
    variants = variants_of(frame) if variants is None else variants
    return pd.DataFrame(
        [_variant_row(v, frame[frame["variant"] == v.name], expected_epochs, test_images) for v in variants],
        columns=[
            "variant",
            "model",
            "n",
            "test_acc_mean",
            "test_acc_std",
            "test_acc_low",
            "test_acc_high",
            "best_test_acc_mean",
            "best_test_acc_std",
            "val_selected_test_acc_mean",
            "val_selected_test_acc_std",
            "val_selected_n",
            "in_paper",
            "paper_acc",
            "comparable",
            "params",
            "paper_params",
            "flops_paper",
            "paper_flops",
            "flops_full",
            "note",
        ],
    )


def mark_not_comparable(table: pd.DataFrame, variants: Sequence[str], note: str) -> pd.DataFrame:
    """``table`` with the rows of ``variants`` marked as another experiment than the paper's (e.g. a model pruned by
    another rule): their paper accuracy is dropped, never shown beside theirs, and ``note`` says why."""
    marked = table.copy()
    rows = marked["variant"].isin(list(variants))
    marked.loc[rows, "comparable"] = False
    marked.loc[rows, "paper_acc"] = math.nan
    marked.loc[rows, "note"] = marked.loc[rows, "note"].map(lambda old: "; ".join(filter(None, [old, note])))
    return marked


def describe_setting(setting: Mapping[str, Any]) -> str:
    """One line saying what was trained (dataset, image size, epochs, widths...): ours is rarely the paper's."""
    parts = [f"{key.replace('_', ' ')}: {_plain(value)}" for key, value in setting.items()]
    return "Setting: " + ("; ".join(parts) if parts else "not given")


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)


def _pct(mean: float, std: float = math.nan, n: int | None = None) -> str:
    if not math.isfinite(mean):
        return "–"
    text = f"{100 * mean:.2f}"
    if n is not None and n > 1:
        text += f" ± {100 * std:.2f}" if math.isfinite(std) else ""
    return text + (f" (n={n})" if n is not None else "")


def _interval(low: float, high: float) -> str:
    return f" [{100 * low:.1f}, {100 * high:.1f}]" if math.isfinite(low) and math.isfinite(high) else ""


def _exact(value: float) -> str:
    """Parameter counts in full: ours and the paper's must be comparable digit by digit."""
    return f"{int(value):,}" if math.isfinite(value) else "–"


def _si(value: float) -> str:
    """FLOPs with a unit prefix, 4 significant digits: smoke-scale models have MFLOPs, the paper's GFLOPs."""
    if not math.isfinite(value):
        return "–"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{prefix}"
    return f"{value:.4g}"


def _beside(ours: str, paper: str, in_paper: bool) -> str:
    return f"{ours} / {paper}" if in_paper else ours


def has_validation(table: pd.DataFrame) -> bool:
    """Whether any variant's runs were trained with a validation set (so a best epoch was selected on it)."""
    return "val_selected_n" in table and bool((table["val_selected_n"].fillna(0) > 0).any())


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """The numeric table as display strings (accuracies in %, params exact, FLOPs with k/M/G), the paper's figures
    beside ours for the paper's models and "not in the paper" for the others; a missing number is "–".

    When runs had a validation set, the best epoch is the one of highest validation accuracy (``VAL_SELECTED_LABEL``)
    and the authors' test-selected best keeps its column beside it (``TEST_SELECTED_LABEL``); without one the columns
    are ``DISPLAY_COLUMNS``."""
    validation = has_validation(table)
    rows = []
    for row in table.to_dict("records"):
        n, in_paper = int(row["n"]), bool(row["in_paper"])
        paper_acc = _pct(row["paper_acc"]) if math.isfinite(row["paper_acc"]) else "not given"
        if not row.get("comparable", True):
            paper_acc = "not comparable (note)"
        interval = _interval(row.get("test_acc_low", math.nan), row.get("test_acc_high", math.nan))
        rows.append(
            [
                row["model"],
                _pct(row["test_acc_mean"], row["test_acc_std"], n) + interval if n else "–",
                *([_val_selected(row)] if validation else []),
                _pct(row["best_test_acc_mean"], row["best_test_acc_std"], n) if n else "–",
                paper_acc if in_paper else NOT_IN_PAPER,
                _beside(_exact(row["params"]), _exact(row["paper_params"]), in_paper),
                _beside(_si(row["flops_paper"]), _si(row["paper_flops"]), in_paper),
                _si(row["flops_full"]),
                row["note"],
            ]
        )
    if not validation:
        return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)
    best = DISPLAY_COLUMNS.index(BEST_LABEL)
    return pd.DataFrame(
        rows, columns=[*DISPLAY_COLUMNS[:best], VAL_SELECTED_LABEL, TEST_SELECTED_LABEL, *DISPLAY_COLUMNS[best + 1 :]]
    )


def _val_selected(row: Mapping[str, Any]) -> str:
    n = int(row.get("val_selected_n", 0) or 0)
    return _pct(row["val_selected_test_acc_mean"], row["val_selected_test_acc_std"], n) if n else "–"


def to_markdown(table: pd.DataFrame, setting: Mapping[str, Any]) -> str:
    """The setting line first, then the formatted table (GitHub markdown)."""
    return f"{describe_setting(setting)}\n\n{format_table(table).to_markdown(index=False, disable_numparse=True)}\n"


def _latex(shown: pd.DataFrame, caption: str) -> str:
    """A booktabs tabular of display strings, every cell and header escaped for LaTeX."""
    styler = shown.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    caption = pd.DataFrame([[caption]]).style.format(escape="latex").to_string(delimiter="\t").split("\t")[-1].strip()
    return styler.to_latex(
        hrules=True, caption=caption, position="t", position_float="centering", column_format="l" * shown.shape[1]
    )


def to_latex(table: pd.DataFrame, setting: Mapping[str, Any]) -> str:
    """A booktabs table with the setting as a comment and as the caption (``Styler.to_latex``)."""
    return f"% {describe_setting(setting)}\n{_latex(format_table(table), describe_setting(setting))}"


def write_table(table: pd.DataFrame, setting: Mapping[str, Any], stem: Path | str) -> list[Path]:
    """Write ``stem``.md (formatted, setting first), .csv (numeric, for re-use) and .tex; returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_suffix(".tex")]
    paths[0].write_text(to_markdown(table, setting), encoding="utf-8")
    as_integers(table).to_csv(paths[1], index=False)
    paths[2].write_text(to_latex(table, setting), encoding="utf-8")
    return paths


def conv_like_table(heads: pd.DataFrame, variants: Sequence[Variant]) -> pd.DataFrame:
    """Per variant and layer, how many heads are convolution-like (``analysis.gaussian_locality.CONV_LIKE_RULE``):
    variant, model, layer, heads (in the layer), conv_like (mean over seeds), n (seeds).

    ``heads``: one row per run, layer and head with columns variant, seed, layer, head, conv_like (bool).
    """
    columns = ["variant", "model", "layer", "heads", "conv_like", "n"]
    if heads.empty:
        return pd.DataFrame(columns=columns)
    per_run = (
        heads.assign(conv_like=heads["conv_like"].astype(bool))
        .groupby(["variant", "seed", "layer"], as_index=False)
        .agg(heads=("head", "size"), conv_like=("conv_like", "sum"))
    )
    counts = per_run.groupby(["variant", "layer"], as_index=False).agg(
        heads=("heads", "max"), conv_like=("conv_like", "mean"), n=("seed", "nunique")
    )
    labels = {v.name: v.label for v in variants}
    rows = [counts[counts["variant"] == v.name].assign(model=labels[v.name]) for v in variants]
    rows = [r for r in rows if len(r)]
    return pd.concat(rows, ignore_index=True)[columns] if rows else pd.DataFrame(columns=columns)


def format_conv_like(table: pd.DataFrame) -> pd.DataFrame:
    """One row per variant, one column per layer: ``k / H`` convolution-like heads of the layer's H (a mean over
    seeds when several, with n)."""
    if table.empty:
        return pd.DataFrame(columns=["model"])

    def cell(row: pd.Series) -> str:
        count = f"{row['conv_like']:.0f}" if float(row["conv_like"]).is_integer() else f"{row['conv_like']:.1f}"
        return f"{count} / {int(row['heads'])}" + (f" (n={int(row['n'])})" if row["n"] > 1 else "")

    shown = table.assign(cell=table.apply(cell, axis=1), layer=table["layer"].map(lambda layer: f"layer {layer}"))
    wide = shown.pivot(index="model", columns="layer", values="cell").reindex(list(dict.fromkeys(table["model"])))
    layers = sorted(wide.columns, key=lambda name: int(name.split()[1]))
    return wide[layers].fillna("–").reset_index().rename_axis(columns=None)


def quoted_table(baselines: Sequence[QuotedBaseline] = QUOTED_BASELINES) -> pd.DataFrame:
    """Public results quoted beside the study, as display strings, each labelled with its setting and source."""
    rows = [[f"{b.label} (quoted)", _pct(b.accuracy), b.epochs, b.setting, b.source] for b in baselines]
    return pd.DataFrame(rows, columns=["model", "test acc %", "epochs", "setting", "source"])


def _json_float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _json_int(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


def metrics_summary(
    runs: pd.DataFrame | None, variants: Sequence[Variant] | None = None, expected_epochs: int | None = None
) -> dict[str, dict[str, Any]]:
    """Per variant: final test_acc mean / std / n, params and FLOPs, JSON-ready (NaN -> null). Same rows and
    counting rules as ``accuracy_table``."""
    table = accuracy_table(runs, variants, expected_epochs)
    return {
        row["variant"]: {
            "test_acc_mean": _json_float(row["test_acc_mean"]),
            "test_acc_std": _json_float(row["test_acc_std"]),
            "n": int(row["n"]),
            "params": _json_int(row["params"]),
            "flops_paper": _json_int(row["flops_paper"]),
            "flops_full": _json_int(row["flops_full"]),
        }
        for row in table.to_dict("records")
    }


SIZE_MEASURES = ("params", "flops_paper", "flops_full")


def size_metrics(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the analyze stage's ``metrics.json`` adds to the training stages': each variant's size (params, FLOPs),
    which no other stage measures (``study.add_finding_metrics`` adds the finding's numbers, derived here alone).
    Accuracies are the tune stage's (``results/tune/``) and the prune stage's (``results/prune/``): one measure, one
    file, one name."""
    return {variant: {key: row[key] for key in SIZE_MEASURES} for variant, row in summary.items()}


def write_metrics(summary: Mapping[str, Any], path: Path | str) -> Path:
    """Write ``metrics_summary`` as indented JSON (strict: no NaN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
