"""Single-process emulation of a G-rank BurstAttention ring (issue 8).

Every rank's blocks are computed in one process, with the same code as the distributed ring:
the schedule (``burst.ring.visit_order``: flat or double ring, shortened for windows), the
per-step work (``burst.attention.BlockSteps``: ``plan_pair`` -> kernel shim -> LSE merge, and
the burst / ring backward step), the same kernels and the same accumulation dtypes. Only the
communication is left out: a block "arriving" at a rank is simply the other rank's shard.

So a single GPU can check the multi-rank algorithm's numerics for every layout, mask and backward
scheme, and time the per-step kernels at realistic sizes (``scripts/gpu_check.py``,
``scripts/bench_ring_compute.py``):

    em = RingEmulator(q, k, v, world=8, causal=True, layout="zigzag")   # full sequences in
    out, lse = em.forward()                  # full-sequence out (natural order), lse
    dq, dk, dv = em.backward(dout, scheme="burst")
    state = em.new_forward_state()
    for src, call in em.forward_calls(0, state): call()  # one rank's steps, one by one

``emulate_attn`` wraps this as a differentiable function of the full q, k, v.

Shapes: q (B, N, H, D), k/v (B, N, Hk, D) full global sequences in natural order; per-rank
shards (B, N/G, ., D) in the layout's order; lse (B, H, N).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from burst.attention import BACKWARD_SCHEMES, BlockSteps, flag, qkv_problems
from burst.comm import ranks_per_node_problem, ring_shape
from burst.first_order import first_order
from burst.kernel import acc_dtype, backend_problem, resolve_scale
from burst.layout import length_problem, local_index
from burst.masks import MaskSpec, flat_ring_suffices, ring_reach
from burst.merge import new_accumulators, row_delta
from burst.ring import visit_order

__all__ = ["RingEmulator", "emulate_attn"]

Call = Callable[[], None]


class RingEmulator:
    """All G ranks of one BurstAttention call, replayed in one process (see the module doc)."""

    def __init__(self, q, k, v, *, world: int, causal: bool = False, layout: str = "zigzag",
                 ranks_per_node: int | None = None, window: tuple[int, int] | None = None,
                 cu_seqlens=None, softmax_scale: float | None = None, backend: str = "auto"):
        _validate(q, k, v, world=world, layout=layout, ranks_per_node=ranks_per_node,
                  backend=backend)
        self.world, self.layout, self.dtype = world, layout, q.dtype
        self.seq_len = q.shape[1]
        self.n = self.seq_len // world
        self.nodes = ring_shape(world, ranks_per_node)[0]
        self.spec = MaskSpec(causal=causal, window=window, cu_seqlens=cu_seqlens)
        self.spec.check_length(self.seq_len)
        scale = resolve_scale(q.shape[-1], softmax_scale)
        self.steps = BlockSteps(self.spec, layout, world, scale, backend)
        if flat_ring_suffices(self.spec, layout, world, self.n, self.nodes):
            self.nodes = 1  # as burst_attn: a flat ring of at most M - 1 steps each way
        self.span, self.back = ring_reach(self.spec, layout, world, self.n, self.nodes)
        self._index = [local_index(self.seq_len, world, r, layout).to(q.device)
                       for r in range(world)]
        self.q, self.k, self.v = (self.shard(t) for t in (q, k, v))
        self.out: list[torch.Tensor] | None = None
        self.lse: list[torch.Tensor] | None = None

    # -- layout ---------------------------------------------------------------------------------

    def shard(self, x: torch.Tensor, dim: int = 1) -> list[torch.Tensor]:
        """Every rank's shard of a full-sequence tensor (contiguous, like a received block)."""
        return [x.index_select(dim, idx).contiguous() for idx in self._index]

    def unshard(self, parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
        """Inverse of ``shard``: the full sequence in natural order."""
        shape = list(parts[0].shape)
        shape[dim] = self.seq_len
        out = parts[0].new_empty(shape)
        for idx, part in zip(self._index, parts, strict=True):
            out.index_copy_(dim, idx, part)
        return out

    # -- schedule -------------------------------------------------------------------------------

    def order(self, rank: int, direction: int = 1) -> list[int]:
        """Ring positions whose blocks ``rank`` visits, in step order (same as ``run_ring``)."""
        return visit_order(self.world, rank, nodes=self.nodes, span=self.span, back=self.back,
                           direction=direction)

    # -- forward --------------------------------------------------------------------------------

    def new_forward_state(self):
        """Fresh running (O, LSE) accumulators for every rank."""
        acc = acc_dtype(self.dtype)
        return [new_accumulators(q, acc) for q in self.q]

    def forward_calls(self, rank: int, state) -> list[tuple[int, Call]]:
        """Rank ``rank``'s forward steps as (source rank, call), in ring order."""
        out, lse = state[rank]

        def call(src):
            return lambda: self.steps.forward(self.q[rank], self.k[src], self.v[src], out, lse,
                                              q_rank=rank, k_rank=src)

        return [(src, call(src)) for src in self.order(rank)]

    def forward(self):
        """Run every rank's forward ring; return full-sequence (out, lse)."""
        state = self.new_forward_state()
        for r in range(self.world):
            for _, call in self.forward_calls(r, state):
                call()
        self.out = [o.to(self.dtype) for o, _ in state]
        self.lse = [lse for _, lse in state]
        return self.unshard(self.out), self.unshard(self.lse, dim=2)

    # -- backward -------------------------------------------------------------------------------

    def new_backward_state(self, dout: torch.Tensor):
        """(dO, D) shards and zeroed fp32 (dq, dk, dv) for every rank; needs ``forward`` first."""
        if self.out is None:
            raise RuntimeError("RingEmulator.backward needs forward() first")
        acc = acc_dtype(self.dtype)
        do = self.shard(dout)
        delta = [row_delta(d, o, acc) for d, o in zip(do, self.out, strict=True)]
        grads = [tuple(torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v))
                 for q, k, v in zip(self.q, self.k, self.v, strict=True)]
        return do, delta, grads

    def backward_calls(self, rank: int, state, scheme: str = "burst") -> list[tuple[int, Call]]:
        """Rank ``rank``'s backward steps as (source rank, call), in ring order.

        ``burst``: rank holds K/V, the queries (Q, dO, D, LSE) of each source visit it (travelling
        backwards, as in ``burst.attention``) and their dQ accumulates for the source. ``ring``:
        rank holds the queries, K/V of each source visit it and dK/dV accumulate for the source.
        """
        do, delta, grads = state
        s = self.steps

        def burst(src):
            return lambda: s.backward(do[src], self.q[src], self.k[rank], self.v[rank],
                                      self.lse[src], delta[src], grads[src][0], grads[rank][1],
                                      grads[rank][2], q_rank=src, k_rank=rank)

        def ring(src):  # the queries' own output stands for D, as in burst.attention
            return lambda: s.backward(do[rank], self.q[rank], self.k[src], self.v[src],
                                      self.lse[rank], delta[rank], grads[rank][0], grads[src][1],
                                      grads[src][2], q_rank=rank, k_rank=src,
                                      out_BSHD=self.out[rank])

        if scheme == "burst":
            return [(src, burst(src)) for src in self.order(rank, direction=-1)]
        if scheme == "ring":
            return [(src, ring(src)) for src in self.order(rank)]
        raise ValueError(f"unknown backward scheme {scheme!r}; valid: burst, ring")

    def backward(self, dout: torch.Tensor, scheme: str = "burst"):
        """Run every rank's backward ring; return full-sequence (dq, dk, dv) in the input dtype."""
        state = self.new_backward_state(dout)
        for r in range(self.world):
            for _, call in self.backward_calls(r, state, scheme):
                call()
        grads = state[2]
        return tuple(self.unshard([g[i].to(self.dtype) for g in grads]) for i in range(3))


def _validate(q, k, v, *, world, layout, ranks_per_node, backend) -> None:
    shape_problems = qkv_problems(q, k, v)  # burst_attn's own checks: tensors, dims, dtypes
    if any("expected 4 dims" in p for p in shape_problems):
        raise ValueError("RingEmulator: " + "; ".join(shape_problems))
    problems = []
    if not isinstance(world, int) or world < 1:
        problems.append(f"world={world!r}: expected an int >= 1")
    else:
        if why := length_problem(q.shape[1], world, layout):
            problems.append(why)
        why = ranks_per_node_problem(world, ranks_per_node)
        if why:
            problems.append(why)
    problems += shape_problems
    if not shape_problems and (0 in (q.shape[2], k.shape[2]) or q.shape[2] % k.shape[2]
                               or q.shape[1] == 0):
        problems.append(f"q {tuple(q.shape)}, k {tuple(k.shape)}: expected (B, N, H, D) and "
                        "(B, N, Hk, D) with N > 0 and H % Hk == 0")
    if not shape_problems and (why := backend_problem(backend, q.device.type)):
        problems.append(why)  # a CUDA kernel on CPU tensors failed in the first block
    if problems:
        raise ValueError("RingEmulator: " + "; ".join(problems))


class _Emulated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kwargs: dict, scheme: str):
        em = RingEmulator(q.detach(), k.detach(), v.detach(), **kwargs)
        out, lse = em.forward()
        ctx.em, ctx.scheme = em, scheme
        return out, lse

    @staticmethod
    @first_order  # a second derivative would silently be wrong
    def backward(ctx, dout, dlse):
        if dlse is not None and bool(dlse.ne(0).any()):
            raise NotImplementedError("the ring emulator does not differentiate lse; use "
                                      "burst_attn (or leave lse out of the loss)")
        dq, dk, dv = ctx.em.backward(dout.contiguous(), ctx.scheme)
        return dq, dk, dv, None, None


def emulate_attn(q, k, v, *, world: int, causal: bool = False, softmax_scale: float | None = None,
                 layout: str = "zigzag", ranks_per_node: int | None = None,
                 backward: str = "burst", window: tuple[int, int] | None = None,
                 cu_seqlens=None, backend: str = "auto", return_lse: bool = False):
    """``burst_attn`` over ``world`` emulated ranks, on full sequences in natural order.

    Differentiable; ``backward`` is ``burst`` or ``ring`` (both run the same step code as the
    distributed backward). Returns out (B, N, H, D) [, lse (B, H, N)].
    """
    if backward not in BACKWARD_SCHEMES or backward == "auto":
        raise ValueError(f"unknown backward {backward!r} for the emulation; valid: burst, ring")
    return_lse = flag("emulate_attn", "return_lse", return_lse)
    _validate(q, k, v, world=world, layout=layout, ranks_per_node=ranks_per_node,
              backend=backend)  # before autograd sees them (a list has no .detach)
    kwargs = dict(world=world, causal=causal, layout=layout, ranks_per_node=ranks_per_node,
                  window=window, cu_seqlens=cu_seqlens, softmax_scale=softmax_scale,
                  backend=backend)
    out, lse = _Emulated.apply(q, k, v, kwargs, backward)
    return (out, lse) if return_lse else out
