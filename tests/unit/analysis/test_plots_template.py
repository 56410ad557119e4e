"""The committed page template of `dvc plots show` draws offline: DVC accepts it, it has the libraries DVC's specs
need inlined in load order, and it never reaches for a CDN (the browser test, test_study_grid.py, draws with it)."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
from dvc_render.html import HTML
from dvc_render.vega import VegaRenderer

from analysis.plots_template import LIBRARIES, TEMPLATE, minified_build, page

ROOT = Path(__file__).resolve().parents[3]


def test_dvc_uses_the_committed_template() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".dvc/config")
    assert (ROOT / ".dvc" / config["plots"]["html_template"]) == ROOT / TEMPLATE


def test_the_template_inlines_the_libraries_dvc_loads_from_its_cdn() -> None:
    text = (ROOT / TEMPLATE).read_text()
    for name, version, _ in LIBRARIES:  # DVC's own versions, in its order
        assert f"npm/{name}@{version}" in VegaRenderer.SCRIPTS
        assert f"<script>/* {name} */" in text
    starts = [text.index(f"<script>/* {name} */") for name, _, _ in LIBRARIES]
    assert starts == sorted(starts)
    assert "cdn." not in text and "{scripts}" not in text
    filled = HTML(text).with_element("<div id='p'></div>").embed()  # DVC's own page code fills it
    assert "{plot_divs}" not in filled and "{refresh_tag}" not in filled and "<div id='p'></div>" in filled


def test_page_keeps_dvcs_placeholders_and_renders_as_svg() -> None:
    text = page({name: f"var {name.replace('-', '_')} = {{}};" for name, _, _ in LIBRARIES})
    assert text.count("{plot_divs}") == 1 and text.count("{refresh_tag}") == 1
    assert 'renderer: "svg"' in text and text.index('renderer: "svg"') > text.index("/* vega-embed */")


def test_an_archive_that_does_not_match_its_hash_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Answer:
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> bytes:
            return b"not the archive the registry published"

    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: Answer())
    name, version, integrity = LIBRARIES[0]
    with pytest.raises(ValueError, match="does not match the registry's sha512"):
        minified_build(name, version, integrity)
