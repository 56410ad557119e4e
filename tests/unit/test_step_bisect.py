"""The NaN bisection of the GPU evidence (``benchmarks.step_bisect``): its report, and the paths a CPU can run."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import step_bisect
from pipeline.config import ModelConfig

TINY_SA = ModelConfig(hidden=8, layers=2, heads=4, ffn=16, learned_dim=8, resnet_width=4)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_report_names_the_first_path_that_departs_and_by_how_much_per_step():
    eager = [2.0, 1.9, 1.8, 1.7]
    losses = {
        "eager": eager,
        "compiled": [2.0, 1.9 * (1 + 1e-4), 1.8, 1.7],  # within the tolerance
        "graphed": [2.0, 1.9, 1.8 * 1.1, math.nan],  # 10 % off at step 2, then NaN
        "whole-step": [2.0, math.nan, math.nan, math.nan],
    }
    report = step_bisect.departures(losses, tolerance=1e-3)
    assert report["first_departing_path"] == "graphed"  # in the paths' order, not the earliest step
    graphed = report["paths"]["graphed"]
    assert graphed["departs_at"] == 2 and graphed["first_non_finite"] == 3
    assert graphed["rel_diff"][2] == pytest.approx(0.1) and graphed["rel_diff"][3] == math.inf
    assert report["paths"]["compiled"]["departs_at"] is None
    assert report["paths"]["compiled"]["rel_diff"][1] == pytest.approx(1e-4)
    assert report["paths"]["whole-step"]["departs_at"] == 1


def test_eager_and_compiled_agree_on_the_cpu_and_cuda_paths_are_said_skipped():
    """The CPU's share of the bisection at tiny size: the compiled path (Dynamo + AOTAutograd, no code generation)
    trains the same ten steps as eager, from the same weights and batches."""
    result = step_bisect.bisect(TINY_SA, torch.device("cpu"), 4, backend="aot_eager", image_size=8)
    assert result["first_departing_path"] is None and result["failed"] == {}
    paths = result["paths"]
    assert list(paths) == ["eager", "compiled"]
    assert len(paths["eager"]["losses"]) == step_bisect.STEPS
    assert all(math.isfinite(v) for v in paths["eager"]["losses"])
    assert max(paths["compiled"]["rel_diff"]) <= 1e-5
    assert result["skipped"] == {"graphed": "needs CUDA", "whole-step": "needs CUDA"}


def test_a_path_that_fails_is_named_and_the_others_still_run(monkeypatch):
    real = step_bisect.run_path

    def failing(path, *args):
        if path == "compiled":
            raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten\nStack trace")
        return real(path, *args)

    monkeypatch.setattr(step_bisect, "run_path", failing)
    result = step_bisect.bisect(TINY_SA, torch.device("cpu"), 4, paths=("eager", "compiled"), image_size=8)
    assert result["first_departing_path"] == "compiled"
    assert result["failed"] == {
        "compiled": "RuntimeError: accessing tensor output of CUDAGraphs that has been overwritten"
    }
    assert list(result["paths"]) == ["eager"]
