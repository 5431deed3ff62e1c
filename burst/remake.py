"""``remakeable``: tensors an attention method makes from its inputs by moving them alone.

Ulysses and USP turn the layer's q, k, v (sequence-sharded) into head-sharded ones with
all-to-alls, and their kernels save those for backward: as big as q, k, v themselves; their
output is the kernel's, moved back by one more all-to-all. The engine's selective checkpointing
(``burst.engine.checkpointing``) keeps what a method saves, except its inputs, which it
recomputes in backward; a method that makes such tensors through ``remakeable``, from its inputs
or from what its kernel saved, lets the cache drop them too and make them again by calling the
same function in backward (its all-to-alls run again: bytes for memory, as the paper's systems
do when they recompute a layer but its attention). Outside a recording cache it is a plain call.

    qh, kh, vh = remakeable(gather, q, k, v)   # gather(q, k, v) -> (qh, kh, vh), no other state
    (out,) = remakeable(scatter, out_heads)    # the kernel saved out_heads

``fn`` must be a function of its tensor arguments alone (same values every call), and tell no
other tensor apart: the cache calls it again under ``torch.no_grad()`` on the recomputed inputs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

import torch

__all__ = ["recording", "remakeable"]

_RECORDER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("remake_recorder",
                                                                           default=None)


def remakeable(fn: Callable[..., tuple[torch.Tensor, ...]], *inputs: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
    """``fn(*inputs)``, told to a recording cache (``recording``) as a recipe for its outputs.
    ``fn`` returns a tuple (or list) of tensors, one output as ``(out,)``."""
    out = fn(*inputs)
    if not isinstance(out, (tuple, list)):  # tuple(tensor) would be the tuple of its rows
        raise TypeError(f"remakeable: {getattr(fn, '__qualname__', fn)} returned a "
                        f"{type(out).__name__}, not a tuple of tensors; return (out,)")
    out = tuple(out)
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder(fn, inputs, out)
    return out


@contextlib.contextmanager
def recording(callback: Callable[[Callable, tuple, tuple], None]):
    """Inside the block, every ``remakeable`` call reports ``(fn, inputs, outputs)``."""
    token = _RECORDER.set(callback)
    try:
        yield
    finally:
        _RECORDER.reset(token)
