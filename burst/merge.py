"""The one numerics module for combining partial attention results by their log-sum-exp.

Partial results (o_r, lse_r) of the same query rows against disjoint key blocks combine exactly
(DESIGN.md 3): LSE' = logaddexp(LSE, lse_r), O' = O*exp(LSE - LSE') + o_r*exp(lse_r - LSE'),
whose weights are computed as sigmoid(LSE - lse_r) and sigmoid(lse_r - LSE).
The running (O, LSE) are kept in fp32 (float64 for float64 inputs). Rows that have seen no key
yet carry LSE = -inf and O = 0; they stay so until a visible key arrives (no NaN).

Shapes: out_BSHD, lse_BHS.
"""

from __future__ import annotations

import torch

__all__ = ["merge_into", "new_accumulators", "row_delta"]


def row_delta(do_BSHD: torch.Tensor, out_BSHD: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """D = rowsum(dO * O) as (B, H, S) in the accumulation dtype (the softmax backward's term)."""
    return (do_BSHD.to(acc) * out_BSHD.to(acc)).sum(-1).transpose(1, 2).contiguous()


def new_accumulators(q_BSHD: torch.Tensor, acc: torch.dtype):
    """Empty running (O, LSE) for the rows of q: zeros and -inf."""
    b, s, h, d = q_BSHD.shape
    out = torch.zeros((b, s, h, d), dtype=acc, device=q_BSHD.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=acc, device=q_BSHD.device)
    return out, lse


def _weights(lse_old: torch.Tensor, lse_new: torch.Tensor, lse_tot: torch.Tensor):
    """exp(LSE - LSE') and exp(lse_r - LSE') as sigmoids of the difference d = lse_r - LSE,
    the same numbers without LSE' (rounded to its ulp, eps |LSE'|, which exp(LSE - LSE')
    carried into every weight: at float32 logits of 1e4 an output 4e-4 off where one kernel
    call is 5e-6, and gradients, through the backward's D of that output, 5.6x their size
    off; the dominant block now weighs 1 up to e^-|d|). Only a row that has seen no key
    (LSE = -inf) gets weight 0 instead of NaN from -inf + inf; a NaN LSE propagates, as in one
    kernel call on the whole row (an LSE of +inf, which no backend returns, takes the whole
    weight). What a kernel returns for a
    NaN input is the kernel's (the ``cpu_flash`` backend gives the oracle's there); the
    harness checks every cell's output and gradients for both (suites.measure)."""
    empty = lse_tot == float("-inf")
    d = torch.where(empty, torch.zeros_like(lse_tot), lse_new - lse_old)
    w_old = torch.where(empty, torch.zeros_like(lse_tot), torch.sigmoid(-d))
    w_new = torch.where(empty, torch.zeros_like(lse_tot), torch.sigmoid(d))
    return w_old, w_new


def merge_into(out_BSHD: torch.Tensor, lse_BHS: torch.Tensor, blk_out_BSHD: torch.Tensor,
               blk_lse_BHS: torch.Tensor, rows: slice = slice(None)) -> None:
    """Merge one block's (out, lse) for ``rows`` of the running accumulators, in place."""
    lse_old = lse_BHS[:, :, rows]
    blk_lse = blk_lse_BHS.to(lse_BHS.dtype)
    lse_tot = torch.logaddexp(lse_old, blk_lse)
    w_old, w_new = _weights(lse_old, blk_lse, lse_tot)
    o = out_BSHD[:, rows]
    o.mul_(w_old.transpose(1, 2).unsqueeze(-1))
    o.add_(blk_out_BSHD.to(out_BSHD.dtype) * w_new.transpose(1, 2).unsqueeze(-1))
    lse_BHS[:, :, rows] = lse_tot
