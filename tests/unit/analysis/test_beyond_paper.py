"""The report's "Beyond the paper" section, from hand-made runs: which variants it covers, its gates and numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from torch import nn

from analysis.beyond_paper import (
    content_sentence,
    content_variants,
    gate_sentence,
    gates_frame,
    write_beyond_paper,
)
from analysis.figures import gate_heatmap
from analysis.runs import LoadedRun, LoadedStudy
from analysis.variants import describe_variants

CONFIGS = {
    "sa_quadratic_9": {"arch": "sa", "encoding": "quadratic", "heads": 2},
    "sa_gpsa_9": {"arch": "sa", "encoding": "gpsa", "heads": 2},
    "sa_learned_content": {"arch": "sa", "encoding": "learned", "heads": 2, "content": True},
    "resnet18": {"arch": "resnet18"},
}


def _layer(distances: list[float], gates: list[float] | None) -> dict[str, list[float]]:
    """One layer's per-head history entry; entropy and peak are not what this section reads."""
    heads = len(distances)
    return {"mean_distance": distances, "entropy": [1.0] * heads, "peak_probability": [0.5] * heads} | (
        {"gate": gates} if gates else {}
    )


def _run(variant: str, seed: int, gates: list[list[float]] | None) -> LoadedRun:
    """Head distances: layer l (from 0), epoch e: heads at 1 + l + e and 2 + e; the gates at the last epoch."""
    history = [
        {
            "epoch": e,
            "layers": [_layer([1.0 + layer + e, 2.0 + e], gates[layer] if gates else None) for layer in (0, 1)],
        }
        for e in (0, 1, 2)
    ]
    return LoadedRun(
        f"run-{variant}-{seed}",
        variant,
        seed,
        "finished",
        "tune",
        params={"train.lr": 0.03 if variant == "sa_gpsa_9" else 0.1},
        history=pd.DataFrame({"epoch": [1, 2], "test_acc": [0.5, 0.8 + seed / 100]}),
        model=nn.Identity(),
        model_config=CONFIGS[variant],
        locality_history=history,
    )


def _study() -> LoadedStudy:
    runs = [
        _run("sa_quadratic_9", 0, None),
        _run("sa_gpsa_9", 0, [[0.9, 0.7], [0.4, 0.2]]),
        _run("sa_gpsa_9", 1, [[0.7, 0.7], [0.2, 0.2]]),
        _run("resnet18", 0, None),
    ]
    return LoadedStudy(runs, "sqlite://", "1", "parent", None)


def test_the_section_covers_the_variants_that_read_the_content() -> None:
    variants = describe_variants(CONFIGS)
    assert [v.name for v in content_variants(variants)] == ["sa_gpsa_9", "sa_learned_content"]


def test_gates_are_averaged_over_seeds_per_head() -> None:
    gates = gates_frame(_study(), "sa_gpsa_9")
    assert gates[gates["layer"] == 2]["gate"].tolist() == pytest.approx([0.3, 0.2])
    assert gates_frame(_study(), "sa_quadratic_9").empty


def test_section_numbers_figures_and_tables(tmp_path: Path, recording_writer) -> None:
    study = _study()
    variants = describe_variants({k: v for k, v in CONFIGS.items() if k != "sa_learned_content"})
    add, added = recording_writer

    section, tables = write_beyond_paper(study, variants, "sa_quadratic_9", study.locality(), tmp_path, add)
    assert section is not None and section.title == "Beyond the paper"
    assert added == ["beyond_nonlocality", "beyond_gates_sa_gpsa_9"]
    assert "final test accuracy 80.5% (+0.5 points from SA quadratic" in section.body  # seeds end at 80% and 81%
    assert "(sa_gpsa_9), trained at lr 0.03:" in section.body and "(sa_quadratic_9), trained at lr 0.1:" in section.body
    assert "layer 1 1.50 -> 3.50" in section.body  # mean over heads (1 and 2) at epochs 0 and 2
    assert "mean per layer 1..2: 0.75, 0.25" in section.body and "lower in the last layer" in section.body
    assert [p.name for p in tables] == ["beyond_paper_locality.csv", "beyond_paper_gates.csv"]
    # Same distances in both models (the hand-made runs): no layer wider, each difference 0.
    assert "is wider than that of SA quadratic" in section.body and "in 0 of 2 layers (none)" in section.body
    assert "per layer 1..2, in tokens: +0.00, +0.00." in section.body
    assert "No head's gate moved" not in section.body  # layer 2's gates fell to 0.2-0.3


def test_gates_that_stayed_at_their_init_are_named_so() -> None:
    gates = pd.DataFrame({"layer": [1, 1, 2, 2], "head": [1, 2, 1, 2], "gate": [0.74, 0.73, 0.72, 0.75]})
    sentence = gate_sentence(gates, "GPSA")
    assert "No head's gate moved more than 0.02 from its init" in sentence and "(init 0.73, lambda = 1)" in sentence


def test_the_content_sentence_lists_the_layers_where_the_variant_is_wider() -> None:
    reference = pd.DataFrame({"layer": [1, 2, 3], "first": [2.0, 2.0, 2.0], "last": [1.5, 1.7, 2.4]})
    variant = pd.DataFrame({"layer": [1, 2, 3], "first": [2.0, 2.0, 2.0], "last": [2.0, 1.6, 2.9]})
    sentence = content_sentence(reference, variant, ("SA quadratic", "GPSA"))
    assert "wider than that of SA quadratic in 2 of 3 layers (1, 3)" in sentence
    assert sentence.endswith("in tokens: +0.50, -0.10, +0.50.")


def test_no_section_without_such_a_variant(tmp_path: Path) -> None:
    variants = describe_variants({"sa_quadratic_9": CONFIGS["sa_quadratic_9"]})
    assert write_beyond_paper(_study(), variants, "sa_quadratic_9", pd.DataFrame(), tmp_path, None) == (None, [])


def test_gate_heatmap_has_a_cell_per_head_and_layer() -> None:
    gates = pd.DataFrame({"layer": [1, 1, 2, 2], "head": [1, 2, 1, 2], "gate": [0.9, 0.8, 0.3, 0.1]})
    fig = gate_heatmap(gates, title="t")
    assert len(fig.axes[0].texts) == 4
