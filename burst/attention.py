"""BurstAttention: ring attention whose backward keeps K/V still and circulates Q, dO, D, LSE.

Forward (DESIGN.md 3): K/V travel the (flat or double) ring, each step's partial (o, lse) is
merged into the running (O, LSE) in fp32. Saved for backward: Q, own K/V, O, LSE.

Backward, two schemes sharing the ring schedule of ``burst.ring``:
  ``burst``: K and V stay; (Q_j, dO_j, D_j, LSE_j) travel, D_j = rowsum(dO_j * O_j) computed once
             by the owner, and the fp32 dQ_j trails one hop behind and returns home.
  ``ring``:  the classic ring backward: K, V travel, the fp32 dK, dV trail and return home.
``auto`` picks whichever moves fewer bytes for the shapes at hand (``burst.volume``): burst for
MHA (about 25% fewer elements at d_h = 128; 34% fewer bytes with bf16 data and fp32
accumulators), ring for GQA with few kv heads.

Shapes: q_BSHD (local shard), k_BSHD/v_BSHD with H % Hk == 0, lse_BHS.
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from dataclasses import dataclass

import torch

from burst import comm, volume
from burst.first_order import first_order
from burst.kernel import (
    BACKENDS,
    acc_dtype,
    block_backward,
    block_forward,
    resolve_backend,
    resolve_scale,
)
from burst.layout import heads_problem, local_length_problem
from burst.masks import MaskSpec, flat_ring_suffices, plan_pair, ring_reach
from burst.merge import merge_into, new_accumulators, row_delta
from burst.ring import run_ring

__all__ = ["BACKWARD_SCHEMES", "CHOICES", "BlockSteps", "burst_attn", "choice_problems",
           "ring_attention"]

BACKWARD_SCHEMES = ("auto", "burst", "ring")


@dataclass(frozen=True)
class BlockSteps:
    """The local work of one ring step, shared by the distributed ring and ``burst.emulate``.

    ``forward`` merges the attention of one rank's queries against another rank's K/V block into
    the running (O, LSE); ``backward`` adds one (query rank, key rank) pair's gradients into dq,
    dk, dv (the burst backward passes the travelling Q/dO/D/LSE/dQ with the local K/V/dK/dV, the
    ring backward the local Q side with the travelling K/V/dK/dV). Fully masked work is skipped by
    ``plan_pair`` (no kernel call, no merge).
    """

    spec: MaskSpec
    layout: str
    world: int
    scale: float
    backend: str

    def forward(self, q_BSHD, k_BSHD, v_BSHD, out_BSHD, lse_BHS, *, q_rank: int,
                k_rank: int) -> None:
        for c in plan_pair(self.spec, self.layout, self.world, q_rank, k_rank, q_BSHD.shape[1]):
            o, lse_blk = block_forward(q_BSHD[:, c.q], k_BSHD[:, c.k], v_BSHD[:, c.k],
                                       scale=self.scale, kind=c.kind, bounds=c.bounds,
                                       backend=self.backend)
            merge_into(out_BSHD, lse_BHS, o, lse_blk, rows=c.q)

    def backward(self, do_BSHD, q_BSHD, k_BSHD, v_BSHD, lse_BHS, delta_BHS, dq_BSHD, dk_BSHD,
                 dv_BSHD, *, q_rank: int, k_rank: int, out_BSHD=None) -> None:
        """``out_BSHD``: the queries' output where it is at hand and delta is rowsum(dO * out)
        (``burst.kernel.block_backward``)."""
        for c in plan_pair(self.spec, self.layout, self.world, q_rank, k_rank, q_BSHD.shape[1]):
            gq, gk, gv = block_backward(do_BSHD[:, c.q], q_BSHD[:, c.q], k_BSHD[:, c.k],
                                        v_BSHD[:, c.k], lse_BHS[:, :, c.q], delta_BHS[:, :, c.q],
                                        scale=self.scale, kind=c.kind, bounds=c.bounds,
                                        backend=self.backend,
                                        out_BSHD=None if out_BSHD is None else out_BSHD[:, c.q])
            dq_BSHD[:, c.q] += gq
            dk_BSHD[:, c.k] += gk
            dv_BSHD[:, c.k] += gv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: MaskSpec, layout: str, rg, scale: float, scheme: str,
                backend: str, grad_acc: str, lse_out: bool):
        g, me, n = rg.world, rg.me, q.shape[1]
        acc = acc_dtype(q.dtype)
        out_acc, lse = new_accumulators(q, acc)
        steps = BlockSteps(spec, layout, g, scale, backend)

        def step(src, kv, _):
            steps.forward(q, *kv, out_acc, lse, q_rank=me, k_rank=src)

        reach = ring_reach(spec, layout, g, n, rg.nodes)  # (span, back)
        with comm.phase("forward"):
            run_ring(rg, [k, v], step, span=reach[0], back=reach[1])
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.set_materialize_grads(False)  # an unused lse costs no zeros
        ctx.args = (spec, layout, rg, scale, scheme, backend, reach, grad_acc, lse_out)
        return out, lse

    @staticmethod
    @first_order  # a second derivative would silently be wrong
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        spec, layout, rg, scale, scheme, backend, reach, grad_acc, lse_out = ctx.args
        g, me = rg.world, rg.me
        acc = acc_dtype(q.dtype)
        travel = acc if grad_acc == "fp32" else q.dtype  # the accumulators that travel
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        delta = row_delta(dout, out, acc)
        with comm.phase("backward"):
            if dlse is not None:  # d lse / d s = P, so dS = P (dP - (D - dlse)): D - dlse travels
                delta = delta - dlse.to(acc)
            if lse_out:  # every rank asks (some may have no dlse): one collective on all
                backend = _backend_for_dlse(backend, q, dout, delta, dlse, rg)
            if scheme == "burst":
                dq, dk, dv = _backward_burst(q, k, v, dout, delta, lse, spec, layout, rg, scale,
                                             backend, reach, g, me, acc, travel)
            else:  # the local rows' output stands for D unless an lse gradient moved D
                dq, dk, dv = _backward_ring(q, k, v, dout, delta, lse, spec, layout, rg, scale,
                                            backend, reach, g, me, acc, travel,
                                            out if dlse is None else None)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None,
                None, None, None)


def _backend_for_dlse(backend: str, q, dout, delta, dlse, rg) -> str:
    """The kernel backend for the backward of a call that returned lse.

    Kernels that insist on ``out`` get a stand-in whose row sums against dO equal delta
    (``burst.kernel._stand_in_out``). With an lse gradient, delta = D - dlse is no longer
    bounded by |O||dO|: on a row whose dO is zero (a loss of lse alone, or of rows whose output
    is unused) no stand-in exists and the ``dlse * P`` part of the gradient would be lost, and
    on a row whose dO is tiny the stand-in overflows fp16. Then every rank (rows travel the
    ring) runs this backward on the ``torch`` backend, which takes delta itself; the ranks agree
    through one flag all-reduced over the ring (one int32, counted in the backward phase), which
    every rank of a call with ``return_lse=True`` joins, whether or not its own lse got a
    gradient."""
    if resolve_backend(backend, q) == "torch":
        return backend
    flag = torch.zeros(1, dtype=torch.int32, device=q.device)
    if dlse is not None:
        m = dout.abs().amax(-1).transpose(1, 2).to(delta.dtype)  # B H S: max |dO| per row
        limit = torch.finfo(q.dtype).max / 4  # |stand-in| <= |delta| / max|dO|
        flag += ((dlse != 0) & (delta.abs() > m * limit)).any().to(torch.int32)
    groups = (rg.read_intra,) if rg.nodes == 1 else (rg.read_intra, rg.read_inter)
    for group in groups:  # the ring (a double ring: its inner rings, then across them)
        comm.all_reduce(flag, group=group, op="max")
    if not bool(flag):
        return backend
    warnings.warn("burst_attn: an lse gradient on rows whose output gradient is zero or tiny: "
                  "this backward runs on the torch kernel backend (a full score matrix per "
                  "block)", stacklevel=3)
    return "torch"


def _like(shape, dtype, device) -> torch.Tensor:
    """A template for ``run_ring``'s ``acc_like`` (read for shape, dtype and device only) that
    holds one element: a whole ``torch.empty`` stayed allocated for the entire backward, a
    block-sized buffer no algorithm needs (counted in the profiler's CPU peak). ``zeros_like``
    and ``empty_like`` give contiguous tensors of its shape."""
    return torch.empty((), dtype=dtype, device=device).expand(shape)


def _backward_burst(q, k, v, dout, delta, lse, spec, layout, rg, scale, backend, reach, g, me,
                    acc, travel):
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    steps = BlockSteps(spec, layout, g, scale, backend)

    def step(src, qpay, acc_out):
        qj, doj, dj, lj = qpay  # queries of src, my keys
        steps.backward(doj, qj, k, v, lj, dj, acc_out[0], dk, dv, q_rank=src, k_rank=me)

    dq_like = _like(q.shape, travel, q.device)
    # queries travel backwards (i -> i-1) so that, like K/V in the forward, they meet the keys
    # to their left first; this is what lets a window truncate the ring in both passes
    (dq,) = run_ring(rg, [q, dout, delta, lse.to(acc)], step, acc_like=[dq_like],
                     span=reach[0], back=reach[1], direction=-1)
    return dq, dk, dv


def _backward_ring(q, k, v, dout, delta, lse, spec, layout, rg, scale, backend, reach, g, me,
                   acc, travel, out):
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    steps = BlockSteps(spec, layout, g, scale, backend)

    def step(src, kv, acc_out):
        kb, vb = kv  # my queries, keys of src
        steps.backward(dout, q, kb, vb, lse, delta, dq, *acc_out, q_rank=me, k_rank=src,
                       out_BSHD=out)

    like = [_like(k.shape, travel, k.device), _like(v.shape, travel, v.device)]
    dk, dv = run_ring(rg, [k, v], step, acc_like=like, span=reach[0], back=reach[1])
    return dq, dk, dv


def dims_problems(q, k, v) -> list[str]:
    """Which of (q, k, v) is not a 4-dim tensor; TypeError for one that is no tensor (what
    the registry checks of every method's call, a user's too, before it reads a shape)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return [f"{name} has shape {tuple(t.shape)}; expected 4 dims "
            "(batch, seq_local, heads, head_dim)"
            for name, t in (("q", q), ("k", k), ("v", v)) if t.dim() != 4]


def qkv_problems(q, k, v) -> list[str]:
    """What is wrong with (q, k, v) as (batch, seq_local, heads, head_dim) shards (every method
    checks its tensors with this; ``baselines.checks`` re-exports it)."""
    problems = dims_problems(q, k, v)
    if problems:
        return problems
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        # float8 is a floating dtype too, which the kernels then refused in torch's words
        problems.append(f"q has dtype {q.dtype}; attention needs a floating dtype of 16 bits "
                        "or more: float16, bfloat16, float32 or float64")
    if not (q.dtype == k.dtype == v.dtype):
        problems.append(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}; cast them to one")
    if not (q.device == k.device == v.device):
        problems.append(f"devices differ: q {q.device}, k {k.device}, v {v.device}")
    if k.shape != v.shape:
        problems.append(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        problems.append(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, "
                        "local sequence length and head_dim")
    if q.shape[1] == 0:
        problems.append("local sequence length 0: every rank needs at least one token per "
                        "layout chunk")
    return problems


CHOICES = {"backward": ("backward", BACKWARD_SCHEMES), "backend": ("kernel backend", BACKENDS),
           "grad_acc": ("grad_acc", volume.GRAD_ACC)}
"""burst_attn's options that take one of a few names: (what a message calls it, the names)."""


def choice_problems(**options) -> list[str]:
    """One message (unknown <option> <value>; valid: ...) per ``CHOICES`` option whose value
    is not one of its names."""
    return [f"unknown {CHOICES[k][0]} {v!r}; valid: {', '.join(CHOICES[k][1])}"
            for k, v in options.items() if v not in CHOICES[k][1]]


def _validate(q, k, v, *, layout, group, ranks_per_node, backward, backend, grad_acc="fp32"):
    problems = qkv_problems(q, k, v)
    if any("expected 4 dims" in p for p in problems):
        raise ValueError("burst_attn: " + "; ".join(problems))
    if why := heads_problem(q.shape[2], k.shape[2]):
        problems.append(why)
    try:
        if why := local_length_problem(q.shape[1], layout):
            problems.append(why)
    except ValueError as e:
        problems.append(str(e))
    problems += choice_problems(backward=backward, backend=backend, grad_acc=grad_acc)
    if backend in BACKENDS:  # one that cannot run these tensors fails here, not inside the
        try:  # first ring step (after a transfer is posted: the group stuck for later calls)
            resolve_backend(backend, q)
        except ValueError as e:
            problems.append(str(e))
    why = comm.ranks_per_node_problem(comm.world_size(group), ranks_per_node)
    if why:
        problems.append(why)
    if problems:
        raise ValueError("burst_attn: " + "; ".join(problems))


def flag(who: str, name: str, value) -> bool:
    """``value`` as a bool if it is Python's or numpy's; ValueError otherwise ("no" is truthy)."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise ValueError(f"{who}: {name}={value!r} must be True or False")
    return bool(value)


def choose_backward(q, k, *, world: int, ranks_per_node: int | None,
                    grad_acc: str = "fp32") -> str:
    """The backward scheme that moves fewer bytes (``burst.volume``) for these shapes, with the
    travelling gradient sums in ``grad_acc``'s dtype."""
    shape = dict(world=world, ranks_per_node=ranks_per_node, batch=q.shape[0],
                 seq_local=q.shape[1], heads=q.shape[2], kv_heads=k.shape[2], head_dim=q.shape[3],
                 elem=q.element_size(), acc_elem=torch.empty((), dtype=acc_dtype(q.dtype))
                 .element_size(), grad_elem=q.element_size() if grad_acc == "input" else None)
    return volume.auto_backward(**shape)


def burst_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
               layout: str = "zigzag", group=None, ranks_per_node: int | None = None,
               backward: str = "auto", window: tuple[int, int] | None = None,
               cu_seqlens=None, backend: str = "auto", return_lse: bool = False,
               grad_acc: str = "fp32"):
    """BurstAttention over the context-parallel ``group`` (default: the world).

    Args:
        q: (batch, seq_local, heads, head_dim), this rank's shard in ``layout``.
        k, v: (batch, seq_local, kv_heads, head_dim); heads % kv_heads == 0 (GQA travels
            un-replicated). Every rank of the group passes the same shapes, dtype and
            arguments (causal, softmax_scale, layout, window, cu_seqlens, backward,
            ranks_per_node, grad_acc): a call does not compare them across ranks (that would
            cost a collective per layer; the engine's ``Trainer`` checks its shards and its
            setup once per step). Mismatched shapes of different sizes fail in the transport
            (gloo aborts; NCCL may hang); shapes of one size (heads and tokens swapped), a
            mismatched mask, layout or scale run and return wrong results on every rank; a
            mismatched schedule (backward, ranks_per_node, a window that
            shortens the ring) waits until the process group's timeout.
        causal: mask keys after the query (global positions).
        softmax_scale: default head_dim ** -0.5.
        layout: ``contiguous``, ``zigzag`` or ``striped`` (see ``burst.layout``).
        group: the context-parallel process group. The first call over a group makes its
            ring's process groups (``burst.comm.ring_groups``, cached). Under NCCL with a
            bound device (``init_process_group(device_id=...)``) torch makes a group by
            splitting the world's communicator, which every rank of the world joins: where
            the group is part of the world (CP x DP), every group's ranks make that first
            call alike, as a training step does; a call by one group's ranks alone (an
            evaluation on one DP replica) waits for the others until the timeout.
        ranks_per_node: turn on the topology-aware double ring with this many ranks per node
            (ranks node-major); None: one flat ring. A window (or documents) that a flat ring
            serves in at most M - 1 steps each way (M nodes) runs on that shortened
            flat ring, which is then no slower (``burst.masks.flat_ring_suffices``).
        backward: ``burst`` (Q, dO, D, LSE travel), ``ring`` (K, V, dK, dV travel) or ``auto``
            (fewer bytes, with the gradient sums in ``grad_acc``'s dtype).
        window: (left, right) sliding window in global token positions.
        cu_seqlens: global document boundaries [0, ..., N] for packed sequences.
        backend: kernel backend (``burst.kernel``); ``auto`` picks by device.
        return_lse: also return lse (batch, heads, seq_local), fp32 (float64 for float64
            inputs) and differentiable.
        grad_acc: dtype of the gradient accumulators that travel the ring (dQ for ``burst``,
            dK/dV for ``ring``): ``fp32`` (default; ring-flash-attention) or ``input``
            (TransformerEngine's context parallelism: dK/dV travel in kv's dtype, half the
            bytes in bf16, rounded at every hop).

    Returns:
        out (batch, seq_local, heads, head_dim) in q's dtype [, lse].
    """
    if ranks_per_node is not None and not isinstance(ranks_per_node, bool):
        with contextlib.suppress(TypeError):  # a numpy integer is the same count; _validate
            ranks_per_node = operator.index(ranks_per_node)  # names anything else
    return_lse = flag("burst_attn", "return_lse", return_lse)
    _validate(q, k, v, layout=layout, group=group, ranks_per_node=ranks_per_node,
              backward=backward, backend=backend, grad_acc=grad_acc)
    spec = MaskSpec(causal=causal, window=window,
                    cu_seqlens=cu_seqlens)
    g = comm.world_size(group)
    spec.check_length(q.shape[1] * g)
    scale = resolve_scale(q.shape[-1], softmax_scale)  # every check before the first collective
    rg = comm.ring_groups(group, ranks_per_node)
    if flat_ring_suffices(spec, layout, g, q.shape[1], rg.nodes):  # every rank decides alike
        rg = comm.ring_groups(group, None)
    scheme = backward
    if scheme == "auto":
        scheme = choose_backward(q, k, world=g, ranks_per_node=ranks_per_node if rg.nodes > 1
                                 else None, grad_acc=grad_acc)
    out, lse = _RingAttention.apply(q, k, v, spec, layout, rg, scale, scheme, backend,
                                    grad_acc, return_lse)
    return (out, lse) if return_lse else out


def ring_attention(q, k, v, **kw):
    """The classic ring attention (K/V/dK/dV travel): ``burst_attn`` with backward='ring'."""
    return burst_attn(q, k, v, backward="ring", **kw)
