"""Locality-truncated position-only attention: each head sums over the few keys that hold its probability mass.

Beyond the paper. Its Sec. 4 notes that Gaussian attention "could be optimized to exploit the locality" of its
probabilities; this module is that optimisation, selected by ``model.attention_window_eps`` (None = the paper's exact
dense attention, the default).

**Which keys.** For each head and query row, the window is the fewest keys whose probabilities sum to >= 1 - eps:
the most probable keys, i.e. a level set of the head's Gaussian around ``query + Delta``. Windows are chosen per query
row, not as one set of shifts per head, because of the borders: the softmax runs over the keys inside the grid only,
so a head centred one pixel to the left puts its mass on ``query + (0, -1)`` inside the image, but on the nearest
pixels still inside when the query sits on the left edge. One set of shifts valid for every query would have to hold
all those fall-back shifts (3 to 10 times more keys for trained-like heads, measured); per row, a one-pixel head keeps
one key everywhere. Per-row windows cost nothing extra here: the sum is a per-query gather of the inputs anyway.

**How it is computed.** The (H, N, N) probabilities are still computed densely (H N^2 elementwise work, small next to
the H N^2 B D multiply-adds of the dense matmul) and attention dropout is applied to them exactly as in the dense
layer (same RNG draws). The kept probabilities are gathered **without renormalising**: they are the dense path's own
values, so

- ``eps = 0`` reproduces the dense output (up to summation order), and the error is bounded per query and channel by
  ``(left-out mass) * max_k |x_k| <= eps * max|x|``, whereas renormalising would spread the tail over the window and
  double that bound;
- gradients reach the centres and spreads through the kept probabilities, whose normaliser still sums over every
  key, so they are the dense gradients minus the eps tail. The window selection itself is a discrete choice from
  detached values and needs no gradient.

Heads that keep one key for every query (e.g. the large-alpha heads of Theorem 1) run as a shift: a gathered copy of
the input times that key's probability. The other heads of a layer share one batched matmul over the union of their
kept keys per query, ``(N, H_w, K) @ (N, K, B*D)``, which ``FlopCounterMode`` counts. Per image the attention sums
then cost ``2 N H_w K D + N H_s D`` FLOPs instead of ``2 H N^2 D`` (``window_flops``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import PositionalEncoding


@torch.no_grad()
def select_keys(probs: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per head and query, the fewest keys whose probabilities sum to >= 1 - eps: a (H, N, N) mask and its counts.

    The kept keys are the most probable ones of the row (the level set of the Gaussian around its centre). The
    left-out mass is summed from the smallest probabilities up, in float64, so even an eps far below float32's
    resolution is honoured.
    """
    ranked, order = probs.sort(dim=-1, descending=True)  # (H, N, N)
    from_k = ranked.double().flip(-1).cumsum(-1).flip(-1)  # mass of ranks >= k
    left_out = torch.cat([from_k[..., 1:], from_k.new_zeros(*from_k.shape[:-1], 1)], dim=-1)  # ranks > k
    counts = (left_out > eps).sum(-1) + 1  # (H, N)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    needed = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, rank < counts[..., None])
    return needed, counts


@dataclass(frozen=True)
class WindowPlan:
    """How a layer runs its heads for the current parameters: one-key heads as gathers, the rest in one matmul."""

    counts: Tensor  # (H, N): keys kept per head and query
    shift_heads: list[int]  # heads that keep one key for every query
    shift_keys: Tensor  # (Hs, N): that key
    window_heads: list[int]  # the others
    keys: Tensor  # (N, K): per query, the union of the window heads' kept keys (padded with unused keys)
    member: Tensor  # (Hw, N, K): whether window head h keeps keys[q, j]

    @property
    def width(self) -> int:
        """K, the number of keys per query that the window heads' matmul runs over."""
        return self.keys.shape[1]


@torch.no_grad()
def plan_windows(probs: Tensor, eps: float) -> WindowPlan:
    """The plan for a layer's (H, N, N) probabilities and ``eps`` (see ``WindowPlan``)."""
    needed, counts = select_keys(probs, eps)
    widest = counts.amax(-1).tolist()  # (H,), one host sync for the layer
    shift_heads = [h for h, w in enumerate(widest) if w == 1]
    window_heads = [h for h, w in enumerate(widest) if w > 1]
    shift_keys = needed[shift_heads].float().argmax(-1)  # (Hs, N): the one kept key
    union = needed[window_heads].any(0)  # (N, N)
    width = int(union.sum(-1).max()) if window_heads else 0
    keys = union.float().topk(width, dim=-1).indices  # (N, K): kept keys first, then unused padding
    member = needed[window_heads].gather(-1, keys[None].expand(len(window_heads), -1, -1))  # (Hw, N, K)
    return WindowPlan(counts, shift_heads, shift_keys, window_heads, keys, member)


def window_flops(plan: WindowPlan, dim: int) -> int:
    """FLOPs per image of the truncated attention sums (multiply-add = 2; a one-key head's scaling = 1 per element).

    ``FlopCounterMode`` sees the first term (a bmm); the second is elementwise, which it does not count.
    """
    num_tokens = plan.counts.shape[1]
    return 2 * num_tokens * len(plan.window_heads) * plan.width * dim + num_tokens * len(plan.shift_heads) * dim


def dense_flops(num_heads: int, num_tokens: int, dim: int) -> int:
    """FLOPs per image of the dense attention sums ``softmax(scores) @ X`` (multiply-add = 2)."""
    return 2 * num_heads * num_tokens * num_tokens * dim


class LocalMultiHeadSelfAttention(MultiHeadSelfAttention):
    """``MultiHeadSelfAttention`` whose heads attend only within the window holding >= 1 - ``window_eps`` of their
    mass (see the module docstring). Same parameters and state-dict keys as the dense layer, so checkpoints move
    freely between the two. The window sizes depend on the parameters, so each forward syncs with the host once per
    layer and ``torch.compile`` cannot capture this layer in one graph.
    """

    def __init__(
        self,
        encoding: PositionalEncoding,
        in_dim: int,
        out_dim: int | None = None,
        attention_dropout: float = 0.0,
        bias: bool = True,
        *,
        window_eps: float,
    ) -> None:
        if not 0.0 <= window_eps < 1.0:
            raise ValueError(f"window_eps must be in [0, 1), got {window_eps}")
        super().__init__(encoding, in_dim, out_dim, attention_dropout=attention_dropout, bias=bias)
        self.window_eps = window_eps

    @classmethod
    def from_dense(cls, layer: MultiHeadSelfAttention, window_eps: float) -> LocalMultiHeadSelfAttention:
        """The truncated twin of ``layer``, sharing its modules (encoding, value, dropout) and parameters."""
        with torch.random.fork_rng(devices=[]):  # the throw-away Linear below must not shift later random draws
            new = cls(layer.encoding, layer.in_dim, layer.out_dim, window_eps=window_eps)
        new.value = layer.value
        new.attention_dropout = layer.attention_dropout
        return new

    def extra_repr(self) -> str:
        return f"window_eps={self.window_eps}"

    def plan(self, grid: tuple[int, int]) -> WindowPlan:
        """The windows the current parameters give (for reporting; ``forward`` computes the same)."""
        return plan_windows(self.attention_probs(grid).detach(), self.window_eps)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        B, N, D = x.shape  # noqa: N806 (paper's symbols)
        H = self.num_heads  # noqa: N806
        assert N == grid[0] * grid[1], f"{N} tokens do not fill a {grid} grid"
        assert D == self.in_dim, f"expected {self.in_dim} features, got {D}"
        if H == 0:  # a layer pruned to no heads: no windows to plan
            return self.headless(x)
        probs = self.attention_probs(grid)  # (H, N, N)
        plan = plan_windows(probs.detach(), self.window_eps)
        probs = self.attention_dropout(probs)  # same draws as the dense layer's
        if device_type := _autocast_device(x):  # gather half-width copies under autocast, as the matmul would use
            x = x.to(torch.get_autocast_dtype(device_type))
        probs = probs.to(x.dtype)
        values = x.transpose(0, 1).reshape(N, B * D)  # (N, B*D)

        parts, order = [], []
        if plan.window_heads:
            Hw, K = len(plan.window_heads), plan.width  # noqa: N806
            weight = probs[plan.window_heads].gather(-1, plan.keys[None].expand(Hw, N, K)) * plan.member  # (Hw, N, K)
            # (N, Hw, K) @ (N, K, B*D): per query, every window head's weighted sum over its kept keys
            gathered = values.index_select(0, plan.keys.flatten()).view(N, K, B * D)  # (N, K, B*D)
            parts.append(torch.bmm(weight.transpose(0, 1), gathered))  # (N, Hw, B*D)
            order += plan.window_heads
        if plan.shift_heads:
            key = plan.shift_keys  # (Hs, N)
            weight = probs[plan.shift_heads].gather(-1, key[:, :, None])  # (Hs, N, 1)
            shifted = values.index_select(0, key.T.flatten()).view(N, len(plan.shift_heads), B * D)  # (N, Hs, B*D)
            parts.append(shifted * weight.transpose(0, 1))  # a shifted copy, scaled per query
            order += plan.shift_heads
        mixed = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]  # (N, H, B*D), heads in ``order``
        if order != list(range(H)):
            mixed = mixed[:, torch.tensor(order, device=x.device).argsort()]  # back to head order
        heads = mixed.view(N, H, B, D).permute(2, 0, 1, 3).reshape(B, N, H * D)  # (B, N, H*D), head-major
        return self.value(heads)  # (B, N, out_dim)


def _autocast_device(x: Tensor) -> str | None:
    device_type = x.device.type
    return device_type if torch.is_autocast_enabled(device_type) else None


def localise_attention(model: nn.Module, window_eps: float) -> nn.Module:
    """Replace every dense ``MultiHeadSelfAttention`` in ``model`` by its truncated twin, in place; returns ``model``.

    Parameters are shared, not copied, and the random state is left untouched, so a model built with a seed and
    then localised has the same weights as the dense one.
    """
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is MultiHeadSelfAttention:
                setattr(module, name, LocalMultiHeadSelfAttention.from_dense(child, window_eps))
    return model


__all__ = [
    "LocalMultiHeadSelfAttention",
    "WindowPlan",
    "dense_flops",
    "localise_attention",
    "plan_windows",
    "select_keys",
    "window_flops",
]
