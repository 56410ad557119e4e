"""notebooks/study.ipynb executes (nbclient, a real Jupyter kernel) on a study in a real sqlite MLflow store, so it
cannot rot: it reads the manifests, the runs, the accuracy table and draws its two figures."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# The analysis tests' study (tiny models, real runs, real manifests), loaded from their module's file.
_spec = importlib.util.spec_from_file_location("analysis_study", Path(__file__).with_name("test_analysis.py"))
study_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study_module)

pytestmark = pytest.mark.slow
NOTEBOOK = study_module.ROOT / "notebooks/study.ipynb"


def _outputs(cell: nbformat.NotebookNode, kind: str) -> list[str]:
    return [out["data"][kind] for out in cell.get("outputs", []) if kind in out.get("data", {})]


def test_the_study_notebook_runs_on_a_study(tmp_path: Path) -> None:
    study_module.build_study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", "it-notebook")
    project = study_module._project(tmp_path)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(project)}}
    ).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    text = "\n".join(out.get("text", "") for cell in code for out in cell.get("outputs", []))
    assert "MLflow store sqlite:///" in text and "pruned models" in text
    runs_html = "".join(_outputs(code[1], "text/html"))
    assert "sa_quadratic_9" in runs_html  # the sweep's child runs, read through mlflow.search_runs
    table = "".join(_outputs(code[2], "text/markdown"))
    assert "| SA quadratic" in table and "SA learned, 2 heads" in table  # the accuracy table, every variant run
    figures = [base64.b64decode(png) for cell in code[3:5] for png in _outputs(cell, "image/png")]
    assert len(figures) == 2 and all(png.startswith(study_module.PNG_MAGIC) for png in figures)
