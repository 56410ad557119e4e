"""Which rule the prune stage cut heads by, in words, and whether its pruned model is the paper's experiment.

The paper (App. A.1) cuts a generalized head when its ``Sigma^-1`` is flat (largest eigenvalue below a bound) or a
thin stripe (condition number above a bound): ``prune.mode: threshold``. ``prune.mode: fraction`` is ours: a fixed
share of every layer's heads, sharp ones included, so its accuracy after pruning answers another question than the
paper's 93.40 % and is never set beside it. The rule comes from the prune manifest (its ``rule``), so every
sentence about it says what the run did, not what params.yaml says today.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PAPERS_MODE = "threshold"


def is_papers_rule(rule: Mapping[str, Any]) -> bool:
    """True when the run pruned by the paper's threshold rule (an empty rule: no prune stage ran)."""
    return rule.get("mode", PAPERS_MODE) == PAPERS_MODE


def describe_rule(rule: Mapping[str, Any]) -> str:
    """The rule as a clause: ``the paper's rule (...)`` or ``fraction mode (ours, ...)``."""
    if is_papers_rule(rule):
        return (
            f"the paper's rule (largest eigenvalue of Sigma^-1 below {_g(rule.get('min_eigenvalue'))} or condition "
            f"number above {_g(rule.get('max_condition'))})"
            if rule
            else "the paper's rule"
        )
    return (
        f"fraction mode (ours, not the paper's rule: per layer a share {_g(rule.get('fraction'))} of the heads, the "
        "most degenerate, sharp ones included)"
    )


def not_comparable_note(rule: Mapping[str, Any]) -> str:
    """Why a pruned model's accuracy stands without the paper's beside it; empty for the paper's rule."""
    if is_papers_rule(rule):
        return ""
    return f"pruned by {describe_rule(rule)}: not the paper's experiment, so the paper's pruned accuracy is not shown"


def _g(value: Any) -> str:
    """``1e-05`` as ``1e-5``, ``1000.0`` as ``1000``."""
    if not isinstance(value, int | float):
        return "?"
    mantissa, _, exponent = f"{float(value):g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa
