"""LoongTrain-style double ring attention: an inner ring per node, an outer ring across nodes.

LoongTrain (Gu et al., arXiv 2406.18485, "Double-Ring-Attention"; code: InternEvo,
``internlm/model/ops/ring_flash_attn/zigzag_ring_flash_attn_with_sliding_window.py``) cuts the
context-parallel group into windows of ``w`` consecutive ranks (the inner ring, usually one
node; the BurstEngine paper's InternEvo runs use w = cp/4, two nodes on 64 GPUs). Per outer
step the K/V block a rank holds goes once around its inner ring (w-1 hops, over NVLink when the
window is inside a node) while the next outer block is fetched from the same local rank of the
previous window (one inter-node hop, hidden behind the w-1 inner steps). The backward repeats
the same K/V schedule and sends the fp32 dK/dV accumulators around the inner ring (w hops: they
come back to the outer block's holder) and then on to the next window (one hop), on process
groups of their own. After the last window the accumulated dK/dV land at their owner.

That is exactly ``burst_attn(..., backward="ring", ranks_per_node=w)`` (``burst.ring``'s double
ring with the classic K/V/dK/dV backward), so this adapter is that call. Per rank and layer:
forward M(w-1) intra + (M-1) inter K/V hops; backward the same plus M*w intra + M inter dK/dV
hops (M = G/w windows), which is also what InternEvo's code sends. With an attention window (or
documents) that a flat ring serves in at most M - 1 steps each way, ``burst_attn`` runs that
shortened flat ring instead (``burst.masks.flat_ring_suffices``); InternEvo's double ring has no
such shortcut (its "sliding window" file name means the inner ring), so there this adapter
sends fewer bytes than LoongTrain would.

Where BurstAttention's double ring (``burst`` with ``ranks_per_node``) differs from LoongTrain's
(BurstEngine, arXiv 2509.19836, sections on backward communication and topology-aware rings):
- what travels in the backward: Q, dO, D = rowsum(dO*O) and LSE with a trailing fp32 dQ, K/V
  staying put, instead of K, V with trailing dK, dV (for MHA at d_h 128 about 25% fewer
  elements, 34% fewer bytes with bf16 data and fp32 accumulators; more for small-kv GQA,
  DESIGN.md 3). Both use the same two-level schedule and separate
  communicators for the accumulator traffic.
- fine-grained overlap: BurstAttention double-buffers every transfer behind the block compute
  on its own streams; LoongTrain overlaps the inner ring with the prefetch of the next outer
  block the same way, so on CPU (no streams) the two schedules are identical.
- LoongTrain also splits heads (its "2D-Attention": head parallelism x context parallelism,
  the role ``usp`` plays here) and supports zigzag + causal only; this adapter is the context
  parallel part alone, on any layout, causal or not.

Option ``ranks_per_node``: the inner ring size w (LoongTrain's window size), usually the GPUs
per node. w = 1 or w >= G is one flat ring (LoongTrain's window of cp/4 is 1 on 4 GPUs). Its
default (2) only lets loops over the registry run anywhere with G even.
"""

from __future__ import annotations

from baselines.checks import check_call, divisors, layout_problems
from baselines.registry import Method, plain_integer, register
from burst import burst_attn
from burst.comm import ranks_per_node_ok
from burst.layout import LAYOUTS

__all__ = ["double_ring_attn"]


def double_ring_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                     group=None, ranks_per_node: int = 2, layout: str = "zigzag",
                     window: tuple[int, int] | None = None, cu_seqlens=None,
                     backend: str = "auto"):
    """Double ring attention with the classic backward.

    Args:
        q: (batch, seq_local, heads, head_dim), this rank's shard in ``layout``.
        k, v: (batch, seq_local, kv_heads, head_dim).
        ranks_per_node: inner ring size w; the group (node-major ranks) must be a multiple.
            A group of at most w ranks is one flat ring.
    Returns:
        out shaped like q.
    """
    ranks_per_node = plain_integer(ranks_per_node)
    check_call(METHOD, q, k, v, causal=causal, group=group,
               options=dict(layout=layout, ranks_per_node=ranks_per_node),
               backend=backend)
    return burst_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, layout=layout,
                      group=group, ranks_per_node=ranks_per_node, backward="ring",
                      window=window, cu_seqlens=cu_seqlens, backend=backend)


def _requires(*, world, seq_local, layout, ranks_per_node, **_):
    out = layout_problems(layout, seq_local)
    # inner rings of one rank, or one holding the whole group, make a flat ring
    # (burst.comm.ring_shape): InternEvo's window of cp/4 is 1 on 4 GPUs
    if ranks_per_node is None or not ranks_per_node_ok(world, ranks_per_node):
        out.append(f"ranks_per_node={ranks_per_node!r} (the inner ring size) must be a whole "
                   f"number >= 1 that divides the group of {world} ranks (or holds it whole; "
                   f"'@world/4' gives 0 below 4 ranks); valid: "
                   f"{', '.join(map(str, divisors(world)))}")
    return out


METHOD = register(Method(
    name="double_ring",
    fn=double_ring_attn,
    description="LoongTrain-style double ring (inner ring per node, outer ring across nodes), "
                "classic K/V/dK/dV backward",
    layouts=LAYOUTS,
    options={"layout": "zigzag", "ranks_per_node": 2},
    requires=_requires,
))
