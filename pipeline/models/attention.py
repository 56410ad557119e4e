"""Multi-head self-attention over a 2D grid of tokens with positional-only scores (Cordonnier et al., Eq. 9-11).

    MHSA(X) = concat_h [ softmax(scores_h) X ] W_out + b_out

Heads run at **full width** (Dh = Dout, App. A.4): each head averages the raw ``in_dim``-wide input with its
attention probabilities, the H results are concatenated (H * in_dim) and one ``Linear(H * in_dim, out_dim)`` maps
them back. Block h of that weight is the per-head ``W(h) = W_val(h) W_out[block h]`` of Eq. 11, which is what
makes the convolution construction of Theorem 1 exact (see ``conv_to_attention.py``).

Because the scores depend on positions only, the (H, N, N) attention probabilities are computed once per forward
pass and applied to the whole batch in one batched matmul, never computed once per image. ``probs_for(x, grid)`` is
the one question every user of the probabilities asks, the forward pass and the locality measured in the trial
(``pipeline.trial.locality``): "which probabilities does this layer apply to this input?". Here the answer ignores
``x``; an attention that reads the content (content + position, as in ConViT's gated heads) overrides
``probs_for`` to return per-image (B, H, N, N) probabilities, and runs and is measured correctly without other changes.

A layer may have **no heads** (pruned to zero, App. A.1): ``value`` is then ``Linear(0, out_dim)`` and the layer
returns its bias at every token, exactly what the layer computed when all its heads' value columns were zero.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor, nn

from pipeline.models.positional import PositionalEncoding, head_linear


class MultiHeadSelfAttention(nn.Module):
    """Position-only multi-head self-attention; ``encoding`` decides how positions become scores."""

    # Whether ``probs_for`` reads the input (content scores): then a Gaussian head's own numbers describe only its
    # positional part, and what the head attends to is measured on real inputs (the analysis reads this).
    reads_content = False

    def __init__(
        self,
        encoding: PositionalEncoding,
        in_dim: int,
        out_dim: int | None = None,
        attention_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.encoding = encoding
        self.in_dim = in_dim
        self.out_dim = out_dim if out_dim is not None else in_dim
        self.value = head_linear(encoding.num_heads * in_dim, self.out_dim, bias=bias)  # W_out, all heads' W(h)
        self.attention_dropout = nn.Dropout(attention_dropout)

    @property
    def num_heads(self) -> int:
        return self.encoding.num_heads

    def attention_probs(self, grid: tuple[int, int]) -> Tensor:
        """Softmax over all keys (query included, no padding): (H, N, N), rows sum to 1.

        At least float32, autocast or not, and never below the model's own precision (a float64 model stays
        float64): the scores depend on positions only, so this costs nothing next to the batch, while bf16 scores
        (autocast runs the generalized and learned encodings' einsum/matmul in bf16) move trained Gaussian heads'
        probabilities by ~1e-3 and would make precision depend on the encoding.
        """
        device_type = next(self.encoding.parameters()).device.type
        # Off where autocast exists; a device without it (``meta``: shapes only, as the memory estimate runs the
        # model) has nothing to turn off. A compiled model runs on a real device, and asking torch 2.11's Dynamo
        # whether autocast exists breaks the graph (a CUDA-graphed step then becomes seven), so it does not ask.
        exact = (
            torch.autocast(device_type, enabled=False)
            if torch.compiler.is_compiling() or torch.amp.is_autocast_available(device_type)
            else nullcontext()
        )
        with exact:
            scores = self.encoding.scores(grid)  # (H, N, N), in the encoding's parameter dtype
            return scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=-1)

    def probs_for(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """The probabilities this layer applies to input ``x`` (B, N, D): (H, N, N), the same for every image,
        because the scores depend on positions only. A subclass whose scores read the content returns (B, H, N, N)."""
        return self.attention_probs(grid)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        B, N, D = x.shape  # noqa: N806 (paper's symbols)
        H = self.num_heads  # noqa: N806
        assert N == grid[0] * grid[1], f"{N} tokens do not fill a {grid} grid"
        assert D == self.in_dim, f"expected {self.in_dim} features, got {D}"
        if H == 0:
            return self.headless(x)
        probs = self.attention_dropout(self.probs_for(x, grid)).to(x.dtype)  # (H, N, N), or (B, H, N, N)
        if probs.dim() == 3:
            # Every image shares the probabilities: rows ordered (query, head), one batched matmul whose output is
            # already (B, N, H, D) in memory, the layout ``value`` reads. Only the small (H, N, N) probabilities are
            # reordered; mixing in (H, N, B, D) order and permuting that to (B, N, H, D) copied H times the
            # activations, forward and backward (the largest kernel of the SA step on an H200).
            rows = probs.transpose(0, 1).reshape(N * H, N)  # (N*H, N)
            mixed = torch.bmm(rows.expand(B, N * H, N), x)  # (B, N*H, D)
        else:  # probabilities of each image (an attention that reads the content): one (H*N, N) @ (N, D) per image,
            # not H of them against x broadcast per head (which copies x H times and sums its gradient over heads)
            mixed = (probs.reshape(B, H * N, N) @ x).view(B, H, N, D).transpose(1, 2)  # (B, N, H, D)
        return self.value(mixed.reshape(B, N, H * D))  # (B, N, H*D), head-major blocks -> (B, N, out_dim)

    def headless(self, x: Tensor) -> Tensor:
        """The output of a layer without heads: ``value`` of zero features, i.e. its bias at every token.

        Goes through ``value`` (not a bare ``bias.expand``) so autocast, ``bias=False`` and the bias's gradient
        behave as for a layer with heads; the empty matmul costs no FLOPs.
        """
        assert self.num_heads == 0, f"headless() called on a layer with {self.num_heads} heads"
        return self.value(x.new_zeros(*x.shape[:-1], 0))  # (B, N, out_dim)

    def attention_map(self, query: tuple[int, int], grid: tuple[int, int]) -> Tensor:
        """Each head's attention probabilities for one query pixel, as images: (H, rows, cols)."""
        row, col = query
        if not (0 <= row < grid[0] and 0 <= col < grid[1]):
            raise ValueError(f"query pixel {query} is outside the {grid} grid")
        with torch.no_grad():
            probs = self.attention_probs(grid)  # (H, N, N)
        return probs[:, row * grid[1] + col].reshape(self.num_heads, *grid)

    def head_geometry(self) -> dict[str, Tensor] | None:
        """Centres (H, 2) and ``Sigma^-1`` (H, 2, 2) for Gaussian encodings; None otherwise."""
        return self.encoding.head_geometry()

    def head_report(self) -> dict[str, Tensor]:
        """Per-head (H,) quantities this kind reports each epoch beyond the locality every layer is measured by: the
        names its registry entry lists under ``head_reports`` (``pipeline.encodings``); none for the paper's layer."""
        return {}

    def prune_heads(self, keep: list[int]) -> None:
        """Physically remove the heads not in ``keep``: their encoding parameters and their value columns.

        Removing head h is the same as zeroing its ``in_dim`` input columns of ``value`` (tested). ``keep`` may be
        empty: the layer then keeps only ``value``'s bias (see the module docstring).
        """
        if sorted(set(keep)) != sorted(keep) or not all(0 <= h < self.num_heads for h in keep):
            raise ValueError(f"keep must list distinct heads in 0..{self.num_heads - 1}, got {keep}")
        keep = sorted(keep)
        columns = torch.tensor(
            [c for h in keep for c in range(h * self.in_dim, (h + 1) * self.in_dim)], dtype=torch.long
        )  # (len(keep) * in_dim,), empty when no head is kept
        old = self.value
        new = head_linear(len(keep) * self.in_dim, self.out_dim, bias=old.bias is not None).to(old.weight)
        with torch.no_grad():
            new.weight.copy_(old.weight[:, columns.to(old.weight.device)])
            if old.bias is not None:
                new.bias.copy_(old.bias)
        self.value = new
        self.encoding.prune(keep)
