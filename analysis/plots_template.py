"""The page ``dvc plots show`` writes, drawable without a network: Vega, Vega-Lite and Vega-Embed inlined.

DVC's own page loads the three libraries from a CDN (``cdn.jsdelivr.net``), so on a cluster or a laptop offline the
accuracy and locality curves render as nothing, silently. DVC takes a page template instead (``.dvc/config``:
``plots.html_template``, relative to ``.dvc/``); where it has no ``{scripts}`` placeholder DVC adds no CDN tags, and
the inlined libraries define the globals DVC's plot snippets call (``vegaEmbed``). The versions are DVC 3.67's own
(dvc-render's CDN tags), so the specs it writes draw as DVC intends. The template is committed (about 0.8 MB, so a
clone needs no network); this module rebuilds it from the npm registry, each archive checked against the registry's
published sha512 before use: ``python -m analysis.plots_template`` from the repository root.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

TEMPLATE = Path(".dvc/plots/offline.html")
# (package, version, the registry's dist.integrity): loaded in this order, each needs the ones before it.
LIBRARIES = (
    (
        "vega",
        "5.20.2",
        "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5jQ80EVw==",
    ),
    (
        "vega-lite",
        "5.2.0",
        "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
    ),
    (
        "vega-embed",
        "6.18.2",
        "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
    ),
)
REGISTRY = "https://registry.npmjs.org"
# DVC's snippets call vegaEmbed(element, spec) with no options: draw as SVG, so every mark is an element of the page
# (a browser test can count them; the curves stay sharp when zoomed).
SVG_RENDERER = """    <script>
        const embedOnCanvas = vegaEmbed;
        window.vegaEmbed = (element, spec, options) => embedOnCanvas(element, spec, {renderer: "svg", ...options});
    </script>"""
# dvc-render's page (PAGE_HTML) less its {scripts} placeholder; {refresh_tag} and {plot_divs} are DVC's to fill.
PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <title>DVC Plot</title>
    <!-- {notice} -->
{scripts}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def minified_build(package: str, version: str, integrity: str) -> str:
    """``build/<package>.min.js`` from the package's npm archive, refused unless the archive has the published hash."""
    url = f"{REGISTRY}/{package}/-/{package}-{version}.tgz"
    with urllib.request.urlopen(url, timeout=60) as answer:
        archive = answer.read()
    algorithm, expected = integrity.split("-", 1)
    if base64.b64encode(hashlib.new(algorithm, archive).digest()).decode() != expected:
        raise ValueError(f"{url}: the archive does not match the registry's {algorithm} ({integrity})")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile(f"package/build/{package}.min.js")
        if member is None:
            raise ValueError(f"{url}: no build/{package}.min.js in the archive")
        code = member.read().decode()
    if "</script" in code:
        raise ValueError(f"{url}: build/{package}.min.js contains '</script' and cannot be inlined as it is")
    return code


def page(builds: dict[str, str]) -> str:
    """The template: DVC's page with each library's code in its own inline script, in ``LIBRARIES``' order."""
    notice = ", ".join(f"{name} {version}" for name, version, _ in LIBRARIES)
    scripts = "\n".join(f"    <script>/* {name} */\n{builds[name]}\n    </script>" for name, _, _ in LIBRARIES)
    scripts += "\n" + SVG_RENDERER
    return PAGE.format(notice=f"inlined for offline use: {notice} (BSD-3-Clause, the Vega project)", scripts=scripts)


def write_template(path: Path = TEMPLATE) -> Path:
    """Download, check and inline the libraries into ``path``."""
    builds = {name: minified_build(name, version, integrity) for name, version, integrity in LIBRARIES}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(builds))
    return path


if __name__ == "__main__":
    print(write_template())
