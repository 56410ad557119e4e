"""Every Ray or MLflow private API the project uses is listed in docs/design.md ("Ray and MLflow private APIs") with
the version it was checked against and why: a new one fails here until it is listed, a listed one the code dropped
fails until its row goes. Found by reading the code (AST): imports of private or internal modules, ``x._name``
attributes outside ``self``/``cls``, and logger names (string constants) inside private modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Ray and MLflow private APIs"
INTERNAL = (
    "mlflow.store",
    "mlflow.utils",
    "mlflow.tracking.context",
    "mlflow.data.dataset_source_registry",
    "mlflow.system_metrics.system_metrics_monitor",
    "ray.core.generated",
    "ray.air.execution",
    "ray.tune.experiment",
    "ray.tune.execution",
    "ray.tune.impl",
)
PRIVATE_NAME = re.compile(r"^(ray|mlflow)(\.\w+)*\._\w+")
# Underscore attributes that are neither Ray's nor MLflow's: a namedtuple's public ``_replace``, torch's
# ``Tensor._base`` (a view's base: storage counted once) and ``torch._dynamo.reset()``.
NOT_RAY_OR_MLFLOW = {"._replace", "._base", "._dynamo"}


def private_uses(source: str) -> set[str]:
    """The private Ray/MLflow uses in one file: module paths, ``._attribute`` names, private logger names."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(f".{node.attr}")
            continue
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if PRIVATE_NAME.match(node.value):
                found.add(node.value)
            continue
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ("ray", "mlflow") and (any(p.startswith("_") for p in parts) or name.startswith(INTERNAL)):
                found.add(name)
    return found - NOT_RAY_OR_MLFLOW


def listed() -> set[tuple[str, str]]:
    """(use, file) of every row of the design doc's table."""
    text = (ROOT / "docs/design.md").read_text()
    assert SECTION in text, f"docs/design.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| (ray|mlflow) [\d.]+ \| .+\|$", section, flags=re.MULTILINE)
    return {(use, where) for use, where, _ in rows}


def test_the_search_finds_each_kind_of_private_use() -> None:
    source = (
        "import ray._private.services\nfrom mlflow.store.tracking import x\nfrom ray.tune import Callback\n"
        "client._tracking_client = 1\nself._mine = 2\nlog = getLogger('ray.train._internal.storage')\n"
        "def f():\n    '''ray._private.docs are prose'''\n    return t._replace(a=1)\n"
    )
    assert private_uses(source) == {
        "ray._private.services",
        "mlflow.store.tracking",
        "._tracking_client",
        "ray.train._internal.storage",
    }


def test_every_private_use_is_listed_with_its_version_and_reason() -> None:
    used = {
        (use, path.relative_to(ROOT).as_posix())
        for top in ("pipeline", "stages", "analysis")
        for path in sorted((ROOT / top).rglob("*.py"))
        for use in private_uses(path.read_text())
    }
    rows = listed()
    assert rows, "the table of private uses is empty or unreadable"
    missing = sorted(used - rows)
    assert not missing, f"private Ray/MLflow uses not listed in docs/design.md ({SECTION}): {missing}"
    stale = sorted(rows - used)
    assert not stale, f"listed in docs/design.md ({SECTION}) but no longer in the code: {stale}"
