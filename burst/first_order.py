"""``first_order``: the backward decorator of every hand-written attention, loss, checkpoint
and raw collective here (an identity, as checkpointing's ``_Anchor``, needs none).

torch's ``once_differentiable`` refuses a second derivative only when an incoming gradient
requires grad. A loss linear in the output (``(out * w).sum()``) hands backward a constant
gradient, so with ``create_graph=True`` (a gradient penalty) the second-order term was dropped
without a word: q.grad off by 1.4 against float64 in every method. Under ``create_graph=True``
autograd runs backward with grad mode on; that is refused here, by name.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

__all__ = ["first_order"]


def first_order(backward):
    """``once_differentiable``, and no backward under create_graph=True (see the module doc)."""
    inner = once_differentiable(backward)

    @functools.wraps(backward)
    def guarded(ctx, *grads):
        if torch.is_grad_enabled():  # (autograd calls a backward only where an input needs grad)
            owner = backward.__qualname__.split(".")[0].lstrip("_")
            raise RuntimeError(f"{owner}: no second derivative (backward with "
                               "create_graph=True); its backward is not itself differentiable")
        return inner(ctx, *grads)

    return guarded
