"""DeepSpeed-Ulysses: all-to-all from sequence-sharded to head-sharded, local attention, and back.

DeepSpeed-Ulysses (Jacobs et al., arXiv 2309.14509): each rank holds n = N/G tokens of all H
heads. One all-to-all per tensor turns that into all N tokens of H/G heads; every rank then runs
plain attention over the full sequence for its heads (``local_attention``: one kernel call, or the
tiled block plan of ``burst.masks`` under a window or documents), and
one all-to-all brings the output back to sequence sharding. The backward is the same in reverse:
dO goes seq->head, dQ, dK, dV go head->seq. Bytes per rank: each all-to-all sends (G-1)/G of the
local tensor, eight of them per layer (``burst.volume``).

Layouts: after the all-to-all a rank holds the G shards concatenated in rank order. With the
contiguous layout that is global order; with zigzag or striped it is a known permutation, undone
by a local index (no communication) before attention and redone after, so the causal mask is
always applied in global positions and every layout works. Ulysses has no causal imbalance (every
rank sees the whole sequence), so contiguous is the natural default.

GQA: query heads split evenly (H % G == 0). K/V heads split evenly when Hk % G == 0; when
Hk < G and G % Hk == 0 each kv head is *replicated* to the G/Hk ranks whose query heads use it
(repeat_interleave before the all-to-all, so rank r receives kv head floor(r*Hk/G); the backward
sums the replicas' gradients). The replicated K/V is what moves, so the byte formula counts
Hk' = G kv heads in that case (``burst.volume.ulysses_kv_heads``). Anything else is rejected.

Shapes: x_BSHD with S = seq_local before and N = G*seq_local after the all-to-all.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from baselines.checks import check_call, degree_problems, layout_problems
from baselines.local_attention import local_attention
from baselines.registry import Method, register
from burst import comm
from burst.first_order import first_order
from burst.kernel import resolve_scale
from burst.layout import LAYOUTS, global_positions
from burst.masks import MaskSpec
from burst.remake import remakeable
from burst.volume import ulysses_kv_heads

__all__ = ["all_to_all", "heads_to_seq", "replicate_kv", "seq_to_heads", "ulysses_attn"]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split_dim: int, cat_dim: int, group):
        ctx.args = (split_dim, cat_dim, group)
        with comm.phase("forward"):
            return comm.all_to_all(x, split_dim=split_dim, cat_dim=cat_dim, group=group)

    @staticmethod
    @first_order  # raw collectives: a second derivative would silently lose its terms
    def backward(ctx, grad):
        split_dim, cat_dim, group = ctx.args
        with comm.phase("backward"):
            out = comm.all_to_all(grad.contiguous(), split_dim=cat_dim, cat_dim=split_dim,
                                  group=group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, *, split_dim: int, cat_dim: int, group) -> torch.Tensor:
    """Differentiable ``comm.all_to_all``; its backward is the reverse all-to-all."""
    return _AllToAll.apply(x, split_dim, cat_dim, group)


def seq_to_heads(x_BSHD: torch.Tensor, group) -> torch.Tensor:
    """(B, n, H, D) sequence-sharded -> (B, G*n, H/G, D): every rank's shard, in rank order."""
    return all_to_all(x_BSHD, split_dim=2, cat_dim=1, group=group)


def heads_to_seq(x_BSHD: torch.Tensor, group) -> torch.Tensor:
    """Inverse of ``seq_to_heads``: (B, G*n, H/G, D) -> (B, n, H, D)."""
    return all_to_all(x_BSHD, split_dim=1, cat_dim=2, group=group)


def replicate_kv(k_BSHD: torch.Tensor, degree: int) -> torch.Tensor:
    """Repeat kv heads so that they split over ``degree`` ranks (no-op when they already do)."""
    hk = k_BSHD.shape[2]
    rep = ulysses_kv_heads(hk, degree) // hk
    return k_BSHD if rep == 1 else k_BSHD.repeat_interleave(rep, dim=2)


@lru_cache(maxsize=256)
def _gathered_positions(seq_local: int, world: int, layout: str,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """Global position of each row after ``seq_to_heads`` (the shards in rank order), cached
    on ``device`` (a host-to-GPU copy per call would wait for the GPU queue every layer); a
    plain tensor also when first made under ``torch.inference_mode`` (an inference tensor,
    cached, broke every later training call: autograd saves the index)."""
    with torch.inference_mode(False):
        return torch.cat([global_positions(seq_local, world, r, layout)
                          for r in range(world)]).to(device)


def ulysses_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                 group=None, layout: str = "contiguous", window: tuple[int, int] | None = None,
                 cu_seqlens=None, backend: str = "auto"):
    """DeepSpeed-Ulysses attention over ``group`` (degree G = its size).

    Args:
        q: (batch, seq_local, heads, head_dim), this rank's shard in ``layout``; heads % G == 0.
        k, v: (batch, seq_local, kv_heads, head_dim); kv_heads % G == 0 or G % kv_heads == 0.
        causal, window, cu_seqlens: the mask in global token positions.
    Returns:
        out shaped like q.
    """
    check_call(METHOD, q, k, v, causal=causal, group=group, options=dict(layout=layout),
               backend=backend)
    g, n = comm.world_size(group), q.shape[1]
    spec = MaskSpec(causal=causal, window=window,
                    cu_seqlens=cu_seqlens)
    spec.check_length(n * g)
    scale = resolve_scale(q.shape[-1], softmax_scale)
    pos = _gathered_positions(n, g, layout, q.device)

    def gather(q, k, v):  # every token of this rank's heads, in global order
        qh, kh, vh = (seq_to_heads(t, group) for t in (q, replicate_kv(k, g), replicate_kv(v, g)))
        if layout != "contiguous":  # rank order -> global order, so masks see true positions
            order = torch.argsort(pos)
            qh, kh, vh = (t.index_select(1, order) for t in (qh, kh, vh))
        return qh, kh, vh

    # remakeable: a selective checkpoint keeps none of them, and gathers them again in backward
    qh, kh, vh = remakeable(gather, q, k, v)
    out = local_attention(qh, kh, vh, spec=spec, scale=scale, backend=backend)

    def scatter(out):  # back to this rank's tokens of every head
        return (heads_to_seq(out if layout == "contiguous" else out.index_select(1, pos), group),)

    # remakeable: a selective checkpoint keeps the kernel's output alone, and moves it again
    return remakeable(scatter, out)[0]


def _requires(*, world, heads, kv_heads, seq_local, layout, **_):
    return (degree_problems("ulysses degree (group size)", world, world, heads, kv_heads,
                            kv_replicate=True, of_world=True)
            + layout_problems(layout, seq_local))


METHOD = register(Method(
    name="ulysses",
    fn=ulysses_attn,
    description="DeepSpeed-Ulysses: all-to-all seq->heads, full-sequence local attention, "
                "all-to-all back (kv heads replicated up to the degree when fewer)",
    layouts=LAYOUTS,
    options={"layout": "contiguous"},
    requires=_requires,
    row_saves=False,  # it also saves its all-to-all's index tensors
))
