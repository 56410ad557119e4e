"""Which device a trial trains on, from the GPUs Ray gave it and what torch finds (CUDA patched off: no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.trial.device import flush_subnormals, gpu_tags, trial_train_config


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")


def test_a_trial_given_a_gpu_without_cuda_fails_in_one_line_naming_the_option(no_cuda: None) -> None:
    with pytest.raises(ValueError) as raised:
        trial_train_config(TrainConfig(), [1], cpu_fallback=False)
    message = str(raised.value)
    assert "\n" not in message
    assert "Ray assigned this trial GPU [1] (CUDA_VISIBLE_DEVICES=1) but torch finds no CUDA device" in message
    assert "sweep.resources.cpu_fallback: true" in message


def test_cpu_fallback_trains_on_the_cpu_and_says_so(no_cuda: None, caplog: pytest.LogCaptureFixture) -> None:
    assert trial_train_config(TrainConfig(), [1], cpu_fallback=True).device == "cpu"
    assert "training on the CPU (sweep.resources.cpu_fallback: true)" in caplog.text


def test_cpu_fallback_never_overrides_an_explicit_cuda(no_cuda: None) -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        trial_train_config(TrainConfig(device="cuda"), [0], cpu_fallback=True)


def test_a_trial_without_a_gpu_trains_on_the_cpu() -> None:
    assert trial_train_config(TrainConfig(), [], cpu_fallback=False).device == "cpu"
    with pytest.raises(ValueError, match="Ray assigned this trial no GPU"):
        trial_train_config(TrainConfig(device="cuda"), [], cpu_fallback=False)


def test_gpu_tags_name_rays_gpus_and_what_the_process_sees(no_cuda: None) -> None:
    assert gpu_tags([]) == {}
    assert gpu_tags([1]) == {"ray.gpu_ids": "1", "cuda_visible_devices": "1"}


def _flushing() -> bool:
    """Whether this thread computes subnormals as zero now (torch has no getter for the flag)."""
    return torch.tensor([1e-39]).item() == 0.0  # below float32's smallest normal number, 1.2e-38


def test_a_cpu_trial_computes_subnormals_as_zero() -> None:
    """A sharpened head's far probabilities are subnormal floats, which x86 computes on many times slower. (A trial
    that ran earlier in this process left the flag on: the test puts back whatever it found.)"""
    before = _flushing()
    try:
        torch.set_flush_denormal(False)
        assert not _flushing()
        flush_subnormals(torch.device("cpu"))
        assert _flushing() and (torch.full((4,), 1e-20) * 1e-20).eq(0).all()
    finally:
        torch.set_flush_denormal(before)
