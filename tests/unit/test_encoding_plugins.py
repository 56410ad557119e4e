"""The plug-in claim of ``pipeline.encodings``: an encoding is one class in its own module plus one registry entry.

Everything else (config, trial metrics, pruning, analysis, figures, report, benchmarks) reads the entry's declaration,
so an encoding's name appears as a string in code only in its own module and the registry (and in params files,
which are not code). A name written anywhere else would be a special case a new encoding could not reach.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.encodings import ENCODINGS, encoding_fields
from pipeline.models import build_model
from pipeline.models.content import ContentPositionSelfAttention
from pipeline.models.kinds import attention_class
from pipeline.trial.locality import attention_layers

ROOT = Path(__file__).resolve().parents[2]
CODE = ("pipeline", "analysis", "stages", "benchmarks")
REGISTRY = "pipeline/encodings.py"


def _strings(path: Path) -> set[str]:
    """Every string constant of a Python file (docstrings, f-string pieces and dict keys included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def _where_named() -> dict[str, set[str]]:
    """Per encoding name, the code files (relative paths) holding it as a whole string."""
    strings = {p.relative_to(ROOT).as_posix(): _strings(p) for top in CODE for p in sorted((ROOT / top).rglob("*.py"))}
    return {name: {path for path, found in strings.items() if name in found} for name in ENCODINGS}


def _own_module(name: str) -> str:
    module = ENCODINGS[name].target.split(":")[0]
    return module.replace(".", "/") + ".py"


def test_each_encoding_name_occurs_only_in_its_module_and_the_registry() -> None:
    where = _where_named()
    assert all(REGISTRY in files for files in where.values()), "the scan missed the registry's own entries"
    outside = {name: sorted(files - {REGISTRY, _own_module(name)}) for name, files in where.items()}
    assert outside == {name: [] for name in ENCODINGS}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_the_registry_target_is_one_class_of_its_module(name: str) -> None:
    cls = ENCODINGS[name].load()
    assert inspect.isclass(cls) and cls.__module__ == ENCODINGS[name].target.split(":")[0]


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_declared_fields_are_model_fields_with_their_defaults(name: str) -> None:
    cfg = ModelConfig(encoding=name)
    for field, (_, default) in ENCODINGS[name].fields.items():
        assert getattr(cfg, field) == default
    assert set(encoding_fields()) <= set(ModelConfig.model_fields)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_layers_report_exactly_what_the_entry_declares(name: str) -> None:
    spec = ENCODINGS[name]
    model = build_model(ModelConfig(encoding=name, hidden=8, ffn=8, layers=2, heads=4), image_size=8)
    for layer in attention_layers(model):
        assert tuple(layer.head_report()) == spec.head_reports
        assert (layer.head_geometry() is not None) == spec.gaussian
        assert layer.reads_content == spec.reads_content
        assert all(value.shape == (4,) for value in layer.head_report().values())
    probs = attention_layers(model)[0].probs_for(torch.randn(3, 16, 8), (4, 4))
    assert probs.dim() == (4 if spec.reads_content else 3)


def test_content_is_refused_where_the_kind_computes_its_own() -> None:
    for name, spec in ENCODINGS.items():
        if spec.reads_content:
            with pytest.raises(ValueError, match="content: .* computes content scores of its own"):
                attention_class(name, content=True)
        else:
            assert attention_class(name, content=True) is ContentPositionSelfAttention
            assert ContentPositionSelfAttention.reads_content


def test_an_unknown_name_lists_the_registry() -> None:
    with pytest.raises(ValueError, match=r"unknown encoding 'cubic'; valid: \[.*'gpsa'"):
        attention_class("cubic")
