"""The paper's accuracy / size table (Figure 5 / Figure 9), ours next to theirs, and the DVC metrics summary.

Every row of the paper appears, in the paper's order, whatever the input: a model that was not run, whose seeds
all failed, or that has no prune manifest yet gets a row that says so instead of an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.measure.reference import PAPER_FIGURES
from pipeline.sweep.manifest import FINISHED  # a trial that trained all its epochs; other labels are no final result

RUN_COLUMNS = [
    "variant", "seed", "status", "test_acc", "best_test_acc", "epochs", "params", "flops_paper", "flops_full",
]  # fmt: skip

PRUNED = "sa_generalized_9_pruned"
DEFAULT_MISSING = {PRUNED: "pruned row: no prune manifest yet"}

FLOPS_PAPER_LABEL = "paper convention: 2 x MACs of Linear/Conv"
FLOPS_FULL_LABEL = "full count"
BEST_LABEL = "best-epoch test acc % (selected on the test set, as the authors did)"

# Formatted column names, in order (numeric table columns are documented in ``accuracy_table``).
DISPLAY_COLUMNS = [
    "model", "final-epoch test acc % (mean ± std, n seeds)", BEST_LABEL, "paper test acc %", "params (ours / paper)",
    f"FLOPs, {FLOPS_PAPER_LABEL} (ours / paper)", f"FLOPs, {FLOPS_FULL_LABEL} (ours)", "note",
]  # fmt: skip


def _complete_columns(runs: pd.DataFrame | None) -> pd.DataFrame:
    """A copy of ``runs`` with every expected column (missing ones are NaN): partial input never raises."""
    frame = pd.DataFrame(columns=RUN_COLUMNS) if runs is None else runs.copy()
    for column in RUN_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
    for column in ("test_acc", "best_test_acc", "epochs", "params", "flops_paper", "flops_full"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    frame["status"] = frame["status"].map(lambda s: s.lower() if isinstance(s, str) else "")  # NaN/None -> ""
    return frame


def _first(values: pd.Series) -> float:
    """The variant's size (identical over seeds), NaN when no run reported it."""
    values = values.dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _variant_row(variant: str, runs: pd.DataFrame, expected_epochs: int | None, missing: str) -> dict[str, Any]:
    ref = PAPER_FIGURES[variant]
    finished = runs[(runs["status"] == FINISHED) & runs["test_acc"].notna()]
    if expected_epochs is not None:
        short = finished["epochs"].notna() & (finished["epochs"] < expected_epochs)
        finished = finished[~short]
    else:
        short = pd.Series(dtype=bool)
    notes = []
    if runs.empty:
        notes.append(missing)
    elif finished.empty:
        notes.append("all seeds failed" if (runs["status"] == "error").all() else "no finished seed")
    left_out = len(runs) - len(finished)
    if left_out and not finished.empty:
        statuses = ", ".join(sorted({s or "unknown" for s in runs.loc[~runs.index.isin(finished.index), "status"]}))
        notes.append(f"{left_out} of {len(runs)} runs left out ({statuses})")
    if short.any():
        notes.append(f"{int(short.sum())} finished with fewer than {expected_epochs} epochs")
    return {
        "variant": variant,
        "model": ref.label,
        "n": len(finished),
        "test_acc_mean": float(finished["test_acc"].mean()) if len(finished) else math.nan,
        "test_acc_std": _std(finished["test_acc"]),
        "best_test_acc_mean": float(finished["best_test_acc"].mean()) if len(finished) else math.nan,
        "best_test_acc_std": _std(finished["best_test_acc"].dropna()),
        "paper_acc": math.nan if ref.accuracy is None else ref.accuracy,
        "params": _first(runs["params"]),
        "paper_params": float(ref.params),
        "flops_paper": _first(runs["flops_paper"]),
        "paper_flops": math.nan if ref.flops is None else float(ref.flops),
        "flops_full": _first(runs["flops_full"]),
        "note": "; ".join(notes),
    }


def accuracy_table(
    runs: pd.DataFrame | None,
    expected_epochs: int | None = None,
    missing_notes: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per model of the paper, in its order, from one row per run.

    ``runs`` columns (missing ones count as NaN): variant, seed, status (the sweep's label; only ``finished``
    runs with a test_acc count), test_acc (final epoch), best_test_acc, epochs (completed), params, flops_paper,
    flops_full. Runs of unknown variants are ignored. Runs with fewer than ``expected_epochs`` are left out.
    ``missing_notes`` overrides the note of a variant without runs (default "not run").

    Returns numeric columns: variant, model, n, test_acc_mean, test_acc_std, best_test_acc_mean,
    best_test_acc_std, paper_acc, params, paper_params, flops_paper, paper_flops, flops_full, note.
    """
    frame = _complete_columns(runs)
    notes = {**DEFAULT_MISSING, **(missing_notes or {})}
    rows = [
        _variant_row(variant, frame[frame["variant"] == variant], expected_epochs, notes.get(variant, "not run"))
        for variant in PAPER_FIGURES
    ]
    return pd.DataFrame(rows)


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


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """The numeric table as display strings (accuracies in %, params exact, FLOPs with k/M/G); missing: "–"."""
    rows = []
    for row in table.to_dict("records"):
        n = int(row["n"])
        rows.append(
            [
                row["model"],
                _pct(row["test_acc_mean"], row["test_acc_std"], n) if n else "–",
                _pct(row["best_test_acc_mean"], row["best_test_acc_std"], n) if n else "–",
                _pct(row["paper_acc"]),
                f"{_exact(row['params'])} / {_exact(row['paper_params'])}",
                f"{_si(row['flops_paper'])} / {_si(row['paper_flops'])}",
                _si(row["flops_full"]),
                row["note"],
            ]
        )
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(table: pd.DataFrame, setting: Mapping[str, Any]) -> str:
    """The setting line first, then the formatted table (GitHub markdown, no extra dependency)."""
    shown = format_table(table)
    lines = [describe_setting(setting), ""]
    lines.append("| " + " | ".join(_md_cell(c) for c in shown.columns) + " |")
    lines.append("|" + "|".join("---" for _ in shown.columns) + "|")
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_"}
_LATEX_ESCAPES |= {"{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_ESCAPES |= {"±": r"$\pm$", "–": "--"}


def _tex(value: Any) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(value))


def to_latex(table: pd.DataFrame, setting: Mapping[str, Any]) -> str:
    """A booktabs tabular with the setting as a comment and caption (written by hand: no jinja2 needed)."""
    shown = format_table(table)
    lines = [
        f"% {describe_setting(setting)}",
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex(describe_setting(setting))}}}",
        r"\begin{tabular}{" + "l" * len(shown.columns) + "}",
        r"\toprule",
        " & ".join(_tex(c) for c in shown.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(_tex(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, setting: Mapping[str, Any], stem: Path | str) -> list[Path]:
    """Write ``stem``.md (formatted, setting first), .csv (numeric, for re-use) and .tex; returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_suffix(".tex")]
    paths[0].write_text(to_markdown(table, setting), encoding="utf-8")
    table.to_csv(paths[1], index=False)
    paths[2].write_text(to_latex(table, setting), encoding="utf-8")
    return paths


def _json_float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _json_int(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


def metrics_summary(runs: pd.DataFrame | None, expected_epochs: int | None = None) -> dict[str, dict[str, Any]]:
    """Per variant of the paper: final test_acc mean / std / n, params and FLOPs, JSON-ready (NaN -> null), for
    ``dvc metrics show``. Same counting rules as ``accuracy_table``."""
    table = accuracy_table(runs, expected_epochs)
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


def write_metrics(summary: Mapping[str, Any], path: Path | str) -> Path:
    """Write ``metrics_summary`` as indented JSON (strict: no NaN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
