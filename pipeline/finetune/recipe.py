"""What a fine-tune recipe gives: which trained sources it takes, the model it builds from one, and the rule and note.

Everything else (the plan, the dry run, identity and reuse, saving the start weights, the tracked Tune run, the
manifest) is the family's, so a third recipe is one file of this shape and a stage of a few lines. Recipes import
neither Ray nor MLflow: the run's params, tags and step-0 metrics are plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from pipeline.config import Params
from pipeline.sweep.manifest import TrialRecord, TuneManifest


class Recipe(Protocol):
    """One fine-tune stage's own part. ``stage`` names its params section (``lr_factor``, ``epochs``), its parent
    run, its tags' prefix and ``results/<stage>/``; the plan (``Plan``) a recipe's methods read holds the model it
    built and the ``facts`` its ``build`` returned."""

    stage: str
    start_folder: str  # the built weights' folder in the Ray experiment (<start_folder>/<plan key>), and a run tag
    entry: type  # the manifest entry (a dataclass with ``final_acc`` and ``summary()``)
    rule_module: str  # the trial-code module of the rule that builds the model: part of its identity
    run_suffix = ""  # after the trial's run name
    step0_metric: str | None = None  # a reused run's metric read back at step 0 (the entry's ``step0``)
    register_suffix: str | None = None  # register each variant's best model as <experiment>.<variant><suffix>

    def sources(
        self, params: Params, manifest: TuneManifest, manifest_path: Path
    ) -> tuple[list[tuple[str, TrialRecord]], list[dict[str, str]] | None]:
        """(the variant the built model trains as, its source), and those skipped with why (None: it refuses)."""

    def build(self, params: Params, name: str, source: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
        """The model built from a trained ``source`` (left as it is), and what the entry and the run keep of it."""

    def identity(self, params: Params, plan: Any) -> Any:
        """The recipe's part of a built model's identity (the source trial's is the family's)."""

    def header(self, params: Params) -> list[str]:
        """The dry run's first lines: the rule and the fine-tuning schedule."""

    def dry_run(self, plan: Any) -> tuple[str, list[str]]:
        """A plan in the dry run: its first line (from the key to what was done) and the lines under it."""

    def nothing(self, params: Params) -> str:
        """Why there is nothing to build."""

    def check(self, params: Params, plans: list[Any], data: Any) -> None:
        """Before any fine-tuning, on every plan (reused or not): refuse a model that must not train."""

    def start(self, params: Params, plan: Any, device_data: Callable[[], Any]) -> dict[str, Any]:
        """Before a model that trains now is saved: its run's ``params``, ``tags``, step-0 ``metrics`` and
        ``artifacts``, and what ``note`` reads. ``device_data()`` gives the test set on the fine-tuning's device."""

    def note(self, summary: dict[str, Any]) -> str:
        """The fine-tuning run's description (Markdown in the MLflow UI)."""

    def entry_of(self, plan: Any, run: dict[str, Any]) -> Any:
        """The manifest entry; ``run``: the fine-tuning run's fields, ``start_dir``, ``key``, ``step0``."""

    def log_line(self, entry: Any) -> str:
        """One line per model in the stage's log."""
