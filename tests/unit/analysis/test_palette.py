"""A variant's colour belongs to its name: adding variants recolours none of the others, in any process."""

from __future__ import annotations

import subprocess
import sys

from analysis.palette import FIXED_COLOURS, PAPER_COLOURS, variant_style
from analysis.variants import describe_variants

PAPER = ["resnet18", "sa_quadratic_9", "sa_quadratic_16", "sa_generalized_9", "sa_generalized_9_pruned", "sa_learned_9"]


def test_the_papers_models_have_distinct_fixed_colours() -> None:
    colours = [variant_style(name).colour for name in PAPER]
    assert colours == [PAPER_COLOURS[name] for name in PAPER] and len(set(colours)) == len(PAPER)
    assert all(variant_style(name).dash == "-" for name in PAPER)


def test_adding_variants_leaves_every_other_colour_unchanged() -> None:
    before = {v.name: v.style for v in describe_variants({name: {} for name in [*PAPER, "sa_learned_heads4"]})}
    grid = [f"sa_{encoding}_heads{heads}" for encoding in ("quadratic", "learned") for heads in (1, 2, 4, 16)]
    after = {v.name: v.style for v in describe_variants({name: {} for name in ["extra", *grid, *PAPER]})}
    assert all(after[name] == style for name, style in before.items())


def test_the_colour_of_a_name_is_the_same_in_another_process() -> None:
    """Python's own ``hash`` of a string changes with every process (PYTHONHASHSEED): the colours must not."""
    names = ["sa_learned_heads4", "my_variant", "w_hidden32_dropout0.25"]
    code = f"from analysis.palette import variant_style; print([variant_style(n) for n in {names!r}])"
    elsewhere = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    ).stdout.strip()
    assert elsewhere == str([variant_style(n) for n in names])


def test_other_names_spread_over_colours_and_dashes() -> None:
    styles = {variant_style(f"variant_{i}") for i in range(200)}
    assert len({s.colour for s in styles}) == 24 and {s.dash for s in styles} == {"--", "-.", ":"}
    assert not {s.colour for s in styles} & set(FIXED_COLOURS.values())  # never drawn as one of the study's models


def test_the_default_studys_gpsa_has_a_colour_of_its_own() -> None:
    assert variant_style("sa_gpsa_9").colour == "#CC79A7" not in PAPER_COLOURS.values()
