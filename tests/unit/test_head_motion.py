"""The finding's measures on hand-built heads: displacement, kernel heads, distinct shifts, degenerate heads and the
accuracy gap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.head_motion import (
    LAYER_COLUMNS,
    distinct_modes,
    finding_summary,
    gap_to_baseline,
    kernel_shifts,
    layer_measures,
    motion_frame,
    uniform_heads,
)

KERNEL_3X3 = [[r, c] for r, c in itertools.product((-1, 0, 1), repeat=2)]


def snapshot(epoch: int, *layers: tuple[list[list[float]], float]) -> dict:
    """A head history entry: per layer, the centres and one isotropic precision ``Sigma^-1 = precision I``."""
    return {
        "epoch": epoch,
        "layers": [
            {"centres": centres, "sigma_inv": [[[precision, 0.0], [0.0, precision]]] * len(centres)}
            for centres, precision in layers
        ],
    }


def test_kernel_shifts_needs_a_near_integer_centre_within_the_radius_and_a_sharp_head() -> None:
    centres = [[0.0, 0.0], [0.45, 0.0], [3.0, 0.0], [1.4, 1.4], [-1.0, 1.0], [-2.2, 1.9]]
    peaks = [0.9, 0.9, 0.9, 0.9, 0.3, 0.6]
    assert kernel_shifts(centres, peaks) == [(0, 0), (0, 0), None, None, None, (-2, 2)]
    # the criteria are parameters: a 3x3 kernel, a stricter distance, a lower bar for sharpness
    assert kernel_shifts(centres, peaks, radius=1)[5] is None
    assert kernel_shifts(centres, peaks, tolerance=0.2)[5] is None  # 0.22 tokens off
    assert kernel_shifts(centres, peaks, min_peak=0.2)[4] == (-1, 1)
    with pytest.raises(ValueError, match="6 centres but 2 peak"):
        kernel_shifts(centres, peaks[:2])


def test_a_sharp_3x3_grid_is_nine_distinct_taps_and_a_broad_init_none() -> None:
    start = [[r + 0.3, c - 0.4] for r, c in KERNEL_3X3]  # 0.5 tokens from the grid
    frame = motion_frame([snapshot(0, (start, 1.0)), snapshot(5, (KERNEL_3X3, 100.0))])
    assert list(frame.columns) == LAYER_COLUMNS
    init, end = frame.iloc[0], frame.iloc[1]
    assert (init.epoch, end.epoch) == (0, 5)
    assert init.displacement == 0.0 and end.displacement == pytest.approx(0.5)
    assert init.kernel_heads == 0 and init.distinct_shifts == 0  # s = 1: about a fifth of the mass on the peak
    assert init.peak_probability < 0.3
    assert end.kernel_heads == 9 and end.distinct_shifts == 9
    assert init.heads_at_distinct_shifts == 0 and end.heads_at_distinct_shifts == 9
    assert init.shifts_by_position == 9 and end.shifts_by_position == 9  # by position the init is there already
    assert init.degenerate == 0 == end.degenerate
    assert end.peak_probability > 0.99
    assert end.mean_attention_distance < init.mean_attention_distance  # sharper and closer
    assert end.centre_norm == pytest.approx(np.mean([np.hypot(r, c) for r, c in KERNEL_3X3]))


def test_heads_on_one_shift_count_once_and_layers_are_separate() -> None:
    crowded = [[1.0, 0.0]] * 4 + [[0.0, 1.0]]
    far = [[3.0, 3.0]] * 5
    history = [snapshot(0, (crowded, 1.0), (far, 1.0)), snapshot(1, (crowded, 100.0), (far, 100.0))]
    end = layer_measures(history[1], history[0])
    assert list(end.layer) == [0, 1]
    assert end.loc[0, "kernel_heads"] == 5 and end.loc[0, "distinct_shifts"] == 2
    assert end.loc[1, "kernel_heads"] == 0  # sharp, but 3 tokens away: outside a 5x5 kernel
    # the four crowded heads put their mass on (1, 0), the fifth on (0, 1): two shifts, however many heads
    assert end.loc[0, "heads_at_distinct_shifts"] == 2 and end.loc[1, "heads_at_distinct_shifts"] == 0
    assert end.loc[0, "shifts_by_position"] == 2
    assert layer_measures(history[1], history[0], radius=3).loc[1, "distinct_shifts"] == 1


def test_histories_without_heads_or_without_the_initialisation() -> None:
    assert motion_frame([]).empty and list(motion_frame([]).columns) == LAYER_COLUMNS
    later = [snapshot(3, ([[0.0, 0.0]], 1.0))]
    with pytest.raises(ValueError, match="starts at epoch 3"):
        motion_frame(later)
    pruned = snapshot(1, ([[0.0, 0.0]], 1.0))
    with pytest.raises(ValueError, match="1 heads now, 2 at init"):
        layer_measures(pruned, snapshot(0, ([[0.0, 0.0], [1.0, 1.0]], 1.0)))


def test_co_located_heads_count_once_and_never_more_than_the_shifts_sharp_heads_occupy() -> None:
    # two sharp heads 0.01 apart on either side of nothing: one shift, one count (a 1-token matching counted 2)
    history = [snapshot(0, ([[0.1, 0.0], [0.11, 0.0]], 1.0)), snapshot(1, ([[0.1, 0.0], [0.11, 0.0]], 50.0))]
    end = layer_measures(history[1], history[0]).iloc[0]
    assert end.kernel_heads == 2 and end.distinct_shifts == 1 and end.heads_at_distinct_shifts == 1
    # six heads at the query: one shift
    six = [snapshot(0, ([[0.0, 0.0]] * 6, 1.0)), snapshot(1, ([[0.0, 0.0]] * 6, 50.0))]
    assert layer_measures(six[1], six[0]).iloc[0].heads_at_distinct_shifts == 1
    # by position the broad init counts where the heads are; sharpness gates the headline count
    assert layer_measures(six[0], six[0]).iloc[0][["heads_at_distinct_shifts", "shifts_by_position"]].tolist() == [0, 1]


def test_distinct_modes_counts_shifts_within_the_radius_once() -> None:
    modes = [[0, 1], [0, 1], [2, -2], [3, 0]]
    assert distinct_modes(modes, [True] * 4) == 2  # (3, 0) is outside the 5x5 neighbourhood
    assert distinct_modes(modes, [True] * 4, radius=3) == 3
    assert distinct_modes(modes, [False, True, False, True]) == 1
    assert distinct_modes(np.zeros((0, 2)), []) == 0


def test_degenerate_heads_are_counted_apart_and_named_with_the_epoch_they_became_uniform() -> None:
    centres = [[1.0, 0.0], [5.0, 5.0], [0.0, 1.0]]
    history = [snapshot(e, (centres, 1.0)) for e in range(3)]
    flat = 1e-7  # below the paper's 1e-5
    history[1]["layers"][0]["sigma_inv"][1] = [[flat, 0.0], [0.0, flat]]  # uniform at epoch 1, back at 2: not named
    history[2]["layers"][0]["sigma_inv"][1] = [[flat, 0.0], [0.0, flat]]
    history[2]["layers"][0]["sigma_inv"][0] = [[1.0, 0.0], [0.0, flat]]  # a stripe: not uniform
    assert uniform_heads(history) == [[(1, 1)]]
    history[1]["layers"][0]["sigma_inv"][1] = [[1.0, 0.0], [0.0, 1.0]]
    assert uniform_heads(history) == [[(1, 2)]]
    end = layer_measures(history[2], history[0]).iloc[0]
    assert end.degenerate == 1
    # the uniform head's far centre (5, 5) is left out of the means: only (1, 0) and (0, 1) count
    assert end.centre_norm == pytest.approx(1.0)
    assert uniform_heads([]) == []


def test_finding_summary_gives_init_and_end_per_layer_numbered_from_one() -> None:
    start = [[r + 0.3, c - 0.4] for r, c in KERNEL_3X3]
    history = [
        snapshot(0, (start, 1.0), ([[3.0, 3.0]] * 2, 1.0)),
        snapshot(1, ([[0.0, 0.0]] * 9, 1.0), ([[3.0, 3.0]] * 2, 1.0)),
        snapshot(2, (KERNEL_3X3, 100.0), ([[2.0, 3.0]] * 2, 100.0)),
    ]
    summary = finding_summary(motion_frame(history)).set_index("layer")
    assert list(summary.index) == [1, 2]
    first, second = summary.loc[1], summary.loc[2]
    assert first.epoch == 2 and first.heads == 9
    assert first.displacement == pytest.approx(0.5)  # init -> last epoch, not -> the middle one
    assert (first.heads_at_distinct_shifts_init, first.heads_at_distinct_shifts) == (0, 9)
    assert (first.kernel_heads_init, first.kernel_heads, first.distinct_shifts) == (0, 9, 9)
    assert first.peak_probability_init < 0.3 < 0.99 < first.peak_probability
    assert first.mean_attention_distance < first.mean_attention_distance_init
    assert second.displacement == pytest.approx(1.0) and second.centre_norm_init == pytest.approx(np.hypot(3, 3))
    assert second.heads_at_distinct_shifts == 0  # two sharp heads at (2, 3): outside the 5x5 neighbourhood
    assert finding_summary(motion_frame([])).empty


def test_gap_to_baseline_in_points() -> None:
    gaps = gap_to_baseline(
        {"resnet18": 0.99, "sa_quadratic_9": 0.95, "sa_learned_9": 1.0, "bad": float("nan")}, "resnet18"
    )
    assert gaps.keys() == {"sa_quadratic_9", "sa_learned_9", "bad"}
    assert gaps["sa_quadratic_9"] == pytest.approx(4.0) and gaps["sa_learned_9"] == pytest.approx(-1.0)
    assert np.isnan(gaps["bad"])
    assert gap_to_baseline({"sa_quadratic_9": 0.9}, "resnet18") == {}
