"""MLflow behind one seam: only ``pipeline/sweep/tracking/`` imports MLflow or calls a client; the rest of the project
imports the package's face (``pipeline.sweep.tracking``), whose names are pinned here. A direct ``import mlflow``, a
client built or called, or a face that grows, fails here, so the retry budget, the outage buffer, the health probe and
the request counts keep one place each."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import pipeline.sweep.tracking as face

ROOT = Path(__file__).resolve().parents[2]
SEAM = "pipeline/sweep/tracking/"
FACE = "pipeline.sweep.tracking"
# The store interface (every part of the project) and the Tune run's wiring (its two driver modules alone).
STORE_INTERFACE = {
    "Store",
    "TrackingError",
    "TrackingBuffer",
    "TrialInfo",
    "ParentRun",
    "PreparedDataset",
    "SweepSummary",
    "tracking_uri",
    "tags",
    "ui",
}
WIRING = {
    "BUFFER_FILE",
    "FINAL_WAIT_S",
    "flush_buffers",
    "park_buffer",
    "MlflowTrialCallback",
    "close_interrupted",
    "trial_outcome",
    "TrialClaims",
    "EPOCH_METRICS",
    "open_parent_run",
    "record_trials",
    "finish_parent",
    "MetricsTarget",
    "train_with_system_metrics",
}
WIRED = {"pipeline/sweep/tracked.py", "pipeline/sweep/tuner.py"}
CLIENT_METHODS = {name for name, _ in inspect.getmembers(MlflowClient, inspect.isfunction) if not name.startswith("_")}


def product_files() -> list[tuple[str, ast.Module]]:
    """Every module of the product outside the seam, parsed."""
    files = []
    for top in ("pipeline", "stages", "analysis"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if not name.startswith(SEAM):
                files.append((name, ast.parse(path.read_text())))
    assert len(files) > 50  # the walk saw the project
    return files


def mlflow_imports(tree: ast.Module) -> list[int]:
    """Line numbers of every import of ``mlflow`` or one of its modules, however deep in the file."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            lines.append(node.lineno)
    return lines


def raw_client_calls(tree: ast.Module) -> list[int]:
    """Line numbers of every client built (``MlflowClient(``, ``mlflow_client(``) or called: one of
    ``MlflowClient``'s methods on something named ``client`` (``client.get_run``, ``store.client.log_artifact``)."""

    def named(node: ast.AST) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        built = named(node.func) in ("MlflowClient", "mlflow_client")
        called = isinstance(node.func, ast.Attribute) and node.func.attr in CLIENT_METHODS
        if built or (called and "client" in named(node.func.value).lower()):
            lines.append(node.lineno)
    return lines


def face_imports(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, module, name) of every import from the seam."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(FACE):
            found += [(node.lineno, node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "") for a in node.names if a.name.startswith(FACE)]
    return found


def test_the_checks_find_what_they_look_for() -> None:
    source = "import os\nimport mlflow.artifacts\ndef f():\n    from mlflow.exceptions import X\n    import mlflowx\n"
    assert mlflow_imports(ast.parse(source)) == [2, 4]
    calls = "c = MlflowClient(u)\nstore.client.get_run(r)\nself._client.set_tag(r, k, v)\nstore.run(r)\nx.get_run(r)\n"
    assert raw_client_calls(ast.parse(calls)) == [1, 2, 3]
    imports = "from pipeline.sweep.tracking import Store\nfrom pipeline.sweep.tracking.store import health\n"
    assert face_imports(ast.parse(imports)) == [(1, FACE, "Store"), (2, f"{FACE}.store", "health")]


def test_mlflow_is_imported_only_behind_the_seam() -> None:
    outside = [f"{name}:{line}" for name, tree in product_files() for line in mlflow_imports(tree)]
    assert not outside, f"mlflow imported outside {SEAM}: {outside}"


def test_no_client_is_built_or_called_outside_the_seam() -> None:
    outside = [f"{name}:{line}" for name, tree in product_files() for line in raw_client_calls(tree)]
    assert not outside, f"a raw MLflow client outside {SEAM} (use its Store): {outside}"


def test_the_product_probes_a_server_in_one_place() -> None:
    # ``pipeline.io.check_tracking_server`` stays only because pipeline/io.py is a dep of the prepare stage
    calls = [
        f"{name}:{node.lineno}"
        for name, tree in product_files()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", "")) == "check_tracking_server"
    ]
    assert not calls, f"probe the server through Store.check_answers (store.health): {calls}"


def test_the_rest_of_the_project_imports_the_face_alone() -> None:
    wrong, used = [], set()
    for name, tree in product_files():
        for line, module, imported in face_imports(tree):
            used.add(imported)
            allowed = STORE_INTERFACE | (WIRING if name in WIRED else set())
            if module != FACE or imported not in allowed:
                wrong.append(f"{name}:{line}: {module}.{imported}")
    assert not wrong, f"imports past the face or beyond what this module may use: {wrong}"
    assert used == STORE_INTERFACE | WIRING  # every name the face offers is used: none kept for nothing


def test_the_face_offers_exactly_its_names() -> None:
    assert set(face.FACE) == STORE_INTERFACE | WIRING
    assert all(getattr(face, name) is not None for name in face.FACE)  # each one resolves to what its module defines
    with pytest.raises(AttributeError, match="has no 'mlflow_client'"):
        face.mlflow_client  # noqa: B018 - the factory stays behind the face


def test_the_seam_does_import_mlflow_and_build_the_client() -> None:
    # the allowed place is real: a renamed seam would otherwise pass the tests above vacuously
    store = ast.parse((ROOT / SEAM / "store.py").read_text())
    assert mlflow_imports(store) and raw_client_calls(store)
