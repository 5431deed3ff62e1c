"""Llama 3 context parallelism: all-gather K/V, attend locally, reduce-scatter dK/dV.

The Llama 3 paper (arXiv 2407.21783, section 3.3.2) all-gathers K and V across the
context-parallel group and computes the attention of the local queries against the whole K/V,
on the zigzag layout (2G chunks, rank r holds chunks r and 2G-1-r) for causal load balance;
all-gather rather than a ring because it is simpler, handles any mask, and K/V are small with
GQA. TransformerEngine's ``AttnFuncWithCPAndKVAllGather`` implements it; like TE we save only the
local K/V shards for backward (memory) and gather them again there, and reduce-scatter dK/dV in
the input dtype.

Forward: gather K/V, then for each source rank's block the ring's own step
(``burst.attention.BlockSteps``: ``burst.masks.plan_pair`` skips fully masked pairs and makes
zigzag's half-visible pairs one call on half the rows, merged by log-sum-exp into fp32
accumulators).
Backward: gather K/V again, local dQ and per-source dK/dV (fp32), reduce-scatter dK/dV.

Bytes per rank (``burst.volume``): forward (G-1)*kv, backward 2*(G-1)*kv, kv = one local K+V.

Shapes: q_BSHD (local shard), k/v_BSHD (local, Hk heads, GQA gathered un-replicated), lse_BHS.
"""

from __future__ import annotations

import torch

from baselines.checks import check_call, layout_problems
from baselines.registry import Method, register
from burst import comm
from burst.attention import BlockSteps
from burst.first_order import first_order
from burst.kernel import acc_dtype, resolve_scale
from burst.layout import LAYOUTS
from burst.masks import MaskSpec
from burst.merge import new_accumulators, row_delta

__all__ = ["allgather_attn"]


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: MaskSpec, layout: str, group, scale: float, backend: str):
        g, me = comm.world_size(group), comm.rank(group)
        with comm.phase("forward"):
            k_all = comm.all_gather_list(k, group=group)
            v_all = comm.all_gather_list(v, group=group)
        out, lse = new_accumulators(q, acc_dtype(q.dtype))
        steps = BlockSteps(spec, layout, g, scale, backend)
        for src in range(g):
            steps.forward(q, k_all[src], v_all[src], out, lse, q_rank=me, k_rank=src)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (spec, layout, group, scale, backend)
        return out

    @staticmethod
    @first_order  # a second derivative would silently be wrong
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        spec, layout, group, scale, backend = ctx.args
        g, me, n = comm.world_size(group), comm.rank(group), q.shape[1]
        acc = acc_dtype(q.dtype)
        dout = dout.contiguous()
        delta = row_delta(dout, out, acc)
        with comm.phase("backward"):
            k_all = comm.all_gather_list(k, group=group)
            v_all = comm.all_gather_list(v, group=group)
            dq = torch.zeros(q.shape, dtype=acc, device=q.device)
            dk_all = torch.zeros((k.shape[0], g * n, *k.shape[2:]), dtype=acc, device=k.device)
            dv_all = torch.zeros_like(dk_all)
            steps = BlockSteps(spec, layout, g, scale, backend)
            for src in range(g):
                piece = slice(src * n, (src + 1) * n)
                steps.backward(dout, q, k_all[src], v_all[src], lse, delta, dq,
                               dk_all[:, piece], dv_all[:, piece], q_rank=me, k_rank=src,
                               out_BSHD=out)
            # piece i of the gathered sequence is rank i's shard: reduce-scatter hands it home
            dk = comm.reduce_scatter(dk_all.to(k.dtype), dim=1, group=group)
            dv = comm.reduce_scatter(dv_all.to(v.dtype), dim=1, group=group)
        return dq.to(q.dtype), dk, dv, None, None, None, None, None


def allgather_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                   group=None, layout: str = "zigzag", window: tuple[int, int] | None = None,
                   cu_seqlens=None, backend: str = "auto"):
    """Llama 3 all-gather context-parallel attention.

    Args:
        q: (batch, seq_local, heads, head_dim), this rank's shard in ``layout``.
        k, v: (batch, seq_local, kv_heads, head_dim).
        causal, window, cu_seqlens: the mask in global token positions.
        layout: ``zigzag`` (Llama 3), ``contiguous`` or ``striped``.
    Returns:
        out shaped like q.
    """
    check_call(METHOD, q, k, v, causal=causal, group=group, options=dict(layout=layout),
               backend=backend)
    spec = MaskSpec(causal=causal, window=window,
                    cu_seqlens=cu_seqlens)
    spec.check_length(q.shape[1] * comm.world_size(group))
    scale = resolve_scale(q.shape[-1], softmax_scale)
    return _AllGatherAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), spec,
                                     layout, group, scale, backend)


def _requires(*, seq_local, layout, **_):
    return layout_problems(layout, seq_local)


METHOD = register(Method(
    name="allgather",
    fn=allgather_attn,
    description="Llama 3 context parallelism: all-gather K/V, local attention (zigzag), "
                "reduce-scatter dK/dV",
    layouts=LAYOUTS,
    options={"layout": "zigzag"},
    requires=_requires,
))
