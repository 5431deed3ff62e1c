"""USP (yunchang): Ulysses inside groups of U ranks x ring attention across R = G/U groups.

Unified Sequence Parallelism (Fang and Zhao, arXiv 2405.07719; code: feifeibear/
long-context-attention, ``LongContextAttention``). Ranks are arranged as yunchang's
``set_seq_parallel_pg(..., use_ulysses_low=True)`` does: Ulysses groups are U consecutive ranks
(inside a node, where all-to-all is cheap), ring groups are the ranks u, U+u, 2U+u, ... (across
nodes). A rank first all-to-alls Q, K, V inside its Ulysses group (now U*n tokens of H/U heads),
then runs ring attention over its ring group (``burst_attn``: by default ``backward="ring"``,
the classic K/V/dK/dV ring as yunchang's; ``backward="burst"`` is Burst-USP), then all-to-alls
the output back.
U = 1 is plain ring attention, U = G is plain Ulysses.

Layouts: the input is in a suite layout over all G ranks. After the Ulysses all-to-all a rank
holds its group's U shards in rank order. For ``contiguous`` they form ring position i's
contiguous block of an R-rank contiguous layout; for ``zigzag`` they are, up to a local
permutation, exactly ring position i's zigzag shard over R ranks (group i holds the G-level
chunks iU..iU+U-1 and their mirrors, which are the R-level chunks i and 2R-1-i). The adapter
applies that permutation locally, so the ring's masks and load balance are those of the R-rank
layout in true global positions. (yunchang's own zigzag instead expects a two-level sharding,
zigzag over R then contiguous over U, which is not one of the suite's layouts.) ``striped`` over
G is not a striped layout over R for U > 1, so it is not offered.

GQA: as in ``baselines.ulysses`` with degree U (kv heads split across, or replicated up to, U).
Bytes (``burst.volume``): the Ulysses all-to-alls over U ranks plus a flat ring of R ranks whose
unit is U*n tokens x Hk'/U heads, the same bytes as n tokens x Hk' heads.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from baselines.checks import check_call, degree_problems, layout_problems
from baselines.registry import Method, plain_integer, register
from baselines.ulysses import heads_to_seq, replicate_kv, seq_to_heads
from burst import burst_attn, comm
from burst.attention import choice_problems
from burst.kernel import resolve_scale
from burst.layout import global_positions
from burst.masks import MaskSpec
from burst.remake import remakeable

__all__ = ["usp_attn", "usp_groups"]

LAYOUTS = ("contiguous", "zigzag")


def usp_groups(group, ulysses_degree: int):
    """(ulysses group, ring group, ring position) of this rank; groups are created once."""
    ranks = comm.group_ranks(group)
    u, r = ulysses_degree, len(ranks) // ulysses_degree
    uly = comm.subgroup([ranks[i * u:(i + 1) * u] for i in range(r)], parent=group,
                        purpose="usp-ulysses")
    ring = comm.subgroup([ranks[j::u] for j in range(u)], parent=group, purpose="usp-ring")
    return uly, ring, comm.rank(group) // u


@lru_cache(maxsize=256)
def _ring_order(seq_local: int, world: int, degree: int, ring_pos: int, layout: str,
                device: torch.device | str = "cpu"):
    """Permutation taking the gathered rows (the U shards in rank order) to ring position
    ``ring_pos``'s shard of ``layout`` over R = world/degree ranks, and its inverse; cached on
    ``device`` (a host-to-GPU copy per call would wait for the GPU queue every layer); plain
    tensors also when first made under ``torch.inference_mode`` (as ``ulysses``' positions).
    (None, None) where it is the identity (the contiguous layout): nothing to copy."""
    r = world // degree
    with torch.inference_mode(False):
        have = torch.cat([global_positions(seq_local, world, ring_pos * degree + j, layout)
                          for j in range(degree)])
        want = global_positions(seq_local * degree, r, ring_pos, layout)
        order = torch.argsort(have)
        perm = order[torch.searchsorted(have[order], want)]
        if not torch.equal(have[perm], want):  # guarded by _requires; an internal invariant
            raise AssertionError(f"{layout} over {world} ranks is not a {layout} layout "
                                 f"over {r}")
        if torch.equal(perm, torch.arange(len(perm))):
            return None, None
        return perm.to(device), torch.argsort(perm).to(device)


def usp_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, group=None,
             ulysses_degree: int = 2, layout: str = "contiguous", backward: str = "ring",
             window: tuple[int, int] | None = None, cu_seqlens=None, backend: str = "auto",
             grad_acc: str = "fp32"):
    """Ulysses (degree U) x ring (R = G/U) attention.

    Args:
        q: (batch, seq_local, heads, head_dim), this rank's shard in ``layout`` over the whole
            group; heads % U == 0.
        k, v: (batch, seq_local, kv_heads, head_dim); kv_heads % U == 0 or U % kv_heads == 0.
        ulysses_degree: U, the size of the Ulysses (head-parallel) groups; divides G.
        backward: ``ring`` (yunchang's classic ring backward), ``burst`` (BurstEngine's
            Burst-USP: Ulysses inside a node, BurstAttention's backward across nodes) or
            ``auto`` (the one whose ring moves fewer bytes: ``burst_attn``'s rule).
        grad_acc: the ring's travelling gradient accumulators (dK, dV or dQ) in ``fp32`` or
            in the ``input`` dtype (BurstEngine's dQ), as ``burst_attn``'s.
    Returns:
        out shaped like q.
    """
    ulysses_degree = plain_integer(ulysses_degree)
    check_call(METHOD, q, k, v, causal=causal, group=group,
               options=dict(layout=layout, ulysses_degree=ulysses_degree, backward=backward,
                            grad_acc=grad_acc),
               backend=backend)
    g, n = comm.world_size(group), q.shape[1]
    # the mask and scale are checked again inside burst_attn, after the all-to-alls: check
    # them here, before any communication, so a bad one fails every rank at once
    MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens).check_length(n * g)
    resolve_scale(q.shape[-1], softmax_scale)
    uly, ring, ring_pos = usp_groups(group, ulysses_degree)
    perm, inv = _ring_order(n, g, ulysses_degree, ring_pos, layout, q.device)

    def gather(q, k, v):  # the Ulysses group's tokens of this rank's heads, as its ring shard
        qh, kh, vh = (seq_to_heads(t, uly) for t in (q, replicate_kv(k, ulysses_degree),
                                                      replicate_kv(v, ulysses_degree)))
        if perm is None:  # the group's shards in rank order are its ring shard (contiguous)
            return qh, kh, vh
        return tuple(t.index_select(1, perm) for t in (qh, kh, vh))

    # remakeable: a selective checkpoint keeps none of them, and gathers them again in backward
    qh, kh, vh = remakeable(gather, q, k, v)
    out = burst_attn(qh, kh, vh, causal=causal, softmax_scale=softmax_scale, layout=layout,
                     group=ring, backward=backward, window=window, cu_seqlens=cu_seqlens,
                     backend=backend, grad_acc=grad_acc)

    def scatter(out):  # back to this rank's tokens of every head
        return (heads_to_seq(out if inv is None else out.index_select(1, inv), uly),)

    # remakeable: a selective checkpoint keeps the ring's output alone, and moves it again
    return remakeable(scatter, out)[0]


def _requires(*, world, heads, kv_heads, seq_local, layout, ulysses_degree, backward="ring",
              grad_acc="fp32", **_):
    out = degree_problems("ulysses_degree", ulysses_degree, world, heads, kv_heads,
                          kv_replicate=True)
    if backward not in ("auto", "ring", "burst"):
        out.append(f"backward={backward!r}; valid: auto, ring, burst")
    out += layout_problems(layout, seq_local, LAYOUTS) + choice_problems(grad_acc=grad_acc)
    return out


METHOD = register(Method(
    name="usp",
    fn=usp_attn,
    description="USP (yunchang): Ulysses inside groups of ulysses_degree consecutive ranks x "
                "ring attention across the groups (backward=ring: classic; burst: Burst-USP)",
    layouts=LAYOUTS,
    options={"layout": "contiguous", "ulysses_degree": 2, "backward": "ring", "grad_acc": "fp32"},
    requires=_requires,
    row_saves=False,  # its Ulysses part also saves the all-to-all's index tensors
))
