"""What the study cost: device-seconds per run, totalled per report table and per claim, failed attempts included.

Why from MLflow and not from Tune: a trial's run is continued across its retries (``pipeline.sweep.tracking``), so
its wall time from start to end in MLflow spans every attempt, the failed ones included, and a trial that failed for
good still has a run that ended. A trial holds one device while it runs (one CPU slot or one GPU: the sweep's
``resources``), so a run's device-seconds are its wall time. Beside it, the sum of its logged epochs' training passes
(``epoch_time_s``): the part spent learning, without evaluation, checkpoints, start-up or lost attempts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from analysis.runs import LoadedRun, LoadedStudy
from pipeline.sweep.manifest import COMPLETED

COLUMNS = ["variant", "seed", "source", "status", "device", "device_s", "train_s", "run_id"]
SOURCES = {"tune": "accuracy table (sweep)", "prune": "accuracy table (pruned)", "transform": "Theorem 1 on ResNet18"}


def compute_frame(runs: Iterable[LoadedRun]) -> pd.DataFrame:
    """One row per run: variant, seed, source, status, device (its ``device`` tag), device_s (wall seconds of every
    attempt; NaN when the run never ended), train_s (its epochs' training passes), run_id."""
    rows = [
        {
            "variant": r.variant,
            "seed": r.seed,
            "source": r.source,
            "status": r.status,
            "device": r.tags.get("device", "?"),
            "device_s": r.wall_s,
            "train_s": r.train_s,
            "run_id": r.run_id,
        }
        for r in runs
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def study_compute(study: LoadedStudy) -> pd.DataFrame:
    """``compute_frame`` of every run the manifests name, the rebuilt networks' fine-tuning included."""
    return compute_frame([*study.runs, *study.transformed])


def total(frame: pd.DataFrame, run_ids: Iterable[str | None] | None = None) -> tuple[float, int]:
    """(device-seconds, runs not counted: never ended or never started) of ``frame``'s runs (all, or ``run_ids``)."""
    rows = frame if run_ids is None else frame[frame["run_id"].isin(set(run_ids))]
    counted = rows["device_s"].dropna()
    return float(counted.sum()), len(rows) - len(counted)


def fmt_seconds(seconds: float) -> str:
    """``1,168 s (0.32 h)``; ``–`` for nothing measured."""
    if not math.isfinite(seconds):
        return "–"
    return f"{seconds:,.0f} s ({seconds / 3600:.2f} h)"


def compute_section_body(frame: pd.DataFrame) -> str:
    """The report's compute section: per table the device-hours of its runs, failed ones included, and per variant."""
    if frame.empty:
        return "No run was fetched."
    devices = "/".join(sorted({d for d in frame["device"] if d and d != "?"})) or "unrecorded device"
    lines = [
        "Device-seconds per run: its wall time in MLflow from start to end, every attempt of its trial included (a "
        f"retry continues the run), one device per trial ({devices}); training: the sum of its logged epochs' "
        "training passes (`epoch_time_s`). Per table of this report, failed and retried runs included:",
        "",
    ]
    table = []
    for source, label in SOURCES.items():
        rows = frame[frame["source"] == source]
        if rows.empty:
            continue
        seconds, uncounted = total(rows)
        failed = int((~rows["status"].isin(COMPLETED)).sum())
        table.append(
            {
                "table": label,
                "runs": len(rows),
                "not finished": failed,
                "device-seconds": fmt_seconds(seconds),
                "training passes": fmt_seconds(float(rows["train_s"].sum(min_count=1))),
                "runs with no end time (not counted)": uncounted,
            }
        )
    seconds, _ = total(frame)
    lines += [pd.DataFrame(table).to_markdown(index=False, disable_numparse=True), ""]
    lines += [f"All runs: {fmt_seconds(seconds)}. Per run: `tables/compute.csv`."]
    per_variant = (
        frame.groupby("variant", sort=False)
        .agg(
            runs=("run_id", "size"),
            device_s=("device_s", lambda s: s.sum(min_count=1)),
            train_s=("train_s", lambda s: s.sum(min_count=1)),
        )
        .reset_index()
    )
    shown = per_variant.assign(
        device_s=per_variant["device_s"].map(fmt_seconds), train_s=per_variant["train_s"].map(fmt_seconds)
    ).rename(columns={"device_s": "device-seconds", "train_s": "training passes"})
    return "\n".join([*lines, "", shown.to_markdown(index=False, disable_numparse=True)])
