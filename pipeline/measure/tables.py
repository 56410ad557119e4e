"""Parameter / FLOP rows for a set of model variants, and a plain-text table of them (``python -m stages.describe``)."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.config import PAPER_VARIANTS, ModelConfig, VariantConfig
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.measure.reference import PAPER_FIGURES, PAPER_PRUNED_HEADS
from pipeline.models import build_model


def model_size_rows(
    base: ModelConfig,
    *,
    image_size: int,
    variants: Mapping[str, VariantConfig] = PAPER_VARIANTS,
    include_pruned: bool = False,
) -> list[dict]:
    """One row per variant (``base`` with the variant's fields): exact params and forward FLOPs per image."""
    specs: list[tuple[str, ModelConfig, list[int] | None]] = [
        (name, v.apply(base), None) for name, v in variants.items()
    ]
    if include_pruned:
        pruned_cfg = PAPER_VARIANTS["sa_generalized_9"].apply(base)
        heads = [pruned_cfg.heads - p for p in PAPER_PRUNED_HEADS]
        specs.append(("sa_generalized_9_pruned", pruned_cfg, heads))
    rows = []
    for name, cfg, heads in specs:
        model = build_model(cfg, image_size=image_size, heads_per_layer=heads)
        flops = count_flops(model, (3, image_size, image_size))
        rows.append(
            {
                "variant": name,
                "params": count_parameters(model),
                "flops_paper": flops.paper,
                "flops_full": flops.full,
                "convention": flops.convention,
            }
        )
    return rows


def format_table(rows: list[dict], *, with_paper: bool) -> str:
    """Aligned text table; with ``with_paper`` the paper's exact counts and a match column are added."""
    header = ["variant", "params", "GFLOPs (paper conv.)", "GFLOPs (full)"]
    if with_paper:
        header += ["paper params", "paper GFLOPs", "match"]
    lines = [header]
    for row in rows:
        line = [
            row["variant"],
            f"{row['params']:,}",
            f"{row['flops_paper'] / 1e9:.4f}",
            f"{row['flops_full'] / 1e9:.4f}",
        ]
        if with_paper:
            ref = PAPER_FIGURES.get(row["variant"])
            if ref is None:
                line += ["-", "-", "-"]
            else:
                match = row["params"] == ref.params and (ref.flops is None or row["flops_paper"] == ref.flops)
                line += [
                    f"{ref.params:,}",
                    f"{ref.flops / 1e9:.4f}" if ref.flops else "-",
                    "exact" if match else "DIFF",
                ]
        lines.append(line)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    text.append("FLOPs per image, forward pass; " + (rows[0]["convention"] if rows else ""))
    return "\n".join(text)
