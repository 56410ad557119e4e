"""Theorem 1 on a whole trained network: a trained ResNet18 and its attention rebuild give the same logits."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from pipeline.config import ModelConfig
from pipeline.models import build_model
from pipeline.models.conv_to_attention import ConvAsAttention
from pipeline.models.resnet import ResNet18
from pipeline.models.transformed_resnet import TransformedResNet18, transform_resnet
from pipeline.trial.locality import attention_layers, measure_locality

IMAGE = (3, 8, 8)  # the default study's digits
FLOAT32_BOUND = 1e-4  # measured on this tiny net: ~1e-6 (summation order); the stage's check uses accuracy


@functools.cache
def _trained() -> tuple[ResNet18, torch.Tensor, torch.Tensor]:
    """A width-4 ResNet18 after 10 SGD steps on a fixed random task: trained weights and batch-norm statistics."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ResNet18(num_classes=10, width=4)
    images, labels = torch.randn(64, *IMAGE, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(10):
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return model.eval(), images, labels


def _trained_resnet() -> tuple[ResNet18, torch.Tensor, torch.Tensor]:
    """A copy of the trained ResNet (trained once per session), its images and labels."""
    model, images, labels = _trained()
    return copy.deepcopy(model), images, labels


def test_every_spatial_convolution_is_attention() -> None:
    resnet, _, _ = _trained_resnet()
    model = transform_resnet(resnet)
    assert model.converted[0] == "stem.0" and len(model.converted) == 17  # stem + 2 per block x 8 blocks
    assert all(isinstance(layer, ConvAsAttention) for layer in model.attention_layers())
    assert all(layer.attention.num_heads == 9 for layer in model.attention_layers())
    kept = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert kept and all(m.kernel_size == (1, 1) for m in kept)  # the shortcuts stay convolutions
    strided = [model.get_submodule(n).stride for n in model.converted]
    assert strided.count((2, 2)) == 3  # the first conv of stages 2-4: attention, then fixed subsampling
    assert model.classifier.weight.data_ptr() != resnet.classifier.weight.data_ptr()  # a copy: the source is intact


def test_float64_logits_equal_the_trained_resnet() -> None:
    resnet, images, _ = _trained_resnet()
    resnet = resnet.double()
    with torch.no_grad():
        expected, got = resnet(images.double()), transform_resnet(resnet)(images.double())
    assert got.dtype == torch.float64
    assert (got - expected).abs().max().item() <= 1e-9


def test_float32_logits_and_accuracy_equal_the_trained_resnet() -> None:
    resnet, images, labels = _trained_resnet()
    with torch.no_grad():
        expected, got = resnet(images), transform_resnet(resnet)(images)
    assert (got - expected).abs().max().item() <= FLOAT32_BOUND
    assert torch.equal(got.argmax(1), expected.argmax(1))
    assert (got.argmax(1) == labels).float().mean() == (expected.argmax(1) == labels).float().mean()


def test_too_small_alpha_is_not_the_resnet() -> None:
    """The check can fail: with alpha = 1 each head leaks to its neighbours and the logits move."""
    resnet, images, _ = _trained_resnet()
    resnet = resnet.double()
    with torch.no_grad():
        error = (transform_resnet(resnet, alpha=1.0)(images.double()) - resnet(images.double())).abs().max().item()
    assert error > 1e-3


def test_built_from_config_loads_a_converted_checkpoint() -> None:
    """The fine-tuning trial builds the architecture from its config, then loads the converted weights."""
    resnet, images, _ = _trained_resnet()
    converted = transform_resnet(resnet)
    built = build_model(ModelConfig(arch="t_resnet18", resnet_width=4), image_size=8)
    assert isinstance(built, TransformedResNet18)
    built.load_state_dict(converted.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(built.eval()(images), converted(images), rtol=0, atol=0)


def test_heads_sit_on_their_taps_and_are_measured() -> None:
    resnet, images, _ = _trained_resnet()
    model = transform_resnet(resnet)
    taps = torch.tensor([[i, j] for i in (-1, 0, 1) for j in (-1, 0, 1)], dtype=torch.float32)
    for layer in model.head_geometry():
        torch.testing.assert_close(layer["centres"], taps)
    # A stride-2 layer attends over its input's padded grid, then subsamples: stages 2-4 start one grid up.
    assert model.layer_grids(IMAGE) == [(10, 10)] * 6 + [(6, 6)] * 4 + [(4, 4)] * 4 + [(3, 3)] * 3
    locality = measure_locality(model, images[:4])
    assert len(locality) == len(attention_layers(model)) == 17
    assert locality[0]["peak_probability"] == pytest.approx([1.0] * 9)  # Lemma 1: one key per head
    assert model.no_weight_decay() and all(".encoding." in n for n in model.no_weight_decay())
