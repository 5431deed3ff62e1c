"""Fused LM head + cross-entropy: the local tokens in chunks, never all logits at once.

BurstEngine's fused head (DESIGN.md 3, BurstEngine paper): for a chunk of c tokens the
forward computes the logits (c x V), the loss and at once the gradient of the loss w.r.t. the
logits, which it turns into the chunk's share of dL/dhidden and dL/dW before the next chunk.
The peak holds one chunk of logits instead of S x V, and what backward keeps is dL/dhidden
(S x E) and dL/dW (V x E), not the logits. Backward only scales them by the incoming gradient.

The loss is ``scale * sum over valid tokens of -log softmax(logits)[target]``; tokens whose target
is ``ignore_index`` contribute nothing. With ``scale`` = 1 / (valid tokens of the whole global
batch, all ranks), which the Trainer gets with one all-reduce, the sum of every rank's result is
the exact global mean and every rank's gradient is its exact share.

Shapes: hidden_TE (T local tokens, E), weight_VE, targets_T (int64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from burst.first_order import first_order
from burst.kernel import acc_dtype

__all__ = ["IGNORE_INDEX", "LOSS_CHUNK", "fused_linear_cross_entropy", "plain_cross_entropy"]

LOSS_CHUNK = 1024
"""Tokens per chunk of the fused head: its logits never exceed LOSS_CHUNK x vocab."""

IGNORE_INDEX = -100


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_TE, weight_VE, targets_T, chunk: int, ignore_index: int,
                scale: float, want_h: bool, want_w: bool):
        # The matmuls run in the model's dtype (tensor cores for bf16, fp32 accumulation inside,
        # as the plain head's F.linear); softmax, loss and the weight gradient's sum in fp32.
        # An fp32 copy of the V x E weight would cost its memory and, on GPUs without TF32,
        # run the head's three matmuls an order of magnitude slower.
        acc = acc_dtype(hidden_TE.dtype)
        t_total = hidden_TE.shape[0]
        w = weight_VE.to(hidden_TE.dtype)  # no copy when they agree
        grad_h = torch.empty_like(hidden_TE) if want_h else None
        grad_w = (torch.zeros(weight_VE.shape, dtype=acc, device=weight_VE.device)
                  if want_w else None)
        total = torch.zeros((), dtype=acc, device=hidden_TE.device)
        for s in range(0, t_total, chunk):
            h = hidden_TE[s:s + chunk]
            tgt = targets_T[s:s + chunk]
            valid = tgt != ignore_index
            safe = torch.where(valid, tgt, torch.zeros_like(tgt))
            # one c x V buffer, the only large one: logits, then exp(logits - max), then the
            # gradient d(scale * loss)/dlogits = scale * (softmax - onehot(target)), in place
            buf = (h @ w.t()).to(acc)
            picked = buf.gather(1, safe[:, None]).squeeze(1)
            top = buf.max(dim=-1).values
            sumexp = buf.sub_(top[:, None]).exp_().sum(dim=-1)
            lse = top + sumexp.log()
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            if not (want_h or want_w):  # evaluation: the loss only
                del buf  # before the next chunk allocates its own
                continue
            weight_row = valid.to(acc) * scale
            buf.mul_((weight_row / sumexp)[:, None])
            rows = torch.arange(len(tgt), device=tgt.device)
            buf[rows, safe] -= weight_row
            g = buf.to(h.dtype)  # no copy when they agree
            del buf
            if want_h:
                grad_h[s:s + chunk] = g @ w
            if want_w and g.dtype == acc:
                grad_w.addmm_(g.t(), h)
            elif want_w:  # the chunk's product in bf16 (a V x E temporary), summed in fp32
                grad_w += g.t() @ h
            del g  # (the same tensor as buf when the dtypes agree) before the next chunk's
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w.to(weight_VE.dtype))
        return total * scale

    @staticmethod
    @first_order  # the saved gradients are constants: a second derivative would be wrong
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return (None if grad_h is None else grad_h * grad_out.to(grad_h.dtype),
                None if grad_w is None else grad_w * grad_out.to(grad_w.dtype),
                None, None, None, None, None, None)


def fused_linear_cross_entropy(hidden_TE: torch.Tensor, weight_VE: torch.Tensor,
                               targets_T: torch.Tensor, *, chunk: int = LOSS_CHUNK,
                               ignore_index: int = IGNORE_INDEX,
                               scale: float = 1.0) -> torch.Tensor:
    """scale * summed cross-entropy of ``hidden @ weight.T`` against targets, in chunks of
    ``chunk`` tokens (a 0-dim tensor; differentiable w.r.t. hidden and weight)."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"loss chunk={chunk!r} must be a positive number of tokens")
    if hidden_TE.dim() != 2 or targets_T.shape != hidden_TE.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden_TE.shape)} and targets {tuple(targets_T.shape)}: "
                         "expected (tokens, hidden) and (tokens,)")
    grad_on = torch.is_grad_enabled()  # evaluation, or a frozen head: no work for that grad
    return _FusedLinearCrossEntropy.apply(hidden_TE, weight_VE, targets_T, chunk, ignore_index,
                                          float(scale), grad_on and hidden_TE.requires_grad,
                                          grad_on and weight_VE.requires_grad)


def plain_cross_entropy(hidden_TE: torch.Tensor, weight_VE: torch.Tensor,
                        targets_T: torch.Tensor, *, ignore_index: int = IGNORE_INDEX,
                        scale: float = 1.0) -> torch.Tensor:
    """The unfused reference: all logits, then cross-entropy (logits in fp32 at least)."""
    logits = F.linear(hidden_TE, weight_VE)
    logits = logits.to(acc_dtype(logits.dtype))
    return F.cross_entropy(logits, targets_T, ignore_index=ignore_index,
                           reduction="sum") * scale
