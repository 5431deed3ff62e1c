"""Attention over a whole (gathered) sequence on one rank, through the kernel shim, with autograd.

Ulysses (after its all-to-all) and tensor parallelism hold the full sequence for a subset of the
heads; both compute plain local attention here. One kernel call when the mask is none or plain
causal; windows and documents become one dense mask over the sequence (``burst.masks``).

Shapes: q_BSHD (batch, N, H, D), k/v (batch, N, Hk, D) with H % Hk == 0, all in global token
order. Saved for backward: q, k, v, out, lse (fp32), exactly what a flash kernel keeps.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from burst.kernel import acc_dtype, block_backward, block_forward
from burst.masks import CAUSAL, DENSE, FULL, MaskSpec
from burst.merge import row_delta

__all__ = ["local_attention"]


def _kind(spec: MaskSpec, n: int) -> tuple[str, torch.Tensor | None]:
    if spec.is_plain:
        return (CAUSAL if spec.causal else FULL), None
    pos = torch.arange(n)  # planned on the host, as burst.masks does: no device sync per call
    return DENSE, spec.visible(pos, pos)


class _LocalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: MaskSpec, scale: float, backend: str):
        kind, mask = _kind(spec, q.shape[1])
        out, lse = block_forward(q, k, v, scale=scale, kind=kind, mask=mask, backend=backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (kind, mask, scale, backend)
        return out

    @staticmethod
    @once_differentiable  # a second derivative would silently be wrong
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        kind, mask, scale, backend = ctx.args
        acc = acc_dtype(q.dtype)
        dout = dout.contiguous()
        delta = row_delta(dout, out, acc)
        dq, dk, dv = block_backward(dout, q, k, v, lse, delta, scale=scale, kind=kind, mask=mask,
                                    backend=backend)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def local_attention(q_BSHD, k_BSHD, v_BSHD, *, spec: MaskSpec, scale: float,
                    backend: str = "auto") -> torch.Tensor:
    """out (batch, N, H, D) of full-sequence attention under ``spec`` (global positions)."""
    return _LocalAttention.apply(q_BSHD.contiguous(), k_BSHD.contiguous(), v_BSHD.contiguous(),
                                 spec, scale, backend)
