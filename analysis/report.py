"""``results/report.md``: the setting, the accuracy table, further tables, and every figure with one sentence on what
it shows and how it compares with the paper. Pure text: the numbers and sentences are computed by the caller
(``analysis.study``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.table import describe_setting

# The paper's setting (Section 4.1): what "paper scale" means.
PAPER_SETTING = {"dataset": "cifar10", "image size": "32x32", "epochs": 300, "hidden": 400, "layers": 6}


@dataclass(frozen=True)
class FigureEntry:
    """A figure of the report: its file (relative to the report), a title, and what it shows vs the paper."""

    path: str
    title: str
    sentence: str


@dataclass(frozen=True)
class Section:
    """A titled block of markdown of the report (e.g. a table beyond the paper's), and the figures its numbers are
    about, drawn right under it (not in the report's figure list)."""

    title: str
    body: str
    figures: Sequence[FigureEntry] = ()


def scale_note(setting: Mapping[str, Any]) -> str:
    """``the paper's scale`` when the setting is the paper's, else what differs from it (the setting line before it
    says what was run; a full run on other data is not a smoke test, so the note never calls it one)."""
    differs = [
        f"{key} {setting.get(key, '?')} (paper: {value})"
        for key, value in PAPER_SETTING.items()
        if str(setting.get(key)) != str(value)
    ]
    return "the paper's scale" if not differs else "smaller than the paper's setting: " + ", ".join(differs)


def render_report(
    setting: Mapping[str, Any],
    table_markdown: str,
    figures: Sequence[FigureEntry],
    skipped: Sequence[str] = (),
    run_notes: Sequence[str] = (),
    sections: Sequence[Section] = (),
    paper_not_run: Sequence[str] = (),
    quoted: str = "",
    noise: str = "",
    claims: str = "",
) -> str:
    """The report as markdown; its first line states the setting and its scale. ``paper_not_run``: the paper's
    models this study did not run (named under the table, so a reader knows the comparison is partial); ``quoted``: a
    markdown table of public results quoted beside the study, each with its source; ``noise``: what the test set's
    size allows (under the table); ``claims``: the claims and their verdicts, the report's first table."""
    lines = [f"{describe_setting(setting)} ({scale_note(setting)}).", ""]
    lines += ["# Reproduction of Cordonnier et al. (ICLR 2020): results", ""]
    if claims:
        lines += ["## Claims and verdicts", "", claims.strip(), ""]
    lines += ["## Accuracy and size (the paper's Figure 5 / Figure 9, for every variant run)", ""]
    lines += [
        "Final-epoch test accuracy averaged over seeds (± standard deviation when several); only runs that trained "
        "all their epochs count. FLOPs are per image, in the paper's convention and in full. The paper's figures "
        "stand beside the models it has; the other rows say so.",
        "",
        table_markdown.strip(),
        "",
    ]
    if noise:
        lines += [noise, ""]
    if paper_not_run:
        lines += [f"The paper's models not run in this study: {', '.join(paper_not_run)}.", ""]
    if quoted:
        lines += ["Quoted from the literature for context (not run here; the source's setting, not this study's):", ""]
        lines += [quoted.strip(), ""]
    if run_notes:
        lines += ["Runs with something missing:", ""] + [f"- {note}" for note in run_notes] + [""]
    for section in sections:
        lines += [f"## {section.title}", "", section.body.strip(), ""]
        lines += _figure_lines(section.figures)
    lines += ["## Figures", ""] + _figure_lines(figures)
    if skipped:
        lines += ["## Figures not drawn", ""] + [f"- {reason}" for reason in skipped] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _figure_lines(figures: Sequence[FigureEntry]) -> list[str]:
    lines = []
    for entry in figures:
        lines += [f"### {entry.title}", "", f"![{entry.title}]({entry.path})", "", entry.sentence, ""]
    return lines
