"""Which Gaussian heads to prune, and pruning them (Cordonnier et al. 2020, App. A.1).

A Gaussian head's precision ``Sigma^-1`` (``S S^T`` for the generalized encoding, ``s^2 I`` for the isotropic one)
says what it attends to. The paper prunes a head when ``Sigma^-1``

- has largest eigenvalue < ``min_eigenvalue`` (1e-5): the Gaussian is flat, the head attends uniformly, or
- has condition number (largest / smallest eigenvalue) > ``max_condition``: the Gaussian is a stripe, an infinitely
  long line of pixels. The authors' code used 1e3; the paper's text says 1e5.

In its 6-layer x 9-head generalized model this cut (2, 4, 1, 2, 6, 0) heads per layer. Isotropic
heads have condition number 1, so only the first rule can cut them; the learned encoding and ResNet have no
``Sigma^-1`` and are refused.

``mode="fraction"`` is **ours, not the paper's**: per layer, cut a fixed share of the heads, the most degenerate ones
(see ``heads_to_cut``), for pruning experiments at a chosen size.

Pure functions on tensors and modules: no files, no tracking. ``HeadDecision.to_dict`` gives plain, JSON-safe dicts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pipeline.encodings import ENCODINGS, gaussian_encodings

MODES = ("threshold", "fraction")
PAPER_MIN_EIGENVALUE = 1e-5  # App. A.1
AUTHORS_MAX_CONDITION = 1e3  # the authors' code
PAPER_TEXT_MAX_CONDITION = 1e5  # App. A.1's text
_ROUNDING_SLACK = 1e-9  # so that e.g. 0.29 * 100 = 28.999999999999996 counts as 29 heads


@dataclass(frozen=True)
class HeadDecision:
    """Whether head ``head`` of layer ``layer`` (0-based, as in ``model.layers``) is cut, and why.

    ``eigenvalues`` are those of its ``Sigma^-1``, ascending; ``condition_number`` is largest / smallest, ``inf`` when
    the smallest is <= 0 (a degenerate or numerically negative precision).
    """

    layer: int
    head: int
    eigenvalues: tuple[float, float]
    largest_eigenvalue: float
    condition_number: float
    pruned: bool
    reason: str  # "uniform: ...", "stripe: ...", "among the k most degenerate ...", or "kept"

    def to_dict(self) -> dict[str, Any]:
        """Plain types only; an infinite condition number is written ``"inf"`` (strict JSON has no Infinity)."""
        record = asdict(self)
        record["eigenvalues"] = list(self.eigenvalues)
        if math.isinf(self.condition_number):
            record["condition_number"] = "inf"
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> HeadDecision:
        """Inverse of ``to_dict`` (``float("inf")`` reads the ``"inf"`` back)."""
        low, high = record["eigenvalues"]
        return cls(
            layer=int(record["layer"]),
            head=int(record["head"]),
            eigenvalues=(float(low), float(high)),
            largest_eigenvalue=float(record["largest_eigenvalue"]),
            condition_number=float(record["condition_number"]),
            pruned=bool(record["pruned"]),
            reason=str(record["reason"]),
        )


def covariance_geometry(model: nn.Module) -> list[dict[str, Tensor]]:
    """``model.head_geometry()``, or a ``ValueError`` saying why ``model`` has no ``Sigma^-1`` to prune by."""
    gaussian = gaussian_encodings()
    layers = getattr(model, "layers", None)
    if not hasattr(model, "head_geometry") or layers is None:
        raise ValueError(
            f"{type(model).__name__} has no attention heads to prune; pruning needs Gaussian heads "
            f"(encodings {gaussian})"
        )
    geometry = model.head_geometry()
    if geometry is None:
        names = {_encoding_name(layer.attention.encoding) for layer in layers}
        raise ValueError(
            f"the {'/'.join(sorted(names))} encoding has no covariance to prune by; pruning needs Gaussian heads "
            f"(encodings {gaussian})"
        )
    return geometry


def _encoding_name(encoding: nn.Module) -> str:
    """The registry name of ``encoding``'s class, as params.yaml writes it."""
    target = f"{type(encoding).__module__}:{type(encoding).__name__}"
    return next((name for name, spec in ENCODINGS.items() if spec.target == target), type(encoding).__name__)


def head_decisions(
    geometry: list[dict[str, Tensor]],
    *,
    mode: str = "threshold",
    min_eigenvalue: float = PAPER_MIN_EIGENVALUE,
    max_condition: float = AUTHORS_MAX_CONDITION,
    fraction: float | None = None,
) -> list[list[HeadDecision]]:
    """One decision per head, per layer (a layer without heads gives an empty list), from ``geometry`` as returned
    by ``covariance_geometry`` / ``model.head_geometry()``.

    ``mode="threshold"`` is the paper's rule with ``min_eigenvalue`` and ``max_condition`` (``fraction`` unused);
    ``mode="fraction"`` is ours, see ``heads_to_cut`` (the thresholds unused).
    """
    if mode not in MODES:
        raise ValueError(f"unknown pruning mode {mode!r}; valid: {list(MODES)}")
    if mode == "threshold" and not (min_eigenvalue >= 0 and max_condition >= 1):
        raise ValueError(f"need min_eigenvalue >= 0 and max_condition >= 1, got {min_eigenvalue}, {max_condition}")
    if mode == "fraction" and (fraction is None or not 0.0 <= fraction <= 1.0):
        raise ValueError(f"fraction mode needs a fraction in [0, 1], got {fraction}")
    decisions = []
    for layer, geo in enumerate(geometry):
        spectra = _spectra(layer, geo["sigma_inv"])
        if mode == "threshold":
            decisions.append([_threshold(layer, h, ev, min_eigenvalue, max_condition) for h, ev in enumerate(spectra)])
        else:
            decisions.append(_fraction(layer, spectra, fraction))
    return decisions


def _spectra(layer: int, sigma_inv: Tensor) -> list[tuple[float, float]]:
    """Ascending eigenvalues of each head's ``Sigma^-1`` (H, 2, 2), in float64 on the CPU."""
    assert sigma_inv.ndim == 3 and sigma_inv.shape[1:] == (2, 2), f"expected (H, 2, 2), got {tuple(sigma_inv.shape)}"
    matrix = sigma_inv.detach().to("cpu", torch.float64)
    if not torch.isfinite(matrix).all():
        raise ValueError(f"layer {layer} has a non-finite Sigma^-1 (diverged training?): cannot rank its heads")
    matrix = (matrix + matrix.transpose(-1, -2)) / 2  # symmetric up to rounding already; eigvalsh reads one triangle
    return [(float(low), float(high)) for low, high in torch.linalg.eigvalsh(matrix).tolist()]  # (H, 2) ascending


def _condition(eigenvalues: tuple[float, float]) -> float:
    low, high = eigenvalues
    return high / low if low > 0 else math.inf


def _decision(layer: int, head: int, eigenvalues: tuple[float, float], reason: str | None) -> HeadDecision:
    return HeadDecision(
        layer=layer,
        head=head,
        eigenvalues=eigenvalues,
        largest_eigenvalue=eigenvalues[1],
        condition_number=_condition(eigenvalues),
        pruned=reason is not None,
        reason=reason or "kept",
    )


def _threshold(
    layer: int, head: int, eigenvalues: tuple[float, float], min_eigenvalue: float, max_condition: float
) -> HeadDecision:
    """The paper's rule. A head that is both flat and a stripe is reported as uniform: it attends everywhere."""
    largest, condition = eigenvalues[1], _condition(eigenvalues)
    reason = None
    if largest < min_eigenvalue:
        reason = f"uniform: largest eigenvalue {_fmt(largest)} < {_fmt(min_eigenvalue)}"
    elif condition > max_condition:
        reason = f"stripe: condition number {_fmt(condition)} > {_fmt(max_condition)}"
    return _decision(layer, head, eigenvalues, reason)


def heads_to_cut(num_heads: int, fraction: float) -> int:
    """How many of a layer's ``num_heads`` heads fraction mode cuts: ``floor(fraction * num_heads)``, but at least
    one when ``fraction > 0`` and the layer has heads.

    Floor, so the cut never exceeds the asked share by rounding up; at least one, because a positive fraction is a
    request to prune and plain floor would silently cut nothing from every layer with fewer than ``1 / fraction``
    heads (e.g. 0.1 of 9 heads), making the result depend on the layers' sizes.
    """
    if num_heads == 0 or fraction <= 0:
        return 0
    return max(1, math.floor(fraction * num_heads + _ROUNDING_SLACK))


def _fraction(layer: int, spectra: list[tuple[float, float]], fraction: float) -> list[HeadDecision]:
    """Ours: cut the ``heads_to_cut`` most degenerate heads, ranked by condition number (descending), then by
    ``1 / largest eigenvalue`` (descending, i.e. flattest first), then by head index for a deterministic order."""
    count = heads_to_cut(len(spectra), fraction)
    order = sorted(range(len(spectra)), key=lambda h: (-_condition(spectra[h]), spectra[h][1], h))
    cut = set(order[:count])
    return [
        _decision(
            layer,
            h,
            ev,
            f"among the {count} most degenerate of layer {layer}'s {len(spectra)} heads "
            f"(condition number {_fmt(_condition(ev))}, largest eigenvalue {_fmt(ev[1])})"
            if h in cut
            else None,
        )
        for h, ev in enumerate(spectra)
    ]


def _fmt(value: float) -> str:
    """3 significant digits, compact exponent: 3e-06 -> 3e-6, 2.1e+04 -> 2.1e4."""
    if math.isinf(value):
        return "inf"
    mantissa, _, exponent = f"{value:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def keep_per_layer(decisions: list[list[HeadDecision]]) -> list[list[int]]:
    """The heads to keep in each layer, for ``SelfAttentionNet.prune_heads``."""
    return [[d.head for d in layer if not d.pruned] for layer in decisions]


def pruned_per_layer(decisions: list[list[HeadDecision]]) -> list[int]:
    """Heads cut per layer, e.g. the paper's [2, 4, 1, 2, 6, 0]."""
    return [sum(d.pruned for d in layer) for layer in decisions]


def prune_model(model: nn.Module, decisions: list[list[HeadDecision]]) -> nn.Module:
    """Remove the cut heads from ``model`` in place (encoding parameters and value columns); returns ``model``.

    ``decisions`` must have been made for this model as it is now: one decision per current head, in order, so
    stale decisions (e.g. applied twice) cannot remove the wrong heads.
    """
    covariance_geometry(model)  # the same refusal as for deciding
    current = list(model.heads_per_layer)
    decided = [len(layer) for layer in decisions]
    if decided != current or any(
        (d.layer, d.head) != (i, h) for i, layer in enumerate(decisions) for h, d in enumerate(layer)
    ):
        raise ValueError(f"decisions cover heads per layer {decided}, the model has {current}: decide on this model")
    model.prune_heads(keep_per_layer(decisions))
    return model


__all__ = [
    "AUTHORS_MAX_CONDITION",
    "MODES",
    "PAPER_MIN_EIGENVALUE",
    "PAPER_TEXT_MAX_CONDITION",
    "HeadDecision",
    "covariance_geometry",
    "head_decisions",
    "heads_to_cut",
    "keep_per_layer",
    "prune_model",
    "pruned_per_layer",
]
