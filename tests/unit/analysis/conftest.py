"""What the report-section tests share: a stand-in for ``analysis.study``'s figure writer that records what it made."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def recording_writer() -> tuple[Callable[..., None], list[str]]:
    """``(add, added)``: ``add(name, title, build, into)`` builds the figure (which must not fail, i.e. return a
    message string), appends its name to ``into`` as the study's writer does, and records it in ``added``."""
    added: list[str] = []

    def add(name: str, title: str, build: Callable[[], object], into: list) -> None:
        made = build()
        assert not isinstance(made, str)
        added.append(name)
        into.append(name)

    return add, added
