"""A trial's code identity: the normalised source of exactly the code it runs, and the trial's check that it runs it.

A trial of a model (its ``arch`` and ``encoding``) runs:

- the **shared** modules: those its entry modules (``ENTRY_MODULES``: the trainable, and the prepared data it
  unpickles) import when they are imported, followed statically, their packages' ``__init__`` included;
- its **own** module: the class of its architecture (``pipeline.models.ARCHITECTURES``) or, for the self-attention
  net, of its encoding (the registry's ``target``, ``pipeline.encodings``), with what that imports in turn (GPSA
  imports the quadratic encoding it starts from). Nothing imports these by name, so one encoding's edit is no other
  trial's;
- of ``pipeline.encodings``, everything but the other kinds' entries; of ``pipeline.config``, the trial's sections
  (``ModelConfig``, ``TrainConfig``) and what they are defined from, not the driver's settings. The values a trial
  gets from its config are in its key (``pipeline.sweep.identity.trial_key``).

Each module counts as its normalised source (``ast`` parsed and unparsed, docstrings dropped): a comment, a docstring
or a reformatting changes no identity; any other edit of what a trial runs does. ``ast.unparse`` is Python's own, so
another Python minor version may write a module differently: a new interpreter can retrain a study once. An import
inside a function is not followed: the model's own module is the one such import a trial makes (``build_model``),
and a test keeps it so.

``TRIAL_CODE`` is coarser: the paths that hold every trial's code, ``dvc.yaml``'s deps of the training stages (DVC
re-runs the stage on any edit there; the stage then reuses every trial whose identity is unchanged).

It lives in the trial package, so a trial computes its own identity without importing the driver: on a cluster a
node could import another copy of the project (an old install, another checkout) instead of the code shipped with
the job, and train something else under the sweep's name.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding pipeline/

# Paths relative to the project root: files, or folders whose every .py file counts (``dvc.yaml``'s deps).
TRIAL_CODE = (
    "pipeline/__init__.py",
    "pipeline/config.py",
    "pipeline/encodings.py",
    "pipeline/data/__init__.py",
    "pipeline/data/prepared.py",
    "pipeline/data/subset.py",
    "pipeline/models",
    "pipeline/trial",
)
ENTRY_MODULES = ("pipeline.trial.trainable", "pipeline.data.prepared")
REGISTRY = "pipeline.encodings"  # its ``ENCODINGS`` entries: a trial counts its own only
ARCHITECTURES = "pipeline.models"  # its ``ARCHITECTURES`` table names each architecture's module
CONFIG = "pipeline.config"
CONFIG_SECTIONS = ("ModelConfig", "TrainConfig")  # what a trial builds and trains with; the rest is the driver's


def trial_code(arch: str, encoding: str, *, also: Iterable[str] = (), root: Path = PROJECT_ROOT) -> str:
    """The code identity of a trial of a model with ``arch`` and ``encoding``: a hash of the normalised source of
    ``trial_modules`` (``also``: modules beyond the trial's, e.g. a fine-tuning stage's rule that builds its start)."""
    key = (arch, encoding, tuple(also), str(root))
    if (known := _KNOWN.get(key)) and all(_stamp(path) == stamp for path, stamp in known[0]):
        return known[1]  # none of its files changed since (a sweep asks once per trial)
    views = _views(arch, encoding, key[2], root)
    digest = hashlib.sha256()
    for path, source in views:
        digest.update(f"{path}\0{source}\0".encode())
    stamps = tuple((root / path, _stamp(root / path)) for path, _ in views)
    _KNOWN[key] = (stamps, digest.hexdigest()[:12])
    return _KNOWN[key][1]


_KNOWN: dict[tuple, tuple[tuple, str]] = {}  # per model: its files' stamps when last hashed, and the identity


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:  # removed since
        return None
    return stat.st_mtime_ns, stat.st_size


def trial_modules(arch: str, encoding: str, *, also: Iterable[str] = (), root: Path = PROJECT_ROOT) -> list[str]:
    """The files (relative to ``root``) whose normalised source is the identity of a trial of this model."""
    return [path for path, _ in _views(arch, encoding, tuple(also), root)]


def _views(arch: str, encoding: str, also: tuple[str, ...], root: Path) -> list[tuple[str, str]]:
    """(path, normalised source of what the trial runs of it) per module of the trial, sorted by path."""
    own = model_module(arch, encoding, root)
    views = []
    for name in sorted(_imported(root, (*ENTRY_MODULES, own, *also))):
        path = _module_file(root, name)
        source = path.read_bytes()
        if name == REGISTRY:
            view = _registry_view(source, encoding if arch == "sa" else None)
        elif name == CONFIG:
            view = _definitions_view(source, CONFIG_SECTIONS)
        else:
            view = _module_view(source)
        views.append((path.relative_to(root).as_posix(), view))
    return sorted(views)


def model_module(arch: str, encoding: str, root: Path = PROJECT_ROOT) -> str:
    """The module of the class a model of ``arch`` (and ``encoding``) is built from: its architecture's, or its
    encoding's for the self-attention net. Read from the source under ``root``, as the registry declares it."""
    if arch != "sa":
        table = ast.literal_eval(_assigned(root, ARCHITECTURES, "ARCHITECTURES"))
        if arch not in table:
            raise ValueError(f"model.arch: {arch!r} is neither 'sa' nor in pipeline.models.ARCHITECTURES")
        return table[arch].split(":")[0]
    registry = _assigned(root, REGISTRY, "ENCODINGS")
    for key, value in zip(registry.keys, registry.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == encoding and isinstance(value, ast.Call):
            target = next((k.value for k in value.keywords if k.arg == "target"), None)
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                return target.value.split(":")[0]
    raise ValueError(f"model.encoding: {REGISTRY}.ENCODINGS has no entry {encoding!r} with a literal target")


def _assigned(root: Path, module: str, name: str) -> ast.expr:
    """The value assigned to ``name`` at the top of ``module`` (under ``root``)."""
    tree = _parsed(_module_file(root, module).read_bytes())
    for stmt in tree.body:
        if name in _bound(stmt) and isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            return stmt.value
    raise ValueError(f"{module}: no {name} assigned at the top level")


def _module_file(root: Path, name: str) -> Path | None:
    """The file of project module ``name`` under ``root`` (a package's ``__init__.py``), None if it is not one."""
    base = os.path.join(root, *name.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return Path(candidate)
    return None


def _imported(root: Path, modules: Iterable[str]) -> set[str]:
    """``modules`` and every project module they import when imported, transitively, with their packages."""
    seen: set[str] = set()
    looked: set[str] = set()  # every name looked up, found or not (torch, a class imported from a module)
    projects = {path.stem for path in root.iterdir() if path.suffix == ".py" or path.is_dir()}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in looked or name.partition(".")[0] not in projects:
            continue
        looked.add(name)
        if (path := _module_file(root, name)) is None:
            continue
        seen.add(name)
        todo.extend(name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1))  # its packages run first
        todo.extend(_imports(path.read_bytes(), name, path.name == "__init__.py"))
    return seen


@functools.lru_cache(maxsize=1024)
def _imports(source: bytes, name: str, package: bool) -> tuple[str, ...]:
    """The modules (and, for ``from m import x``, the candidates ``m.x``) an import of ``name`` runs an import of:
    its top-level statements' imports, in ``if`` and ``try`` blocks and class bodies too, not those in functions."""
    found = []
    for node in _import_time(_parsed(source)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one package up per extra dot
                package_name = name if package else name.rpartition(".")[0]
                parent = package_name.rsplit(".", node.level - 1)[0] if node.level > 1 else package_name
                base = f"{parent}.{base}" if base else parent
            found.append(base)
            found.extend(f"{base}.{alias.name}" for alias in node.names)
    return tuple(found)


def _import_time(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node`` that run when it runs, not the bodies of the functions it defines."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _import_time(child)


@functools.lru_cache(maxsize=1024)
def _parsed(source: bytes) -> ast.Module:
    """The module's syntax tree without docstrings (any statement that is a string alone); not to be modified."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for block in ("body", "orelse", "finalbody"):
            statements = getattr(node, block, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                kept = [s for s in statements if not _is_string(s)]
                setattr(node, block, kept or ([ast.Pass()] if block == "body" else []))
    return tree


def _is_string(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


@functools.lru_cache(maxsize=1024)
def _module_view(source: bytes) -> str:
    """The whole module, normalised: parsed, without docstrings, unparsed (no comments, one formatting)."""
    return ast.unparse(_parsed(source))


@functools.lru_cache(maxsize=256)
def _registry_view(source: bytes, encoding: str | None) -> str:
    """The registry with ``ENCODINGS`` holding only ``encoding``'s entry (none: a model built from no encoding)."""
    tree = copy.deepcopy(_parsed(source))
    for stmt in tree.body:
        if "ENCODINGS" in _bound(stmt) and isinstance(stmt.value, ast.Dict):
            pairs = [
                (key, value)
                for key, value in zip(stmt.value.keys, stmt.value.values, strict=True)
                if isinstance(key, ast.Constant) and key.value == encoding
            ]
            stmt.value.keys, stmt.value.values = [k for k, _ in pairs], [v for _, v in pairs]
    return ast.unparse(tree)


@functools.lru_cache(maxsize=256)
def _definitions_view(source: bytes, names: tuple[str, ...]) -> str:
    """The top-level statements that define ``names`` and, transitively, the module's names those use (an import
    reduced to the names used); a statement binding nothing (a call) counts when it uses a name that counts."""
    tree = _parsed(source)
    wanted: set[str] = set()
    chosen: set[int] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        for index, stmt in enumerate(tree.body):
            binds = _bound(stmt)
            if index not in chosen and (name in binds or (not binds and name in _used(stmt))):
                chosen.add(index)
                if not isinstance(stmt, ast.Import | ast.ImportFrom):
                    todo.extend(_used(stmt))
    kept = []
    for index in sorted(chosen):
        stmt = tree.body[index]
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            stmt = copy.copy(stmt)
            stmt.names = [alias for alias in stmt.names if _alias_name(alias) in wanted]
        kept.append(stmt)
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


def _alias_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _bound(stmt: ast.stmt) -> set[str]:
    """The top-level names ``stmt`` binds."""
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {_alias_name(alias) for alias in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}


def _used(stmt: ast.stmt) -> set[str]:
    return {node.id for node in ast.walk(stmt) if isinstance(node, ast.Name)}


class TrialCodeMismatch(RuntimeError):
    """This worker imports other trial code than the driver that named the sweep."""


def check_trial_code(expected: str | None, arch: str, encoding: str) -> None:
    """Raise when the code this worker would run for a trial of this model differs from the driver's (``expected``,
    its ``trial_code``); None checks nothing."""
    if expected is None:
        return
    if (found := trial_code(arch, encoding)) != expected:
        import ray

        raise TrialCodeMismatch(
            f"trial code {found} (from {Path(PROJECT_ROOT)}) on node {ray.util.get_node_ip_address()}, but the driver "
            f"runs {expected}: this node does not import the code shipped with the job (runtime_env working_dir); "
            "check its PYTHONPATH and installed packages"
        )
