"""The seed band: per variant the mean final accuracy with its 95 % interval across seeds, and how many paired seeds
the observed spread needs to tell a given difference.

Why beside the accuracy table: its binomial interval is the test set's noise alone; seeds add their own (init, data
order, dropout), which only several seeds measure. ``params/band.yaml`` runs the paper's variants on paired seeds;
the claims (``analysis.claims``) then pair by seed, and this section says whether the band was wide enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis import verdicts as v
from analysis.runs import LoadedStudy
from analysis.variants import Variant
from pipeline.sweep.manifest import FINISHED

DIFFERENCES = (0.003, 0.01)  # 0.3 point (the issue's example of a small gap) and 1 point (the claims' margin)
PAIRS = (  # the accuracy claims' pairs (analysis.claims): candidate, reference
    ("sa_quadratic_9", "resnet18"),
    ("sa_quadratic_9", "sa_learned_9"),
    ("sa_generalized_9", "sa_quadratic_9"),
    ("sa_generalized_9_pruned", "sa_generalized_9"),
)


def finals(study: LoadedStudy, variant: str) -> dict[int, float]:
    """Seed -> final test accuracy of the variant's finished runs."""
    return {
        r.seed: r.test_acc
        for r in study.runs
        if r.variant == variant and r.status == FINISHED and math.isfinite(r.test_acc)
    }


def band_table(study: LoadedStudy, variants: Sequence[Variant]) -> pd.DataFrame:
    """Per variant with a finished run: seeds, mean, 95 % interval across seeds (Student t; none with one seed)."""
    rows = []
    for variant in variants:
        accs = finals(study, variant.name)
        if not accs:
            continue
        band = v.mean_interval(list(accs.values()))
        rows.append(
            {
                "model": variant.label,
                "seeds": len(accs),
                "mean %": f"{100 * band.estimate:.2f}",
                "95 % interval across seeds %": (
                    f"[{100 * band.low:.2f}, {100 * band.high:.2f}]" if len(accs) > 1 else "one seed: none"
                ),
                "std (points)": f"{100 * np.std(list(accs.values()), ddof=1):.2f}" if len(accs) > 1 else "–",
            }
        )
    return pd.DataFrame(rows)


def power_lines(study: LoadedStudy) -> list[str]:
    """Per accuracy claim's pair with two paired seeds or more: the spread of the paired differences and the seeds it
    needs to tell each of ``DIFFERENCES`` at 80 % power."""
    lines = []
    for a, b in PAIRS:
        runs_a, runs_b = finals(study, a), finals(study, b)
        seeds = sorted(set(runs_a) & set(runs_b))
        if len(seeds) < 2:
            continue
        spread = float(np.std([runs_a[s] - runs_b[s] for s in seeds], ddof=1))
        needs = ", ".join(
            f"{100 * d:g} point{'s' * (d != 0.01)}: {v.seeds_needed(spread, d) or 'any number'}" for d in DIFFERENCES
        )
        lines.append(
            f"{a} - {b}: paired differences spread {100 * spread:.2f} points over {len(seeds)} seeds; seeds needed "
            f"to tell a difference of {needs} (paired t, 5 %, 80 % power)"
        )
    return lines


def band_section_body(study: LoadedStudy, variants: Sequence[Variant]) -> str | None:
    """The section's markdown, or None when no variant has two finished seeds (no band to show)."""
    table = band_table(study, variants)
    if table.empty or table["seeds"].max() < 2:
        return None
    power = power_lines(study)
    intro = (
        "Final test accuracy over seeds: the mean and its 95 % Student-t interval across seeds (the seeds' own "
        "spread; the accuracy table's binomial interval is the test set's). The claims above pair the variants by "
        "seed. Power, from the spread observed here:"
    )
    listing = [f"- {line}" for line in power] or ["- no pair of claimed variants shares two finished seeds"]
    return "\n".join([intro, "", *listing, "", table.to_markdown(index=False, disable_numparse=True)])
