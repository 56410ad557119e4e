"""Every model variant: shapes, finite outputs, a gradient for every parameter, exact paper sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch._subclasses.fake_tensor import FakeTensorMode

from pipeline.config import PAPER_VARIANTS, ModelConfig
from pipeline.measure.counting import count_flops, count_parameters
from pipeline.measure.reference import PAPER_FIGURES, PAPER_PRUNED_HEADS
from pipeline.models import build_model
from pipeline.models.sa_net import space_to_depth
from pipeline.trial.augment import augment_batch

SMALL = ModelConfig(hidden=16, layers=2, ffn=24, learned_dim=8, resnet_width=4)


def _variant(base: ModelConfig, name: str) -> ModelConfig:
    return PAPER_VARIANTS[name].apply(base)


@pytest.mark.parametrize("name", sorted(PAPER_VARIANTS))
def test_forward_backward_every_variant(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(_variant(SMALL, name), image_size=8, num_classes=7)
    out = model(torch.randn(3, 3, 8, 8))
    assert out.shape == (3, 7)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no (finite) gradient for {missing}"


def _on_fake_device(model: torch.nn.Module, mode: FakeTensorMode, device: str) -> torch.nn.Module:
    """What ``model.to(device)`` does (parameters and buffers move, nothing else), with fake tensors."""
    slots = [
        (module, kind, name, mode.from_tensor(tensor))
        for module in model.modules()
        for kind in ("_parameters", "_buffers")
        for name, tensor in getattr(module, kind).items()
        if tensor is not None
    ]
    with mode:
        for module, kind, name, fake in slots:
            moved = fake.to(device).detach()
            getattr(module, kind)[name] = torch.nn.Parameter(moved) if kind == "_parameters" else moved
    return model


@pytest.mark.parametrize(
    ("name", "heads_per_layer"),
    [(name, None) for name in sorted(PAPER_VARIANTS)]
    + [(name, [2, 0]) for name in sorted(PAPER_VARIANTS) if PAPER_VARIANTS[name].arch == "sa"],  # pruned
)
def test_forward_on_a_fake_cuda_device_never_mixes_devices(name: str, heads_per_layer: list[int] | None) -> None:
    """No GPU in CI, but FakeTensorMode propagates devices without one: a tensor that a forward pass (or the
    on-device augmentation) creates on the CPU and mixes with CUDA activations fails here as it would on a GPU.
    Forward only: the autograd engine needs a real driver (the backward runs in the gpu-marked tests)."""
    model = build_model(_variant(SMALL, name), image_size=16, heads_per_layer=heads_per_layer)
    mode = FakeTensorMode()
    _on_fake_device(model, mode, "cuda")
    with mode:
        images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8, device="cuda")
        batch = augment_batch(images.float() / 255, 2, torch.Generator().manual_seed(0))
        out = model(batch)
        assert out.device.type == "cuda" and out.shape == (3, 10)


@pytest.mark.parametrize("name", sorted(PAPER_VARIANTS))
def test_exact_paper_parameter_counts(name: str) -> None:
    model = build_model(_variant(ModelConfig(), name), image_size=32)
    assert count_parameters(model) == PAPER_FIGURES[name].params


def test_pruned_generalized_model_has_paper_size() -> None:
    cfg = _variant(ModelConfig(), "sa_generalized_9")
    full = build_model(cfg, image_size=32)
    full.prune_heads([list(range(p, 9)) for p in PAPER_PRUNED_HEADS])
    built = build_model(cfg, image_size=32, heads_per_layer=[9 - p for p in PAPER_PRUNED_HEADS])
    ref = PAPER_FIGURES["sa_generalized_9_pruned"]
    assert count_parameters(full) == count_parameters(built) == ref.params
    assert count_flops(full).paper == ref.flops


@pytest.mark.parametrize("name", ["sa_quadratic_9", "sa_quadratic_16", "resnet18"])
def test_paper_convention_flops(name: str) -> None:
    model = build_model(_variant(ModelConfig(), name), image_size=32)
    assert count_flops(model).paper == PAPER_FIGURES[name].flops


def test_full_flops_add_the_attention_sums() -> None:
    model = build_model(ModelConfig(), image_size=32)
    flops = count_flops(model)
    attention_sums = 6 * 2 * 9 * 256 * 256 * 400  # 6 layers x 2 x heads x N x N x D
    assert flops.full == flops.paper + attention_sums == 9_007_112_000
    assert "2 FLOPs" in flops.convention


def test_resnet18_matches_torchvision_but_for_the_cifar_stem() -> None:
    ours = build_model(ModelConfig(arch="resnet18"), image_size=32)
    reference = torchvision.models.resnet18(num_classes=10)
    stem_difference = 64 * 3 * (7 * 7 - 3 * 3)  # 7x7 ImageNet stem vs 3x3 CIFAR stem
    assert count_parameters(reference) - count_parameters(ours) == stem_difference


def test_space_to_depth_channel_order_and_pixel_unshuffle_permutation() -> None:
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    tokens = space_to_depth(images)  # (2, 4, 12)
    # token (0, 0): RGB of pixels (0,0), (0,1), (1,0), (1,1), in that order
    expected = torch.stack([images[0, :, r, c] for r, c in [(0, 0), (0, 1), (1, 0), (1, 1)]]).flatten()
    torch.testing.assert_close(tokens[0, 0], expected)
    # pixel_unshuffle orders channels (C, di, dj); ours is (di, dj, C): a fixed permutation
    unshuffled = F.pixel_unshuffle(images, 2).flatten(2).transpose(1, 2)  # (2, 4, 12)
    perm = torch.tensor([c * 4 + d for d in range(4) for c in range(3)])
    torch.testing.assert_close(tokens, unshuffled[..., perm])


def test_space_to_depth_rejects_odd_images() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        space_to_depth(torch.zeros(1, 3, 5, 4))


def test_unknown_encoding_names_the_valid_ones() -> None:
    from pipeline.models.positional import build_encoding

    with pytest.raises(ValueError, match="valid:.*quadratic"):
        build_encoding("cubic", 4, max_grid=4)


def test_no_weight_decay_covers_centres_and_spreads_only() -> None:
    model = build_model(_variant(SMALL, "sa_quadratic_9"), image_size=8)
    names = model.no_weight_decay()
    assert names == {f"layers.{i}.attention.encoding.{p}" for i in range(2) for p in ("centres", "spreads")}
    learned = build_model(_variant(SMALL, "sa_learned_9"), image_size=8)
    assert learned.no_weight_decay() == set()


def test_attention_maps_and_head_geometry_for_figures() -> None:
    model = build_model(_variant(SMALL, "sa_generalized_9"), image_size=8)
    maps = model.attention_maps((1, 2))
    assert [m.shape for m in maps] == [(9, 4, 4)] * 2
    torch.testing.assert_close(maps[0].sum(dim=(1, 2)), torch.ones(9))
    geometry = model.head_geometry()
    assert geometry[0]["centres"].shape == (9, 2) and geometry[0]["sigma_inv"].shape == (9, 2, 2)
    assert build_model(_variant(SMALL, "sa_learned_9"), image_size=8).head_geometry() is None


def test_a_model_with_a_headless_layer_counts_reports_and_decays() -> None:
    """A layer pruned to no heads (App. A.1) still runs, counts, draws and trains like the others."""
    cfg = _variant(SMALL, "sa_generalized_9")
    full, pruned = build_model(cfg, image_size=8), build_model(cfg, image_size=8, heads_per_layer=[9, 0])
    hidden, tokens = SMALL.hidden, 4 * 4
    assert count_parameters(full) - count_parameters(pruned) == 9 * (6 + hidden * hidden)  # S, Delta, value columns
    assert count_flops(full, (3, 8, 8)).paper - count_flops(pruned, (3, 8, 8)).paper == 9 * 2 * tokens * hidden**2
    geometry = pruned.head_geometry()
    assert geometry[1]["centres"].shape == (0, 2) and geometry[1]["sigma_inv"].shape == (0, 2, 2)
    assert [m.shape for m in pruned.attention_maps((0, 0))] == [(9, 4, 4), (0, 4, 4)]
    assert "layers.1.attention.encoding.centres" in pruned.no_weight_decay()
    pruned(torch.randn(2, 3, 8, 8)).sum().backward()
    assert pruned.layers[1].attention.value.bias.grad is not None


def test_build_model_refuses_negative_head_counts() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        build_model(_variant(SMALL, "sa_quadratic_9"), image_size=8, heads_per_layer=[2, -1])
