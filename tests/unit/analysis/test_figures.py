"""Every figure renders to a real PNG with a title, from the inputs the analysis stage will hand it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.image import imread

from analysis import figures
from analysis.geometry import heads_frame, locality_frame
from analysis.variants import describe_variants
from pipeline.config import PAPER_VARIANTS, ModelConfig
from pipeline.models import build_model
from pipeline.models.conv_to_attention import theorem_error_vs_alpha
from pipeline.trial.checkpoint import head_snapshot
from pipeline.trial.locality import measure_locality

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _model(variant: str, layers: int = 3):
    torch.manual_seed(0)
    cfg = PAPER_VARIANTS[variant].apply(ModelConfig(hidden=8, layers=layers, ffn=8, learned_dim=4))
    return build_model(cfg, image_size=16)


def _history(model, epochs: int = 3) -> list[dict]:
    history = []
    for epoch in range(epochs):
        history.append(head_snapshot(model, epoch))
        with torch.no_grad():
            for layer in model.layers:
                layer.attention.encoding.centres.mul_(1.2)
    return history


def _titles(fig: Figure) -> str:
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return suptitle + "".join(ax.get_title() for ax in fig.axes)


def _check_png(fig: Figure, path: Path, min_size: tuple[int, int] = (300, 250)) -> None:
    assert _titles(fig).strip(), "figure has no title"
    figures.save(fig, path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width = imread(path).shape[:2]
    assert width >= min_size[0] and height >= min_size[1]
    assert width <= 3000 and height <= 3000  # ~120 dpi, not a poster


def test_head_trajectories(tmp_path: Path) -> None:
    fig = figures.head_trajectories(_history(_model("sa_quadratic_9")), layers=2)
    assert "layer 2" in fig.axes[0].get_title() and "epochs 0-2" in fig._suptitle.get_text()
    assert len(fig.legends[0].get_texts()) == 9 + 3  # heads, query pixel, start, end
    _check_png(fig, tmp_path / "fig2.png")


def test_head_trajectories_one_panel_per_layer_within_the_image(tmp_path: Path) -> None:
    model = _model("sa_quadratic_9")  # 16x16 pixels at downsample 2: an 8x8 token grid
    history = _history(model, epochs=12)  # centres x 1.2 per epoch: some end far beyond the image
    notes = {1: "moved 1.00 tokens", 3: "2 of 9 heads at distinct shifts"}
    fig = figures.head_trajectories(history, layers=[1, 2, 3], grid=(8, 8), panel_notes=notes)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert [ax.get_title().split("\n")[0] for ax in panels] == [
        "layer 1: moved 1.00 tokens",
        "layer 2",
        "layer 3: 2 of 9 heads at distinct shifts",
    ]
    for ax in panels:
        assert ax.get_xlim() == (-7.5, 7.5) and ax.get_ylim() == (7.5, -7.5)  # shifts of an 8x8 grid, not beyond
    last = history[-1]["layers"][0]["centres"]
    beyond = sum(max(abs(r), abs(c)) > 7.5 for r, c in last)
    assert beyond > 0 and f"({beyond} heads end beyond the view)" in panels[0].get_title()
    close = [
        {"epoch": e, "layers": [{"centres": [[0.5 * e, -1.0]], "sigma_inv": [np.eye(2).tolist()]}]} for e in (0, 1)
    ]
    assert figures.head_trajectories(close, layers=[1], grid=(8, 8)).axes[0].get_xlim() == (-3.5, 3.5)  # zoomed in
    _check_png(fig, tmp_path / "fig2_layers.png", min_size=(900, 350))


def test_head_contours_mark_pruned_heads(tmp_path: Path) -> None:
    model = _model("sa_generalized_9", layers=6)
    fig = figures.head_contours(model.head_geometry(), pruned={(0, 1), (5, 8)})
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes][:2] == ["layer 1", "layer 2"]
    dashed_grey = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert len(dashed_grey) == 2  # the pruned head's 50% and 90% contours
    assert "pruned head" in [t.get_text() for t in fig.legends[0].get_texts()]
    _check_png(fig, tmp_path / "fig3.png", min_size=(900, 600))


def test_head_contours_of_16_heads_name_each_head_and_tell_them_apart(tmp_path: Path) -> None:
    """Sixteen heads, nine palette colours: the legend names every head, and no two heads share colour and marker."""
    centres = np.array([[row - 1.5, col - 1.5] for row in range(4) for col in range(4)])
    geometry = [{"centres": centres, "sigma_inv": np.stack([np.eye(2) * 4.0] * 16)}]
    fig = figures.head_contours(geometry, grid=(8, 8))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [label for label in labels if label.startswith("head ")] == [f"head {h}" for h in range(1, 17)]
    centre_marks = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 1]
    styles = {(ln.get_color(), ln.get_marker()) for ln in centre_marks}
    assert len(centre_marks) == 16 and len(styles) == 16
    _check_png(fig, tmp_path / "sixteen.png")


def test_head_contours_span_the_image_shifts_only() -> None:
    geometry = [{"centres": np.array([[0.0, 1.0], [9.0, -9.0]]), "sigma_inv": np.stack([np.eye(2), np.eye(2)])}]
    assert figures.head_contours(geometry, grid=(8, 8)).axes[0].get_xlim() == (-7.5, 7.5)  # an 8x8 token grid
    assert figures.head_contours(geometry).axes[0].get_xlim() == (-10.5, 10.5)  # no grid given: the old bound


def test_head_contours_of_a_flat_head_skip_its_contour(tmp_path: Path) -> None:
    geometry = [{"centres": np.array([[0.0, 1.0], [2.0, 2.0]]), "sigma_inv": np.stack([np.eye(2), np.zeros((2, 2))])}]
    fig = figures.head_contours(geometry)
    assert len([ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) > 1]) == 2  # only head 1's two rings
    assert "uniform head (no position)" in [t.get_text() for t in fig.legends[0].get_texts()]
    _check_png(fig, tmp_path / "flat.png")


def test_head_trajectories_draw_a_head_that_became_uniform_apart(tmp_path: Path) -> None:
    flat = (np.eye(2) * 1e-7).tolist()  # below the paper's 1e-5: attends uniformly
    history = [
        {"epoch": e, "layers": [{"centres": [[0.5 * e, -1.0], [1.0, e]], "sigma_inv": [np.eye(2).tolist(), s]}]}
        for e, s in ((0, np.eye(2).tolist()), (1, flat))
    ]
    fig = figures.head_trajectories(history, layers=[1], grid=(8, 8))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "head 1" in labels and "head 2" not in labels and "became uniform (no position)" in labels
    _check_png(fig, tmp_path / "uniform.png")


def test_attention_maps_of_the_learned_encoding(tmp_path: Path) -> None:
    model = _model("sa_learned_9")
    fig = figures.attention_maps(model.attention_maps((3, 4)), (3, 4))
    images = [image for ax in fig.axes for image in ax.get_images()]
    assert len(images) == 3 * 9 and len(fig.axes) == 3 * 9 + 1  # the panels and one colour bar
    assert len({id(image.norm) for image in images}) == 1  # one shared colour scale
    assert "(3, 4)" in fig._suptitle.get_text()
    _check_png(fig, tmp_path / "fig6.png")


def test_accuracy_curves_draw_each_variant_in_its_colour_on_the_studys_axis(tmp_path: Path) -> None:
    rows = [
        {"variant": v, "seed": s, "epoch": e, "test_acc": 0.5 + 0.01 * e + 0.01 * s}
        for v in ("sa_quadratic_9", "sa_generalized_9", "sa_learned_heads2")
        for s in range(2)
        for e in range(1, 11)
    ]
    rows += [{"variant": "sa_generalized_9_pruned", "seed": 0, "epoch": e, "test_acc": 0.6} for e in range(10, 13)]
    variants = describe_variants({name: {} for name in dict.fromkeys(r["variant"] for r in rows)})
    fig = figures.accuracy_curves(pd.DataFrame(rows), variants, markers={"pruning": 10})
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == [f"{v.label} (n={2 if 'pruned' not in v.name else 1})" for v in variants]
    pruned = next(ln for ln in fig.axes[0].get_lines() if list(ln.get_xdata()) == [10, 11, 12])
    assert pruned.get_color() == next(v.style.colour for v in variants if v.name == "sa_generalized_9_pruned")
    quadratic = next(ln for ln in fig.axes[0].get_lines() if ln.get_color() == variants[0].style.colour)
    np.testing.assert_allclose(quadratic.get_ydata()[0], 100 * 0.515)  # mean over seeds
    assert "band" in fig.axes[0].get_title()
    _check_png(fig, tmp_path / "fig4.png")


def test_theorem_error(tmp_path: Path) -> None:
    torch.manual_seed(0)
    points = theorem_error_vs_alpha(torch.nn.Conv2d(2, 2, 3, padding=1), torch.randn(1, 2, 5, 5), [0.5, 5, 50])
    fig = figures.theorem_error(points + [(1e4, 0.0)])
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    assert "1 exact zeros not drawn" in fig.axes[0].get_title()
    _check_png(fig, tmp_path / "theorem1.png")


def test_locality_curves(tmp_path: Path) -> None:
    frames = []
    for variant in ("sa_quadratic_9", "sa_learned_9"):
        model = _model(variant)
        history = [{"epoch": e, "layers": measure_locality(model, torch.randn(2, 3, 16, 16))} for e in range(3)]
        per_head = locality_frame(history).assign(variant=variant, seed=0)
        frames.append(per_head.groupby(["variant", "seed", "epoch", "layer"], as_index=False)["mean_distance"].mean())
    variants = describe_variants({"sa_quadratic_9": {}, "sa_learned_9": {}})
    fig = figures.locality_curves(pd.concat(frames), variants, threshold=(1.5, "convolution-like"))
    assert fig.axes[0].get_title() == "SA quadratic" and fig.axes[1].get_title() == "SA learned"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["layer 1", "layer 2", "layer 3", "convolution-like"]
    _check_png(fig, tmp_path / "locality.png")


@pytest.mark.parametrize("variant", ["sa_quadratic_9", "sa_learned_9"])
def test_convolution_likeness(variant: str, tmp_path: Path) -> None:
    fig = figures.convolution_likeness(heads_frame(_model(variant)))
    assert len(fig.axes[0].texts) == 3 * 9  # one annotation per head
    _check_png(fig, tmp_path / "convlike.png")
