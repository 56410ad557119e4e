"""MLflow behind one seam: the driver talks to MLflow only through ``pipeline/sweep/tracking/``, the stages never
import it, and the analysis reads it through one module (``analysis/runs.py``). A direct ``import mlflow`` (at the
top or inside a function) anywhere else fails here, so the retry budget, the outage buffer and the request counts
keep one place each."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEAM = "pipeline/sweep/tracking/"
ANALYSIS_READER = "analysis/runs.py"


def mlflow_imports(source: str) -> list[int]:
    """Line numbers of every import of ``mlflow`` or one of its modules, however deep in the file."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_imports_at_the_top_and_inside_functions() -> None:
    source = "import os\nimport mlflow.artifacts\ndef f():\n    from mlflow.exceptions import X\n    import mlflowx\n"
    assert mlflow_imports(source) == [2, 4]
    assert mlflow_imports("from pipeline.sweep.tracking.store import Run\nimport mlflowx\n") == []


def test_mlflow_is_imported_only_behind_the_seam() -> None:
    checked, outside = 0, []
    for top in ("pipeline", "stages", "analysis"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(SEAM) or name == ANALYSIS_READER:
                continue
            checked += 1
            outside += [f"{name}:{line}" for line in mlflow_imports(path.read_text())]
    assert checked > 50  # the walk saw the project
    assert not outside, f"mlflow imported outside {SEAM} and {ANALYSIS_READER}: {outside}"


def test_the_seam_and_the_reader_do_import_mlflow() -> None:
    # the allowed places are real: a renamed seam would otherwise pass the test above vacuously
    assert mlflow_imports((ROOT / SEAM / "store.py").read_text())
    assert mlflow_imports((ROOT / ANALYSIS_READER).read_text())
