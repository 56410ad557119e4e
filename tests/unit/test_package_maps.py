"""Every package's docstring names each of its modules (its map): a newcomer finds the attention layer, the trial
function or the pruning rule from the package maps alone, and a module added without a line there fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(
    init.parent
    for top in ("pipeline", "analysis", "stages", "benchmarks")
    for init in (ROOT / top).rglob("__init__.py")
    if "__pycache__" not in init.parts
)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_names_every_module(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    members = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(name for name in members if f"``{name}``" not in docstring and f"``{name}/``" not in docstring)
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {missing}"
