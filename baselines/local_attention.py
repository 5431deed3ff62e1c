"""Attention over a whole (gathered) sequence on one rank, through the kernel shim, with autograd.

Ulysses (after its all-to-all) and tensor parallelism hold the full sequence for a subset of the
heads; both compute plain local attention here. One kernel call when the mask is none or plain
causal; windows and documents go through the ring's own block plan (``burst.masks.plan_pair`` for
one rank holding the whole sequence): the visible bulk in mask-free calls, the edges in small
dense tiles merged by their lse, never an (N, N) mask.

Shapes: q_BSHD (batch, N, H, D), k/v (batch, N, Hk, D) with H % Hk == 0, all in global token
order. Saved for backward: q, k, v, out, lse (fp32), exactly what a flash kernel keeps.
"""

from __future__ import annotations

import torch

from burst.attention import BlockSteps
from burst.first_order import first_order
from burst.kernel import acc_dtype, block_backward, block_forward
from burst.masks import CAUSAL, FULL, MaskSpec
from burst.merge import new_accumulators, row_delta

__all__ = ["local_attention"]


def _one_rank(spec: MaskSpec, scale: float, backend: str) -> BlockSteps:
    return BlockSteps(spec, "contiguous", 1, scale, backend)


def _plain_kind(spec: MaskSpec) -> str:
    return CAUSAL if spec.causal else FULL


class _LocalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: MaskSpec, scale: float, backend: str):
        if spec.is_plain:
            out, lse = block_forward(q, k, v, scale=scale, kind=_plain_kind(spec),
                                     backend=backend)
        else:
            out, lse = new_accumulators(q, acc_dtype(q.dtype))
            _one_rank(spec, scale, backend).forward(q, k, v, out, lse, q_rank=0, k_rank=0)
            out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (spec, scale, backend)
        return out

    @staticmethod
    @first_order  # a second derivative would silently be wrong
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        spec, scale, backend = ctx.args
        acc = acc_dtype(q.dtype)
        dout = dout.contiguous()
        delta = row_delta(dout, out, acc)
        if spec.is_plain:
            dq, dk, dv = block_backward(dout, q, k, v, lse, delta, scale=scale,
                                        kind=_plain_kind(spec), backend=backend, out_BSHD=out)
        else:
            dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v))
            _one_rank(spec, scale, backend).backward(dout, q, k, v, lse, delta, dq, dk, dv,
                                                     q_rank=0, k_rank=0, out_BSHD=out)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def local_attention(q_BSHD, k_BSHD, v_BSHD, *, spec: MaskSpec, scale: float,
                    backend: str = "auto") -> torch.Tensor:
    """out (batch, N, H, D) of full-sequence attention under ``spec`` (global positions)."""
    spec.check_length(q_BSHD.shape[1])
    return _LocalAttention.apply(q_BSHD.contiguous(), k_BSHD.contiguous(), v_BSHD.contiguous(),
                                 spec.over(q_BSHD.shape[1]), scale, backend)
