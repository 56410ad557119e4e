"""Display names and order of a study's variants come from their configs; the paper's models keep its labels."""

from __future__ import annotations

from analysis.variants import describe_variants

BASE = {"hidden": 32, "layers": 2, "ffn": 64, "learned_dim": 16, "resnet_width": 8, "dropout": 0.1}


def _sa(encoding: str, heads: int, **fields: object) -> dict:
    return {"arch": "sa", "encoding": encoding, "heads": heads, **BASE, **fields}


def test_names_come_from_the_config_and_name_only_what_differs() -> None:
    variants = describe_variants(
        {
            "sa_learned_heads4": _sa("learned", 4),
            "sa_quadratic_9": _sa("quadratic", 9),
            "wide": _sa("generalized_quadratic", 9, hidden=64),
            "resnet18": {"arch": "resnet18", **BASE},
            "resnet_wide": {"arch": "resnet18", **BASE, "resnet_width": 16},
            "wide_pruned": _sa("generalized_quadratic", 9, hidden=64),
            "sa_generalized_9_pruned": _sa("generalized_quadratic", 9),
        }
    )
    labels = {v.name: v.label for v in variants}
    assert labels == {
        "resnet18": "ResNet18",
        "sa_quadratic_9": "SA quadratic",
        "sa_generalized_9_pruned": "SA quadratic generalized, pruned",
        "sa_learned_heads4": "SA learned, 4 heads",
        "wide": "SA quadratic generalized, 9 heads, hidden 64",
        "wide_pruned": "SA quadratic generalized, 9 heads, hidden 64, pruned",
        "resnet_wide": "ResNet18, resnet width 16",
    }
    # The paper's models in the paper's order, then the others by name (digits as numbers), pruned after source.
    assert [v.name for v in variants] == [
        "resnet18",
        "sa_quadratic_9",
        "sa_generalized_9_pruned",
        "resnet_wide",
        "sa_learned_heads4",
        "wide",
        "wide_pruned",
    ]
    assert {v.name: v.pruned_from for v in variants}["wide_pruned"] == "wide"
    assert [v.is_attention for v in variants] == [False, True, True, False, True, True, True]
    natural = describe_variants({name: {} for name in ["g_heads16", "g_heads2", "g_heads1", "f"]})
    assert [v.name for v in natural] == ["f", "g_heads1", "g_heads2", "g_heads16"]


def test_names_stay_unique() -> None:
    variants = describe_variants({"a": _sa("learned", 2), "b": _sa("learned", 2), "unknown": {}})
    assert [v.label for v in variants] == ["SA learned, 2 heads (a)", "SA learned, 2 heads (b)", "unknown"]
