"""The attention layer and its encodings: scores as in the paper, batched probabilities, pruning."""

from __future__ import annotations

import pytest
import torch

from pipeline.encodings import positional_encodings
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.generalized_quadratic import GeneralizedQuadraticEncoding
from pipeline.models.learned import LearnedRelativeEncoding
from pipeline.models.positional import build_encoding, relative_offsets
from pipeline.models.quadratic import QuadraticEncoding

GRID = (3, 4)


def _encodings(heads: int = 4) -> list:
    torch.manual_seed(0)
    return [build_encoding(name, heads, max_grid=4, learned_dim=6) for name in positional_encodings()]


def test_relative_offsets_are_key_minus_query() -> None:
    delta = relative_offsets(*GRID)
    assert delta.shape == (12, 12, 2)
    q, k = 1 * 4 + 2, 2 * 4 + 0  # query (1, 2), key (2, 0)
    assert delta[q, k].tolist() == [1, -2]


def test_quadratic_score_is_eq9() -> None:
    enc = QuadraticEncoding(2)
    scores = enc.scores(GRID)
    delta = relative_offsets(*GRID).double()
    for h in range(2):
        expected = -0.5 * enc.spreads[h] ** 2 * ((delta - enc.centres[h]) ** 2).sum(-1)
        torch.testing.assert_close(scores[h], expected.float())


def test_generalized_score_is_the_mahalanobis_form_and_sigma_is_psd() -> None:
    enc = GeneralizedQuadraticEncoding(3, spread_init_std=0.5)
    sigma_inv = enc.sigma_inv()
    assert (torch.linalg.eigvalsh(sigma_inv) >= -1e-6).all()
    diff = relative_offsets(*GRID).float()[None] - enc.centres[:, None, None]  # (H, N, N, 2)
    expected = -0.5 * (diff @ sigma_inv[:, None]).mul(diff).sum(-1)
    torch.testing.assert_close(enc.scores(GRID), expected)


def test_generalized_equals_quadratic_when_sigma_is_isotropic() -> None:
    quad, gen = QuadraticEncoding(3), GeneralizedQuadraticEncoding(3)
    with torch.no_grad():
        gen.centres.copy_(quad.centres)
        gen.sqrt_sigma_inv.copy_(quad.spreads[:, None, None] * torch.eye(2))
    torch.testing.assert_close(gen.scores(GRID), quad.scores(GRID))


def test_learned_scores_depend_on_shift_only() -> None:
    enc = LearnedRelativeEncoding(2, max_grid=4, learned_dim=6)
    scores = enc.scores(GRID)
    # queries (0,0)->key (1,1) and (1,2)->(2,3) share the shift (1, 1)
    torch.testing.assert_close(scores[:, 0 * 4 + 0, 1 * 4 + 1], scores[:, 1 * 4 + 2, 2 * 4 + 3])
    with pytest.raises(ValueError, match="max_grid"):
        enc.scores((5, 5))


def test_quadratic_initialisation_follows_the_authors_code() -> None:
    torch.manual_seed(0)
    enc = QuadraticEncoding(20000)
    assert enc.centres.std().item() == pytest.approx(2.0, rel=0.03)
    assert enc.spreads.mean().item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("enc", _encodings(), ids=positional_encodings())
def test_batched_attention_equals_per_image_loop(enc) -> None:
    layer = MultiHeadSelfAttention(enc, in_dim=5, out_dim=7).eval()
    x = torch.randn(3, 12, 5)
    out = layer(x, GRID)
    probs = layer.attention_probs(GRID)  # (H, N, N)
    for b in range(3):
        heads = torch.cat([probs[h] @ x[b] for h in range(enc.num_heads)], dim=-1)  # (N, H*D)
        torch.testing.assert_close(out[b], layer.value(heads))


def _permuted_mixture(layer: MultiHeadSelfAttention, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The layer as it computed the head mixture until 2026-11-29: heads mixed in (H, N, B, D) order, then permuted
    (a copy of H times the activations) to the (B, N, H*D) rows the output projection reads."""
    B, N, D = x.shape  # noqa: N806
    H = layer.num_heads  # noqa: N806
    probs = layer.attention_dropout(layer.probs_for(x, grid)).to(x.dtype)  # (H, N, N)
    values = x.transpose(0, 1).reshape(N, B * D)  # (N, B*D)
    mixed = (probs.reshape(H * N, N) @ values).view(H, N, B, D).permute(2, 1, 0, 3)  # (B, N, H, D)
    return layer.value(mixed.reshape(B, N, H * D))


@pytest.mark.parametrize("enc", _encodings(), ids=positional_encodings())
def test_the_mixture_without_the_permute_copy_equals_the_old_layer_in_float64(enc) -> None:
    """The layout change alters float32 operation order only: in float64, on the same weights and inputs, outputs and
    every gradient (input, value weights, encoding parameters) agree with the permuting layer to 1e-12."""
    layer = MultiHeadSelfAttention(enc, in_dim=5, out_dim=7).double().eval()
    x = torch.randn(3, 12, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for forward in (layer, lambda x, grid: _permuted_mixture(layer, x, grid)):
        layer.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        out = forward(leaf, GRID)  # (B, N, out)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        results.append([out.detach(), leaf.grad, *(p.grad for p in layer.parameters())])
    for new, old in zip(*results, strict=True):
        torch.testing.assert_close(new, old, rtol=1e-12, atol=1e-12 * old.abs().max().item())


@pytest.mark.parametrize("enc", _encodings(), ids=positional_encodings())
def test_pruning_a_head_equals_zeroing_its_value_columns(enc) -> None:
    layer = MultiHeadSelfAttention(enc, in_dim=5).eval()
    x = torch.randn(2, 12, 5)
    zeroed = MultiHeadSelfAttention(build_encoding("quadratic", 4, max_grid=4), in_dim=5).eval()
    zeroed.load_state_dict(layer.state_dict(), strict=False)
    zeroed.encoding = layer.encoding
    with torch.no_grad():
        zeroed.value.weight[:, 1 * 5 : 2 * 5] = 0  # head 1's input columns
    expected = zeroed(x, GRID)
    layer.prune_heads([0, 2, 3])
    assert layer.num_heads == 3 and layer.value.in_features == 15
    torch.testing.assert_close(layer(x, GRID), expected)


def test_prune_rejects_bad_head_lists() -> None:
    layer = MultiHeadSelfAttention(QuadraticEncoding(3), in_dim=4)
    with pytest.raises(ValueError, match="distinct heads"):
        layer.prune_heads([0, 0, 5])
    with pytest.raises(ValueError, match="distinct heads"):
        layer.prune_heads([3])


@pytest.mark.parametrize("name", positional_encodings())
def test_pruning_every_head_leaves_the_value_bias_as_zeroed_columns_would(name: str) -> None:
    """App. A.1 can empty a layer: with all value columns zero the branch is the bias, and so it stays."""
    torch.manual_seed(0)
    enc = build_encoding(name, 4, max_grid=4, learned_dim=6)
    layer = MultiHeadSelfAttention(enc, in_dim=5, out_dim=7).double().eval()
    x = torch.randn(2, 12, 5, dtype=torch.float64)
    with torch.no_grad():
        layer.value.weight.zero_()
    expected = layer(x, GRID)
    layer.prune_heads([])
    assert layer.num_heads == 0 and layer.value.weight.shape == (7, 0)
    out = layer(x, GRID)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, layer.value.bias.expand(2, 12, 7))
    assert layer.attention_map((0, 0), GRID).shape == (0, *GRID)


@pytest.mark.filterwarnings("error:Initializing zero-element tensors")
@pytest.mark.parametrize("name", positional_encodings())
def test_a_layer_built_without_heads_trains_its_bias(name: str) -> None:
    layer = MultiHeadSelfAttention(build_encoding(name, 0, max_grid=4, learned_dim=6), in_dim=5, out_dim=7)
    assert layer.encoding.scores(GRID).shape == (0, 12, 12)
    out = layer(torch.randn(2, 12, 5), GRID)
    assert out.shape == (2, 12, 7)
    out.sum().backward()
    torch.testing.assert_close(layer.value.bias.grad, torch.full((7,), 24.0))
    no_bias = MultiHeadSelfAttention(build_encoding(name, 0, max_grid=4, learned_dim=6), in_dim=5, bias=False)
    assert torch.equal(no_bias(torch.randn(2, 12, 5), GRID), torch.zeros(2, 12, 5))


def test_attention_map_rows_are_probabilities() -> None:
    layer = MultiHeadSelfAttention(QuadraticEncoding(4), in_dim=4)
    maps = layer.attention_map((2, 3), GRID)
    assert maps.shape == (4, 3, 4)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(4))
    with pytest.raises(ValueError, match="outside"):
        layer.attention_map((3, 0), GRID)


def test_large_spread_gives_one_hot_attention_on_the_centre() -> None:
    enc = QuadraticEncoding(1)
    with torch.no_grad():
        enc.centres.copy_(torch.tensor([[1.0, -1.0]]))
        enc.spreads.fill_((2 * 10.0) ** 0.5)  # alpha = 10
    maps = MultiHeadSelfAttention(enc, in_dim=2).attention_map((1, 1), GRID)
    assert maps[0, 2, 0] > 0.9998  # the paper's oracle: peak 0.9998 at alpha = 10


@pytest.mark.parametrize("name", positional_encodings())
def test_probabilities_are_float32_and_unchanged_under_bf16_autocast(name: str) -> None:
    """Autocast would run the generalized and learned scores' einsum/matmul in bf16; the probabilities (position
    only, shared by the batch) stay exact float32 whatever the training precision, for every encoding alike."""
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(build_encoding(name, 4, max_grid=4, learned_dim=6), in_dim=8)
    exact = layer.attention_probs(GRID)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = layer.attention_probs(GRID)
    assert mixed.dtype == torch.float32
    assert torch.equal(mixed, exact)


def test_a_local_layer_without_heads_matches_the_dense_one() -> None:
    from pipeline.models.local_attention import LocalMultiHeadSelfAttention

    dense = MultiHeadSelfAttention(QuadraticEncoding(0), in_dim=5, out_dim=7)
    with torch.no_grad():
        dense.value.bias.normal_()
    local = LocalMultiHeadSelfAttention.from_dense(dense, window_eps=1e-3)
    x = torch.randn(2, 12, 5)
    torch.testing.assert_close(local(x, GRID), dense.value.bias.expand(2, 12, 7))


@pytest.mark.parametrize("name", positional_encodings())
def test_a_float64_model_keeps_float64_probabilities(name: str) -> None:
    encoding = build_encoding(name, 4, max_grid=5, learned_dim=8).double()
    layer = MultiHeadSelfAttention(encoding, 6).double()
    probs = layer.attention_probs((5, 5))
    reference = torch.softmax(encoding.scores((5, 5)), dim=-1)  # float64 throughout
    assert probs.dtype == torch.float64
    torch.testing.assert_close(probs, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
        ),
    ],
)
def test_the_layer_compiles_as_one_graph_under_autocast(device: str) -> None:
    """A graph break splits a CUDA-graphed step into pieces with host work between them (torch 2.11's Dynamo broke
    on asking whether autocast exists, which made ``train.compile: reduce-overhead`` slower than eager on an H200)."""
    torch._dynamo.reset()
    for encoding in _encodings():
        layer = MultiHeadSelfAttention(encoding, in_dim=6, out_dim=6).to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            explained = torch._dynamo.explain(layer)(torch.randn(2, 12, 6, device=device), GRID)
        assert explained.graph_break_count == 0, (type(encoding).__name__, explained.break_reasons)
