"""Only the ray.tune.* API: legacy entry points are deprecated or, like ray.train.report inside Tune, hard errors."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray.train.report", "ray.air.session", "tune.run(", "ray.air.RunConfig")


@pytest.mark.parametrize("package", ["pipeline", "stages"])
def test_no_legacy_ray_api(package: str) -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(pattern in line for pattern in FORBIDDEN)
    ]
    assert not hits, "legacy Ray API (use ray.tune.*):\n" + "\n".join(hits)
