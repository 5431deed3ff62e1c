"""Megatron tensor parallelism with sequence parallelism, for a whole attention block.

Megatron-LM (Shoeybi et al. 2019; sequence parallelism: Korthikanti et al., arXiv 2205.05198)
splits an attention block's heads across the G ranks of the tensor-parallel group. With sequence
parallelism the activations between blocks are sequence-sharded (contiguous), so the block is:

    x (B, n, E) --all-gather seq--> (B, N, E) --QKV column-parallel (H/G, Hk/G heads)-->
    local full-sequence attention --output row-parallel--> partial (B, N, E)
    --reduce-scatter seq--> y (B, n, E)

Backward (Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``): dy is all-gathered
for the row-parallel layer; the QKV layer keeps only the *local* x and all-gathers it again for
its weight gradient, then reduce-scatters dx. Bytes per rank with x = b*n*E*e per peer:
forward 2*(G-1)*x, backward 3*(G-1)*x (``burst.volume``).

It cannot be an attention core (it needs the projection weights), so it has a block-level entry
point, ``tp_attention_block(x, weights, ...)``, and its registry entry (``level="block"``)
raises a clear error when called like a core. ``attention_block_reference`` is the same block on
one process (float64 in tests). Heads are split evenly: H % G == 0 and Hk % G == 0 (Megatron's
rule for query groups; no kv replication).

Shapes: x_BSE (batch, seq, hidden); q/k/v_BSHD; weights are (in, out) matrices: x @ w.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from baselines.checks import backend_problems, degree_problems
from baselines.local_attention import local_attention
from baselines.registry import Method, register
from burst import comm
from burst.first_order import first_order
from burst.kernel import resolve_scale
from burst.masks import MaskSpec
from burst.reference import reference_attention

__all__ = ["AttentionBlockWeights", "attention_block_reference", "tp_attention_block"]


@dataclass(frozen=True)
class AttentionBlockWeights:
    """Projection weights of one attention block (no biases), as ``x @ w`` matrices.

    Query head h owns columns [h*D, (h+1)*D) of ``wq`` and rows [h*D, (h+1)*D) of ``wo``;
    kv head j owns the same columns of ``wk`` and ``wv``.
    """

    wq: torch.Tensor
    """(hidden, heads * head_dim)."""
    wk: torch.Tensor
    """(hidden, kv_heads * head_dim)."""
    wv: torch.Tensor
    """(hidden, kv_heads * head_dim)."""
    wo: torch.Tensor
    """(heads * head_dim, hidden)."""
    heads: int
    """Query heads held here (all of them, or one rank's share after ``shard``)."""
    kv_heads: int
    """Key/value heads held here."""
    world: int = 1
    """The tensor-parallel degree these are one rank's share of (1: the whole weights; set by
    ``shard``): whole weights on G ranks gave G times the output, without an error."""

    def __post_init__(self):
        problems = []
        for f in ("wq", "wk", "wv", "wo"):
            t = getattr(self, f)
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                problems.append(f"{f} must be a 2-D tensor, got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
        for f in ("heads", "kv_heads", "world"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                problems.append(f"{f}={getattr(self, f)!r} must be a positive int")
        if problems:
            raise ValueError("AttentionBlockWeights: " + "; ".join(problems))
        e, hd = self.wq.shape
        if hd % self.heads:
            problems.append(f"wq has {hd} columns, not a multiple of heads={self.heads}")
        d = hd // self.heads
        if self.heads % self.kv_heads:
            problems.append(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        for f in ("wk", "wv"):
            if tuple(getattr(self, f).shape) != (e, self.kv_heads * d):
                problems.append(f"{f} has shape {tuple(getattr(self, f).shape)}; expected "
                                f"(hidden, kv_heads*head_dim) = ({e}, {self.kv_heads * d})")
        if tuple(self.wo.shape) != (hd, e):
            problems.append(f"wo has shape {tuple(self.wo.shape)}; expected "
                            f"(heads*head_dim, hidden) = ({hd}, {e})")
        dtypes = {getattr(self, f).dtype for f in ("wq", "wk", "wv", "wo")}
        if len(dtypes) > 1:
            problems.append(f"weights have different dtypes {sorted(map(str, dtypes))}")
        if problems:
            raise ValueError("AttentionBlockWeights: " + "; ".join(problems))

    @property
    def hidden(self) -> int:
        return self.wq.shape[0]

    @property
    def head_dim(self) -> int:
        return self.wq.shape[1] // self.heads

    @classmethod
    def random(cls, hidden: int, heads: int, kv_heads: int, head_dim: int, *,
               generator: torch.Generator | None = None,
               dtype: torch.dtype = torch.float32) -> AttentionBlockWeights:
        """Gaussian weights scaled by 1/sqrt(fan_in)."""
        def w(i, o):
            return torch.randn(i, o, generator=generator, dtype=torch.float64).div(i ** 0.5) \
                .to(dtype)
        return cls(w(hidden, heads * head_dim), w(hidden, kv_heads * head_dim),
                   w(hidden, kv_heads * head_dim), w(heads * head_dim, hidden), heads, kv_heads)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> AttentionBlockWeights:
        """The same weights with ``fn`` applied to every tensor (cast, detach, requires_grad)."""
        return AttentionBlockWeights(*(fn(getattr(self, f)) for f in ("wq", "wk", "wv", "wo")),
                                     self.heads, self.kv_heads, self.world)

    def shard(self, rank: int, world: int) -> AttentionBlockWeights:
        """Rank ``rank``'s share of ``world``-way tensor parallelism (a contiguous head range)."""
        problems = degree_problems("tensor-parallel degree", world, world, self.heads,
                                   self.kv_heads, kv_replicate=False, of_world=True)
        if not 0 <= rank < world:
            problems.append(f"rank {rank} is outside the group of {world} ranks")
        if self.world != 1:
            problems.append(f"these weights are already a {self.world}-way share; shard the "
                            "whole weights")
        if problems:
            raise ValueError("AttentionBlockWeights.shard: " + "; ".join(problems))
        d, h, hk = self.head_dim, self.heads // world, self.kv_heads // world
        cq, ckv = slice(rank * h * d, (rank + 1) * h * d), slice(rank * hk * d, (rank + 1) * hk * d)
        return AttentionBlockWeights(self.wq[:, cq], self.wk[:, ckv], self.wv[:, ckv],
                                     self.wo[cq, :], h, hk, world)


def _split_qkv(qkv, w: AttentionBlockWeights):
    b, n, _ = qkv.shape
    d = w.head_dim
    q, k, v = qkv.split([w.heads * d, w.kv_heads * d, w.kv_heads * d], dim=2)
    return (q.reshape(b, n, w.heads, d), k.reshape(b, n, w.kv_heads, d),
            v.reshape(b, n, w.kv_heads, d))


def attention_block_reference(x_BSE, weights: AttentionBlockWeights, *, causal: bool = False,
                              softmax_scale: float | None = None, window=None,
                              cu_seqlens=None) -> torch.Tensor:
    """The whole block on one process with plain matmuls (the float64 oracle in tests)."""
    q, k, v = _split_qkv(x_BSE @ torch.cat([weights.wq, weights.wk, weights.wv], dim=1), weights)
    out, _ = reference_attention(q, k, v, causal=causal, window=window, cu_seqlens=cu_seqlens,
                                 scale=softmax_scale)
    return out.reshape(*x_BSE.shape[:2], -1) @ weights.wo


class _GatherLinear(torch.autograd.Function):
    """all-gather(x) @ w, saving only the local x (Megatron sequence-parallel column linear)."""

    @staticmethod
    def forward(ctx, x, w, group):
        with comm.phase("forward"):
            x_full = comm.all_gather(x, dim=1, group=group)
        ctx.save_for_backward(x, w)
        ctx.group = group
        return x_full @ w

    @staticmethod
    @first_order  # raw collectives: a second derivative would silently lose its terms
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with comm.phase("backward"):
            x_full = comm.all_gather(x, dim=1, group=ctx.group)  # for the weight gradient
            dw = x_full.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
            dx = comm.reduce_scatter((dy @ w.T).contiguous(), dim=1, group=ctx.group)
        return dx, dw, None


class _ReduceScatterSeq(torch.autograd.Function):
    """Sum partial outputs over ranks, keep this rank's sequence shard; backward all-gathers."""

    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        with comm.phase("forward"):
            return comm.reduce_scatter(y.contiguous(), dim=1, group=group)

    @staticmethod
    @first_order  # raw collectives: a second derivative would silently lose its terms
    def backward(ctx, dy):
        with comm.phase("backward"):
            return comm.all_gather(dy.contiguous(), dim=1, group=ctx.group), None


def _block_problems(x, weights, backend, group) -> list[str]:
    if weights is None:
        return ["tp_attention_block needs this rank's projection weights (weights=None); pass "
                "AttentionBlockWeights(wq, wk, wv, wo, heads, kv_heads).shard(rank, world)"]
    if not isinstance(weights, AttentionBlockWeights):
        return [f"weights must be AttentionBlockWeights, got {type(weights).__name__}"]
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        return [f"x must be a (batch, seq_local, hidden) tensor, got "
                f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"]
    out = []
    if x.shape[2] != weights.hidden:
        out.append(f"x has hidden size {x.shape[2]} but the weights expect {weights.hidden}")
    if x.dtype != weights.wq.dtype:
        out.append(f"x is {x.dtype} but the weights are {weights.wq.dtype}; cast one")
    if x.shape[1] == 0:  # failed in a reshape after the gather
        out.append("local sequence length 0: every rank needs at least one token")
    out += backend_problems(backend, x)
    g = comm.world_size(group)
    if weights.world != g:
        out.append(f"the weights are a {weights.world}-way share"
                   f"{' (the whole weights)' if weights.world == 1 else ''} but the group has "
                   f"{g} ranks; pass whole_weights.shard(rank, {g})")
    return out


def tp_attention_block(x_BSE, weights: AttentionBlockWeights | None, *, causal: bool = False,
                       group=None, softmax_scale: float | None = None, window=None,
                       cu_seqlens=None, backend: str = "auto") -> torch.Tensor:
    """Megatron TP+SP attention block over ``group`` (the tensor-parallel group).

    Args:
        x_BSE: (batch, seq_local, hidden), this rank's contiguous sequence shard.
        weights: this rank's share, ``full_weights.shard(rank, world)`` (heads/G query heads,
            kv_heads/G kv heads).
        causal: causal mask over the global sequence.
        window, cu_seqlens: a (left, right) sliding window and document boundaries, in global
            positions (``burst.masks.MaskSpec``); each rank attends over the whole gathered
            sequence with its heads, so the mask costs no traffic.
    Returns:
        y (batch, seq_local, hidden): this rank's shard of the block output.
    """
    problems = _block_problems(x_BSE, weights, backend, group)
    try:
        spec = MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens)
        if not problems:  # documents must cover the gathered sequence: ask before gathering
            spec.check_length(x_BSE.shape[1] * comm.world_size(group))
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ValueError("tp: " + "; ".join(problems))
    scale = resolve_scale(weights.head_dim, softmax_scale)
    w_qkv = torch.cat([weights.wq, weights.wk, weights.wv], dim=1)
    q, k, v = _split_qkv(_GatherLinear.apply(x_BSE.contiguous(), w_qkv, group), weights)
    out = local_attention(q, k, v, spec=spec, scale=scale, backend=backend)
    partial_y = out.reshape(*out.shape[:2], -1) @ weights.wo
    return _ReduceScatterSeq.apply(partial_y, group)


def _core_entry(q, k, v, *, causal=False, softmax_scale=None, group=None, **options):
    raise ValueError("method 'tp' is block-level: Megatron tensor parallelism needs the block's "
                     "projection weights, so it has no (q, k, v) entry; call "
                     "baselines.tp.tp_attention_block(x, weights, causal=..., group=...) "
                     "(also registry.get('tp').block_fn)")


def _requires(*, world, heads, kv_heads, **_):
    return degree_problems("tensor-parallel degree (group size)", world, world, heads, kv_heads,
                           kv_replicate=False, of_world=True)


METHOD = register(Method(
    name="tp",
    fn=_core_entry,
    description="Megatron tensor + sequence parallel attention block (all-gather seq, heads "
                "split, reduce-scatter); block-level",
    layouts=("contiguous",),
    requires=_requires,
    level="block",
    block_fn=tp_attention_block,
))
