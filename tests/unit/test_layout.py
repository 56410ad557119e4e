"""The worker / driver boundary: a trial's identity hashes what it runs (every module it imports, inside the paths DVC
depends on), and nothing else changes it: not a docstring, a comment, a driver setting nor another encoding. Also:
every module a stage imports is one of its DVC deps."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from pipeline.config import EncodingName
from pipeline.encodings import DEFAULT_ENCODING, ENCODINGS
from pipeline.models import ARCHITECTURES
from pipeline.sweep import identity
from pipeline.sweep.identity import TRIAL_CODE, trial_code, trial_modules
from pipeline.trial.code_version import model_module
from tests.project_copy import project_files

ROOT = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _project_modules_imported_by(*modules: str) -> set[str]:
    """Project files (relative paths) loaded by a fresh interpreter after importing ``modules``."""
    code = (
        "import sys, importlib\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f: print(f)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {Path(line).resolve() for line in done.stdout.split() if Path(line).is_absolute()}
    return {f.relative_to(ROOT).as_posix() for f in files if f.is_relative_to(ROOT) and ".venv" not in f.parts}


def _covered(path: str, deps: typing.Iterable[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def test_tune_stage_depends_on_exactly_the_trial_code() -> None:
    code_deps = [d for d in STAGES["tune"]["deps"] if not d.startswith(("stages/", "${"))]
    assert sorted(code_deps) == sorted(TRIAL_CODE)


def test_prune_stage_depends_on_the_trial_code_and_the_tune_manifest() -> None:
    code_deps = [d for d in STAGES["prune"]["deps"] if d.startswith("pipeline/")]
    assert sorted(code_deps) == sorted(TRIAL_CODE)
    assert "results/tune/manifest.json" in STAGES["prune"]["deps"]


def test_transform_stage_depends_on_the_trial_code_and_the_tune_manifest() -> None:
    code_deps = [d for d in STAGES["transform"]["deps"] if d.startswith("pipeline/")]
    assert sorted(code_deps) == sorted(TRIAL_CODE)
    assert "results/tune/manifest.json" in STAGES["transform"]["deps"]
    assert "results/transform/manifest.json" in STAGES["analyze"]["deps"]


# Every model a trial can build: each registry entry on the self-attention net, and each other architecture.
MODELS = [("sa", name) for name in sorted(ENCODINGS)] + [(arch, DEFAULT_ENCODING) for arch in sorted(ARCHITECTURES)]
# The modules of the rules that build a fine-tuned model's start (prune, transform): in its identity too.
RULES = ("pipeline.models.pruning", "pipeline.models.transformed_resnet")


def _identities(root: Path) -> dict[tuple[str, str], str]:
    return {(arch, encoding): trial_code(arch, encoding, root=root) for arch, encoding in MODELS}


def test_every_identity_lies_in_the_trial_code_dvc_depends_on() -> None:
    """An edit that changes a trial's identity is an edit DVC sees: the stage runs again and retrains that trial."""
    for arch, encoding in MODELS:
        modules = trial_modules(arch, encoding, also=RULES)
        outside = [path for path in modules if not _covered(path, TRIAL_CODE)]
        assert "pipeline/trial/loop.py" in modules and not outside, (arch, encoding, outside)


def test_the_registry_is_read_as_it_is_imported() -> None:
    """The identity reads each model's module from the source (a copy of the project is hashed as it is written)."""
    for name, spec in ENCODINGS.items():
        assert model_module("sa", name) == spec.target.split(":")[0]
    for arch, target in ARCHITECTURES.items():
        assert model_module(arch, DEFAULT_ENCODING) == target.split(":")[0]


def test_everything_a_trial_imports_is_in_its_identity() -> None:
    """A fresh interpreter per model imports what a worker imports (the trainable, the prepared data it unpickles)
    and builds the model; every project module then loaded is one its identity hashes (torch stays loaded between
    models, the project's modules are dropped)."""
    code = (
        "import sys, importlib\n"
        "from pipeline.config import ModelConfig\n"
        f"for arch, encoding in {MODELS!r}:\n"
        "    for name in [m for m in sys.modules if m.partition('.')[0] == 'pipeline']: del sys.modules[name]\n"
        "    for name in ('pipeline.trial.trainable', 'pipeline.data.prepared'): importlib.import_module(name)\n"
        "    from pipeline.config import ModelConfig\n"
        "    from pipeline.models import build_model\n"
        "    cfg = ModelConfig(arch=arch, encoding=encoding, hidden=8, ffn=8, layers=1, heads=4, resnet_width=4)\n"
        "    build_model(cfg, image_size=8)\n"
        "    files = sorted({m.__file__ for m in sys.modules.values() if getattr(m, '__file__', None)})\n"
        "    print(arch, encoding, *files)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(MODELS)
    for line in lines:
        arch, encoding, *files = line.split()
        paths = {Path(f).resolve() for f in files if Path(f).is_absolute()}
        imported = {f.relative_to(ROOT).as_posix() for f in paths if f.is_relative_to(ROOT) and ".venv" not in f.parts}
        assert "pipeline/trial/loop.py" in imported  # the check sees the project's modules at all
        outside = sorted(imported - set(trial_modules(arch, encoding)))
        assert not outside, f"{arch}/{encoding}: imported by its trial but not in its identity: {outside}"


def test_a_trial_s_imports_inside_functions_are_the_known_ones() -> None:
    """The identity follows the imports a module runs when imported. One inside a function runs when it is called:
    of all the modules of any identity, the only such import is the prepared data's writer (``pipeline.io``), which
    the prepare stage calls and a trial never does; a model's own module is imported by name (``build_model``)."""
    found = set()
    for path in sorted({p for arch, encoding in MODELS for p in trial_modules(arch, encoding, also=RULES)}):
        tree = ast.parse((ROOT / path).read_text())
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
                        found.add((path, node.module))
                    elif isinstance(node, ast.Import):
                        found |= {(path, a.name) for a in node.names if a.name.startswith("pipeline")}
    assert found == {("pipeline/data/prepared.py", "pipeline.io")}


def test_every_module_the_prepare_stage_imports_is_a_dvc_dep() -> None:
    # (The tune stage depends on the trial code only, by design: its driver code cannot change a trained result.)
    imported = _project_modules_imported_by("stages.prepare")
    imported -= {"stages/__init__.py"}  # an empty package marker
    assert "pipeline/data/sources.py" in imported
    missing = sorted(path for path in imported if not _covered(path, STAGES["prepare"]["deps"]))
    assert not missing, f"stages.prepare imports modules its dvc.yaml deps miss: {missing}"


def _copy_of_the_code(tmp_path: Path) -> Path:
    for folder in ("pipeline", "analysis", "benchmarks", "stages"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _edit(root: Path, path: str, old: str, new: str) -> None:
    text = (root / path).read_text()
    assert text.count(old) == 1, (path, old)
    (root / path).write_text(text.replace(old, new))


@pytest.mark.parametrize(
    "edited",
    [
        "pipeline/sweep/tracking/callback.py",
        "pipeline/measure/tables.py",
        "pipeline/io.py",
        "pipeline/data/sources.py",
        "pipeline/models/pruning.py",  # the prune stage's rule: in the fine-tuned models' identity, no trial's
        "analysis/__init__.py",
        "benchmarks/train_speed.py",
        "stages/tune.py",
    ],
)
def test_editing_driver_or_measuring_code_keeps_every_identity(tmp_path: Path, edited: str) -> None:
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    with (root / edited).open("a") as handle:
        handle.write("\nEDITED = 1\n")
    assert _identities(root) == before


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        ("pipeline/models/quadratic.py", '"""Isotropic Gaussian attention', '"""Isotropic (edited) Gaussian attention'),
        (
            "pipeline/models/attention.py",
            "from contextlib import nullcontext\n",
            "from contextlib import nullcontext  # x\n",
        ),
        ("pipeline/trial/loop.py", "import logging\n", "import logging\n\n\n# a comment\n"),
        ("pipeline/encodings.py", '"""The declaration of one encoding', '"""The declared form of one encoding'),
        # a driver setting, and a field the trial never reads, in the config
        ("pipeline/config.py", 'experiment: str = "attention-cnn"', 'experiment: str = "attention"'),
        (
            "pipeline/config.py",
            "class TrackingConfig(_Section):",
            "class TrackingConfig(_Section):\n    extra: int = 1",
        ),
    ],
)
def test_docstrings_comments_and_driver_settings_keep_every_identity(
    tmp_path: Path, path: str, old: str, new: str
) -> None:
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    _edit(root, path, old, new)
    assert _identities(root) == before


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        ("pipeline/trial/loop.py", "import logging\n", "import logging\n\nEDITED = 1\n"),
        ("pipeline/models/attention.py", "import torch\n", "import torch\n\nEDITED = 1\n"),
        ("pipeline/data/prepared.py", "import torch\n", "import torch\n\nEDITED = 1\n"),
        ("pipeline/config.py", "    epochs: Epochs = 300\n", "    epochs: Epochs = 301\n"),
        ("pipeline/config.py", "Width = Annotated[int, Field(gt=0, le=65536)]", "Width = Annotated[int, Field(gt=0)]"),
    ],
)
def test_editing_what_every_trial_runs_changes_every_identity(tmp_path: Path, path: str, old: str, new: str) -> None:
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    _edit(root, path, old, new)
    after = _identities(root)
    assert all(after[model] != before[model] for model in MODELS)


def test_a_new_module_a_trial_imports_changes_every_identity(tmp_path: Path) -> None:
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    (root / "pipeline/trial/extra.py").write_text("X = 1\n")
    assert _identities(root) == before  # imported by nothing: no trial runs it
    _edit(root, "pipeline/trial/loop.py", "import logging\n", "import logging\n\nimport pipeline.trial.extra\n")
    changed = _identities(root)
    (root / "pipeline/trial/extra.py").write_text("X = 2\n")
    assert all(before[m] != changed[m] != _identities(root)[m] for m in MODELS)


def test_an_encoding_s_edit_changes_exactly_the_models_built_on_it(tmp_path: Path) -> None:
    """The quadratic encoding's scores: its models, GPSA (which starts from it) and the transformed ResNet (whose
    convolutions it rebuilds), not the other encodings nor ResNet18."""
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    _edit(root, "pipeline/models/quadratic.py", "return -0.5 * self.spreads", "return -0.25 * self.spreads")
    after = _identities(root)
    changed = {model for model in MODELS if after[model] != before[model]}
    assert changed == {("sa", "quadratic"), ("sa", "gpsa"), ("t_resnet18", DEFAULT_ENCODING)}


def test_a_new_encoding_changes_no_identity(tmp_path: Path) -> None:
    """The recipe of docs/study.md: one module, one registry entry (with a field of its own)."""
    root = _copy_of_the_code(tmp_path)
    before = _identities(root)
    (root / "pipeline/models/flat.py").write_text(FLAT_ENCODING)
    _edit(root, "pipeline/encodings.py", "\n}\n\nDEFAULT_ENCODING", FLAT_ENTRY + "}\n\nDEFAULT_ENCODING")
    assert _identities(root) == before
    assert "pipeline/models/flat.py" in trial_modules("sa", "flat", root=root)
    assert trial_code("sa", "flat", root=root) not in before.values()


FLAT_ENCODING = """import torch
from torch import Tensor, nn

from pipeline.models.positional import PositionalEncoding


class FlatEncoding(PositionalEncoding):
    def __init__(self, num_heads: int, max_grid: int, flat_scale: float = 1.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = nn.Parameter(torch.full((num_heads,), flat_scale))

    def scores(self, grid: tuple[int, int]) -> Tensor:
        return self.scale[:, None, None] * self._offsets(grid, self.scale).sum(-1)[None]
"""
FLAT_ENTRY = """    "flat": EncodingSpec(
        target="pipeline.models.flat:FlatEncoding",
        label="flat",
        summary="a scale per head times the shift's row plus column",
        fields={"flat_scale": (float, 1.0)},
    ),
"""


def test_the_identity_used_is_this_checkout_s() -> None:
    assert identity.PROJECT_ROOT == ROOT and trial_code("sa", "quadratic") == trial_code("sa", "quadratic", root=ROOT)


def test_encoding_names_in_config_are_the_registry_entries() -> None:
    assert set(typing.get_args(EncodingName)) == set(ENCODINGS)


def test_no_project_file_cites_documents_outside_the_repository() -> None:
    listed = project_files(ROOT)
    this_file = Path(__file__).resolve().relative_to(ROOT).as_posix()
    needles = ("shared/docs", "../shared", "ecosystem.md", "DESIGN.md", "STYLE.md", "ROADMAP.md", "paper.md")
    cited = [
        f"{name}: {needle}"
        for name in listed
        if name != this_file and (ROOT / name).is_file() and name.endswith((".py", ".md", ".yaml", ".toml", "ignore"))
        for needle in needles
        if needle in (ROOT / name).read_text(errors="replace")
    ]
    assert not cited, cited
