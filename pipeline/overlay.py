"""A params overlay (``params/band.yaml``: only the keys that differ from ``params.yaml``) as ``dvc exp run -S``
overrides, checked against the project's params before DVC runs anything.

Why an overlay and not a second full params file: the band is the default study on more seeds, so it must follow
``params.yaml`` when the default changes (epochs, widths); only the keys it sets differ. Why ``-S``: DVC 3.67's
``dvc exp run -S key=value`` edits ``params.yaml`` the way DVC records an experiment (its params, its name in
``dvc exp show``), so the band is one experiment of the project rather than a second pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import ConfigError, Params, _Loader, parse_params


def leaves(overlay: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted.key, value)`` of every leaf of ``overlay``; a list is one leaf (``-S`` replaces it whole)."""
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(value, f"{dotted}.")
        else:
            yield dotted, value


def override(key: str, value: Any) -> str:
    """One ``-S`` value in DVC's (Hydra's) override grammar: JSON without spaces reads the same there."""
    return f"{key}={json.dumps(value, separators=(',', ':'))}"


def _apply(base: dict[str, Any], key: str, value: Any, source: str) -> None:
    node = base
    *parents, last = key.split(".")
    for i, part in enumerate(parents):
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"{source}: {'.'.join(parents[: i + 1])} is not a section of params.yaml")
        node = node[part]
    node[last] = value


def read_overlay(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: overlay file not found")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: an overlay is a mapping of params.yaml keys to values")
    return raw


def overlay_overrides(path: Path, params_file: Path, extra: list[str] = ()) -> tuple[list[str], Params]:
    """The ``-S`` overrides of the overlay at ``path`` (then ``extra``, ``key=value`` in YAML), and the params they
    give applied to ``params_file``: validated, so a wrong key or value is named before DVC runs."""
    overlay = read_overlay(path)
    # The params file as the stages read it (its loader reads 1e-5 as a number, as YAML 1.2 does)
    merged = yaml.load(params_file.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    pairs = dict(leaves(overlay))
    for item in extra:  # a key set again replaces the overlay's: one -S per key
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected key=value")
        pairs[key] = yaml.safe_load(text)
    for key, value in pairs.items():
        _apply(merged, key, value, str(path))
    params = parse_params(merged, f"{params_file} with {path}")
    return [override(key, value) for key, value in pairs.items()], params
