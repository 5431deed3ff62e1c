"""BurstAttention on gloo ranks against the float64 single-process reference (issue 2).

One spawn per world size runs every case; each case asserts forward out/lse and dq/dk/dv errors
and that the byte counter equals the analytic volume of ``burst.volume``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch

from burst.comm import ring_shape
from burst.layout import LAYOUTS
from burst.masks import MaskSpec, flat_ring_suffices, ring_reach
from burst.spawn import spawn
from burst.volume import ring_attention_bytes
from tests.parity import case, check, run_cases

F32_TOL = 2e-5  # float32 inputs, errors against float64 (the issue asks for well under 1e-4)


def _cases(world: int) -> list[dict]:
    cs = []
    for layout in LAYOUTS:
        for causal in (True, False):
            for backward in ("burst", "ring"):
                cs.append(case(options=dict(layout=layout, backward=backward), causal=causal,
                               heads=4, kv_heads=2 if backward == "ring" else 4, batch=2,
                               seed=len(cs)))
        cs.append(case(options=dict(layout=layout, backward="burst"), causal=True, heads=4,
                       kv_heads=1, seed=len(cs)))  # GQA through the burst backward
        cs.append(case(options=dict(layout=layout, backward="auto"), causal=True,
                       window=(5, 0), seed=len(cs)))  # sliding window
    cs.append(case(options=dict(layout="contiguous", backward="burst"), causal=False,
                   window=(3, 2), seed=len(cs)))
    cs.append(case(options=dict(layout="zigzag", backward="burst"), causal=True,
                   cu_seqlens=(0, 5, 5 * world + 1, 8 * world), seed=len(cs)))  # documents
    for backward in ("burst", "ring"):
        cs.append(case(options=dict(layout="zigzag", backward=backward), causal=True,
                       dtype="bfloat16", naive=True, seq_local=32, head_dim=32, batch=2,
                       seed=len(cs)))
        # bf16 with one K/V head for 16: torch's CPU kernel, given the K/V heads, summed each
        # group's dK/dV in bf16 (dv max error 2.7x, RMS 1.5x the naive one; an audit)
        cs.append(case(options=dict(layout="zigzag", backward=backward), causal=True,
                       dtype="bfloat16", naive=True, seq_local=64, head_dim=128, heads=16,
                       kv_heads=1, seed=len(cs)))
    if world == 4:
        for backward in ("burst", "ring"):
            for layout in ("zigzag", "striped"):
                cs.append(case(options=dict(layout=layout, backward=backward, ranks_per_node=2),
                               ranks_per_node=2, causal=True, kv_heads=2, seed=len(cs)))
        # the 25% claim: MHA, head_dim 128, one dtype throughout
        for backward in ("burst", "ring"):
            cs.append(case(options=dict(layout="zigzag", backward=backward), head_dim=128,
                           heads=2, kv_heads=2, seq_local=4, seed=99))
        cs.append(case(options=dict(layout="zigzag", ranks_per_node=3),
                       expect_error="ranks_per_node"))
        # one rank per node: a flat ring whose every hop is inter-node
        cs.append(case(options=dict(layout="zigzag", backward="burst", ranks_per_node=1),
                       ranks_per_node=1, seed=len(cs)))
        cs.append(case(options=dict(layout="contiguous", backward="burst", ranks_per_node=1),
                       ranks_per_node=1, window=(8, 0), seed=len(cs)))  # truncated, all inter
        for backward in ("burst", "ring"):
            # a window does not shorten a double ring (a flat ring needs 2 steps: more than
            # M - 1 = 1 on 2 nodes of 2)...
            cs.append(case(options=dict(layout="contiguous", backward=backward,
                                        ranks_per_node=2), ranks_per_node=2, window=(16, 0),
                           seed=len(cs)))
            # ...but one that a flat ring serves in 1 hop runs on a flat ring
            # (burst.masks.flat_ring_suffices), its hops counted by the nodes they cross
            cs.append(case(options=dict(layout="contiguous", backward=backward,
                                        ranks_per_node=2), ranks_per_node=2, window=(8, 0),
                           seed=len(cs)))
    if world == 8:
        for rpn in (4, 2):
            for backward in ("burst", "ring"):
                cs.append(case(options=dict(layout="zigzag", backward=backward,
                                            ranks_per_node=rpn), ranks_per_node=rpn,
                               causal=True, seed=len(cs)))
        cs.append(case(options=dict(layout="contiguous", backward="burst"), causal=True,
                       window=(8, 0), seed=len(cs)))  # window truncates the ring
        # windows whose keys lie on both sides, or only right: the ring sends both ways
        # (burst.masks.ring_reach): zigzag's neighbours (1, 1), a right-only window (0, 2)
        for backward, grad_acc in (("burst", "fp32"), ("ring", "fp32"), ("burst", "input")):
            cs.append(case(options=dict(layout="zigzag", backward=backward, grad_acc=grad_acc),
                           causal=True, window=(3, 0), seed=len(cs)))
            # on 2 nodes of 4, a window of 1 step each way: a flat ring instead of the double
            # ring (M - 1 = 1), sent both ways on the zigzag layout; the zigzag's 3 + 3 steps
            # of a window of 9 (chunks of 4 tokens) keep the double ring
            for layout, left in (("contiguous", 8), ("zigzag", 3), ("zigzag", 9)):
                cs.append(case(options=dict(layout=layout, backward=backward,
                                            grad_acc=grad_acc, ranks_per_node=4),
                               ranks_per_node=4, causal=True, window=(left, 0),
                               seed=len(cs)))
            cs.append(case(options=dict(layout="contiguous", backward=backward,
                                        grad_acc=grad_acc), causal=False, window=(0, 10),
                           seed=len(cs)))
    return cs


_RESULTS: dict[int, tuple[list[dict], list[list[dict]]]] = {}


def _results(world: int):
    if world not in _RESULTS:
        cs = _cases(world)
        _RESULTS[world] = (cs, spawn(run_cases, world, args=(cs,), timeout_s=240))
    return _RESULTS[world]


def _expected_bytes(c: dict, world: int, rank: int):
    opts = c["options"]
    elem = torch.empty((), dtype=getattr(torch, c["dtype"])).element_size()
    spec = MaskSpec(causal=c["causal"], window=c["window"], cu_seqlens=c["cu_seqlens"])
    rpn = opts.get("ranks_per_node")
    nodes = ring_shape(world, rpn)[0]
    if flat_ring_suffices(spec, opts["layout"], world, c["seq_local"], nodes):
        rpn, nodes = None, 1
    span, back = ring_reach(spec, opts["layout"], world, c["seq_local"], nodes)
    backward = opts.get("backward", "burst")
    if backward == "auto":
        backward = "burst" if c["kv_heads"] == c["heads"] else "ring"
    return ring_attention_bytes(world=world, batch=c["batch"], seq_local=c["seq_local"],
                                heads=c["heads"], kv_heads=c["kv_heads"],
                                head_dim=c["head_dim"], elem=elem, backward=backward,
                                ranks_per_node=rpn, node_size=c["ranks_per_node"], rank=rank,
                                span=span, back=back,
                                grad_elem=elem if opts.get("grad_acc") == "input" else None)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_parity_and_bytes(world):
    cases, per_rank = _results(world)
    failures = check(cases, per_rank, world, _expected_bytes, F32_TOL)
    assert not failures, "\n".join(failures[:20])


def test_burst_backward_moves_28_percent_fewer_bytes_measured():
    cases, per_rank = _results(4)
    idx = {c["options"]["backward"]: i for i, c in enumerate(cases)
           if c["head_dim"] == 128 and not c["expect_error"]}
    burst = sum(v for (p, _), v in per_rank[0][idx["burst"]]["bytes"].items() if p == "backward")
    ring = sum(v for (p, _), v in per_rank[0][idx["ring"]]["bytes"].items() if p == "backward")
    # G=4, units of one fp32 Q block: ring K, V 3 hops + dK, dV 4 hops = 14; burst Q, dO 3 hops +
    # dQ 4 hops + D, LSE (1/128 of a block each at d_h = 128) 3 hops = 10 + 6/128 -> 28.2 %
    assert burst / ring == pytest.approx((10 + 6 / 128) / 14, rel=1e-12)
    assert round(1 - burst / ring, 3) == 0.282


def test_formula_saving_approaches_25_percent_for_large_rings():
    shape = dict(world=64, batch=1, seq_local=1024, heads=32, kv_heads=32, head_dim=128, elem=4)
    burst = ring_attention_bytes(backward="burst", **shape).sent("backward")
    ring = ring_attention_bytes(backward="ring", **shape).sent("backward")
    assert abs((1 - burst / ring) - 0.25) < 0.01


EMULATED = [dict(backward=b, layout="zigzag", ranks_per_node=None) for b in ("burst", "ring")] + [
    dict(backward="burst", layout="zigzag", ranks_per_node=2),
    dict(backward="burst", layout="contiguous", ranks_per_node=None, window=(200, 0))] + [
    # both ways (burst.masks.ring_reach (1, 1): 64-token zigzag chunks, a window of 48)
    dict(backward=b, layout="zigzag", ranks_per_node=None, window=(48, 0))
    for b in ("burst", "ring")]


def _bf16_against_the_emulation(rank: int, world: int) -> list[dict]:
    from burst import burst_attn
    from burst.emulate import emulate_attn
    from burst.layout import shard

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 128 * world, 4, 64, generator=g).bfloat16() for _ in range(4))

    def grads(fn, xs, dout):
        xs = [x.clone().requires_grad_() for x in xs]
        out = fn(*xs)
        out.backward(dout)
        return [out.detach(), *(x.grad for x in xs)]

    res = []
    for c in EMULATED:
        kw = dict(causal=True, **c)
        emu = grads(lambda a, b, c_, kw=kw: emulate_attn(a, b, c_, world=world, **kw),
                    (q, k, v), do)
        loc = [shard(t, layout=c["layout"]) for t in (q, k, v, do)]
        got = grads(lambda a, b, c_, kw=kw: burst_attn(a, b, c_, **kw), loc[:3], loc[3])
        res.append({name: int((x != shard(e, layout=c["layout"])).sum())
                    for name, x, e in zip(("out", "dq", "dk", "dv"), got, emu, strict=True)})
    return res


def test_bf16_ring_equals_its_emulation_bit_for_bit():
    """The one-process emulation (burst.emulate) runs the same kernels, merges and schedule as
    the ranks, so in bf16 it gives the same bits: the check that catches an accumulator that
    does not travel (dK/dV of the burst backward, dQ of the ring one) kept in bf16, which moves
    the error by ~10-30%, inside the naive-error rule (a mutation audit)."""
    for rank, per_case in enumerate(spawn(_bf16_against_the_emulation, 4, timeout_s=240)):
        for c, differ in zip(EMULATED, per_case, strict=True):
            assert not any(differ.values()), (rank, c, differ)


def _lse_grads(rank: int, world: int, layout: str, ranks_per_node=None):
    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 8 * world, 4, 8, generator=g, dtype=torch.float64)
               for _ in range(3))
    w_out = torch.randn(2, 8 * world, 4, 8, generator=g, dtype=torch.float64)
    w_lse = torch.randn(2, 4, 8 * world, generator=g, dtype=torch.float64)
    w_out[:, 1::3] = 0  # rows whose output is unused but whose lse is: dO = 0, dlse != 0
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*full, causal=True)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    errs = {}
    for backward in ("burst", "ring"):
        mine = [shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
        o, l_ = burst_attn(*mine, causal=True, layout=layout, backward=backward,
                           return_lse=True, ranks_per_node=ranks_per_node)
        ((o * shard(w_out, layout=layout)).sum()
         + (l_ * shard(w_lse, layout=layout, dim=2)).sum()).backward()
        errs[backward] = max(float((m.grad - shard(f.grad, layout=layout)).abs().max())
                             for m, f in zip(mine, full, strict=True))
    return errs


def _lse_on_some_ranks(rank: int, world: int):
    """lse in the loss of rank 0 only (dlse is None on the others), and an fp16 loss whose
    output weights are tiny on some rows (the stand-in out would overflow fp16)."""
    import warnings

    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(4)
    n = 8 * world
    q, k, v = (torch.randn(1, n, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    w_lse = torch.randn(1, 2, n, generator=g, dtype=torch.float64)
    mask = shard(torch.arange(n), layout="zigzag", dim=0, world=world, rank=0)
    w_lse_0 = torch.zeros_like(w_lse)
    w_lse_0[:, :, mask] = w_lse[:, :, mask]  # the lse weights of rank 0's rows only
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*full, causal=True)
    (out.sum() + (lse * w_lse_0).sum()).backward()
    errs = {}
    for backward in ("burst", "ring"):
        mine = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        o, l_ = burst_attn(*mine, causal=True, backward=backward, return_lse=True)
        loss = o.sum() + ((l_ * shard(w_lse, layout="zigzag", dim=2)).sum() if rank == 0 else 0)
        loss.backward()  # hung: rank 0 in the flag all-reduce, the others in the ring
        errs[backward] = max(float((m.grad - shard(f.grad, layout="zigzag")).abs().max())
                             for m, f in zip(mine, full, strict=True))
    # rows with dO = 0 and dlse != 0 on rank 0 only: its queries travel to the other ranks,
    # which must compute their part with the same (fallback) kernel
    w_zero = torch.ones(1, n, 2, 16, dtype=torch.float64)
    w_zero[:, mask[1::3]] = 0
    for f in full:
        f.grad = None
    out, lse = reference_attention(*full, causal=True)
    ((out * w_zero).sum() + (lse * w_lse).sum()).backward()
    mine = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
    o, l_ = burst_attn(*mine, causal=True, backward="burst", return_lse=True)
    ((o * shard(w_zero, layout="zigzag")).sum()
     + (l_ * shard(w_lse, layout="zigzag", dim=2)).sum()).backward()
    errs["dO = 0 on rank 0 only"] = max(float((m.grad - shard(f.grad, layout="zigzag"))
                                              .abs().max()) for m, f in zip(mine, full,
                                                                            strict=True))
    w_out = torch.randn(1, n, 2, 16, generator=g, dtype=torch.float64)
    w_out[:, 1::3] *= 1e-6
    for f in full:
        f.grad = None
    out, lse = reference_attention(*full, causal=True)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    mine = [shard(t, layout="zigzag").half().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o, l_ = burst_attn(*mine, causal=True, return_lse=True)
        ((o.double() * shard(w_out, layout="zigzag")).sum()
         + (l_.double() * shard(w_lse, layout="zigzag", dim=2)).sum()).backward()
    errs["fp16 tiny dO"] = max(float((m.grad.double() - shard(f.grad, layout="zigzag"))
                                     .abs().max()) for m, f in zip(mine, full, strict=True))
    errs["warned"] = any("torch kernel backend" in str(w.message) for w in caught)
    return errs


def _lse_flat_ring(rank: int, world: int):
    return _lse_grads(rank, world, "zigzag"), _lse_on_some_ranks(rank, world)


def test_lse_is_differentiable():
    """A loss of out and lse (return_lse=True) gets exact gradients under both backward
    schemes, flat and double ring: D - dlse travels in place of D (lse was non-differentiable,
    so its part of the gradient was silently dropped). Rows whose output is unused (dO = 0)
    still get their lse's gradient on the default (cpu_flash) kernel, whose stand-in ``out``
    cannot carry it there (it was lost). Every rank of a call with return_lse joins the backend
    choice, so a loss that uses lse on some ranks only does not hang; fp16 rows with a tiny
    output gradient do not overflow (both fall back, with a warning, to the torch backend)."""
    for errs, partial in spawn(_lse_flat_ring, 2, timeout_s=120):
        assert max(errs.values()) < 1e-10, errs
        assert partial["burst"] < 1e-10 and partial["ring"] < 1e-10, partial
        assert partial["dO = 0 on rank 0 only"] < 1e-10, partial
        assert partial["fp16 tiny dO"] < 1e-2 and partial["warned"], partial
    for errs in spawn(_lse_grads, 4, args=("zigzag", 2), timeout_s=120):  # double ring 2 x 2
        assert max(errs.values()) < 1e-10, errs


def _lse_zero_dout_on_one_node(rank: int, world: int, ranks_per_node: int):
    """dO = 0 on some rows of rank 0 alone, an lse gradient on every row, on a double ring:
    rank 0's queries travel to the other node, whose ranks must take the fallback kernel too
    (the flag is agreed across the nodes, not only inside each)."""
    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(6)
    n = 8 * world
    q, k, v = (torch.randn(1, n, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    w_lse = torch.randn(1, 2, n, generator=g, dtype=torch.float64)
    rows_0 = shard(torch.arange(n), layout="zigzag", dim=0, world=world, rank=0)
    w_out = torch.ones(1, n, 2, 16, dtype=torch.float64)
    w_out[:, rows_0[1::3]] = 0
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*full, causal=True)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    errs = {}
    for backward in ("burst", "ring"):
        mine = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        o, l_ = burst_attn(*mine, causal=True, backward=backward, return_lse=True,
                           ranks_per_node=ranks_per_node)
        ((o * shard(w_out, layout="zigzag")).sum()
         + (l_ * shard(w_lse, layout="zigzag", dim=2)).sum()).backward()
        errs[backward] = max(float((m.grad - shard(f.grad, layout="zigzag")).abs().max())
                             for m, f in zip(mine, full, strict=True))
    return errs


def test_lse_gradient_with_zero_dout_on_one_node_of_a_double_ring():
    """The backend flag of ``_backend_for_dlse`` must reach every rank of a double ring (its
    inner rings, then across them): agreed inside each node alone, the node without dO = 0
    rows kept the cpu_flash kernel for rank 0's travelling queries and dropped their lse
    gradient (a mutation audit; the double-ring lse test has dO = 0 rows on every rank)."""
    for errs in spawn(_lse_zero_dout_on_one_node, 4, args=(2,), timeout_s=120):
        assert max(errs.values()) < 1e-10, errs


def _lse_alone(rank: int, world: int) -> dict:
    """A loss of lse alone: autograd hands backward no output gradient (None, not zeros)."""
    import warnings

    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(7)
    n = 8 * world
    q, k, v = (torch.randn(1, n, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    w_lse = torch.randn(1, 2, n, generator=g, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = reference_attention(*full, causal=True)
    (lse * w_lse).sum().backward()
    errs = {}
    for backward in ("burst", "ring"):
        mine = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the torch kernel backend: dO is zero)
            _, l_ = burst_attn(*mine, causal=True, backward=backward, return_lse=True)
            (l_ * shard(w_lse, layout="zigzag", dim=2)).sum().backward()
        # lse does not depend on v: the oracle's v.grad is None, ours zeros
        errs[backward] = max(float((m.grad - (0 if f.grad is None else
                                              shard(f.grad, layout="zigzag"))).abs().max())
                             for m, f in zip(mine, full, strict=True))
    return errs


def test_a_loss_of_lse_alone_gets_its_gradient():
    """Every distributed lse test also puts the output in its loss, so the backward's
    ``dout is None`` branch (set_materialize_grads(False): a loss of lse alone) never ran."""
    for errs in spawn(_lse_alone, 2, timeout_s=120):
        assert max(errs.values()) < 1e-10, errs


def _shortened_ring_in_a_sub_group(rank: int, world: int) -> float:
    """Two context-parallel groups of 4 ranks (each its own sequence), 2 ranks per node: a
    window that a flat ring serves in M - 1 = 1 step runs on the shortened flat ring
    (``flat_ring_suffices``), which must be the caller's group's, not the world's."""
    import torch.distributed as dist

    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    groups = [dist.new_group([0, 1, 2, 3]), dist.new_group([4, 5, 6, 7])]  # every rank: both
    group, sub = groups[rank // 4], rank % 4
    g = torch.Generator().manual_seed(9 + rank // 4)  # another sequence in each group
    q, k, v, do = (torch.randn(1, 32, 2, 8, generator=g, dtype=torch.float64)
                   for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = reference_attention(*leaves, causal=True, window=(8, 0))
    out.backward(do)
    errs = []
    for backward in ("burst", "ring"):
        mine = [shard(t, layout="contiguous", world=4, rank=sub).requires_grad_()
                for t in (q, k, v)]
        got = burst_attn(*mine, causal=True, window=(8, 0), layout="contiguous", group=group,
                         ranks_per_node=2, backward=backward)
        got.backward(shard(do, layout="contiguous", world=4, rank=sub))
        errs += [float((a.detach() - shard(w, layout="contiguous", world=4, rank=sub))
                       .abs().max()) for a, w in zip((got, *(t.grad for t in mine)),
                                                      (out, *(t.grad for t in leaves)),
                                                      strict=True)]
    return max(errs)


def test_a_shortened_flat_ring_stays_in_the_callers_group():
    """A double ring over a context-parallel group that is not the world (CP x DP) whose
    window runs on the shortened flat ring: out and dq/dk/dv of each group's own sequence."""
    assert max(spawn(_shortened_ring_in_a_sub_group, 8, timeout_s=60)) < 1e-12


def _edges(rank: int, world: int, store: str):
    import sys

    from burst import burst_attn
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4 * world, 2, 8, generator=g, dtype=torch.float64)
               for _ in range(3))
    ref, _ = reference_attention(q, k, v, causal=False)
    mine = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
    groups = _groups(rank, world, mine, shard(ref, layout="zigzag"), store)  # before any ring
    # an unbounded side is unbounded (p + right overflowed int64 and hid every key)
    out = burst_attn(*mine, causal=False, layout="zigzag", window=(sys.maxsize, sys.maxsize))
    err = float((out - shard(ref, layout="zigzag")).abs().max().detach())
    after, _ = reference_attention(q, k, v, causal=False, window=(0, 10**6))
    out = burst_attn(*mine, causal=False, layout="zigzag", window=(0, sys.maxsize))
    err = max(err, float((out - shard(after, layout="zigzag")).abs().max().detach()))
    # a node bigger than the group is one flat ring
    flat = burst_attn(*mine, causal=False, layout="zigzag", ranks_per_node=8 * world)
    err = max(err, float((flat - shard(ref, layout="zigzag")).abs().max()))
    refused = []
    try:  # a second derivative is refused, not silently wrong
        torch.autograd.grad(flat.square().sum(), mine[0], create_graph=True)
    except RuntimeError as e:
        refused.append(str(e))
    # a loss linear in out hands backward a constant gradient: once_differentiable let the
    # second-order term of a gradient penalty drop silently (q.grad off by 1.4)
    w = torch.randn_like(flat)
    for backward in ("burst", "ring"):
        out = burst_attn(*mine, causal=True, layout="zigzag", backward=backward)
        try:
            torch.autograd.grad((out * w).sum(), mine[0], create_graph=True)
        except RuntimeError as e:
            refused.append(str(e))
    return err, refused, groups


def _groups(rank: int, world: int, mine, want, store: str) -> dict:
    """Groups made, destroyed and made again over the same ranks, a rank outside one, and the
    default group destroyed and initialised again (torch.distributed's own calls)."""
    import torch.distributed as dist

    from burst import burst_attn

    def err(group):
        for t in mine:
            t.grad = None
        out = burst_attn(*mine, causal=False, layout="zigzag", group=group)
        out.sum().backward()  # the accumulators' groups are used in backward
        return float((out - want).abs().max())

    got = {}
    g1 = dist.new_group(list(range(world)))
    got["first group"] = err(g1)
    dist.destroy_process_group(g1)
    g2 = dist.new_group(list(range(world)))  # the cached ring kept g1: "not registered"
    got["same ranks, new group"] = err(g2)
    alone = dist.new_group([0])  # rank 1 gets torch's non-member placeholder
    if rank == 1:
        try:
            burst_attn(*mine, causal=False, layout="zigzag", group=alone)
            got["non-member"] = "ran"
        except ValueError as e:  # was "tuple.index(x): x not in tuple"
            got["non-member"] = str(e)
    dist.destroy_process_group()  # the cached ring-accumulator group dies with it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    got["default group again"] = err(None)  # backward used the dead group: "not registered"
    return got


def test_unbounded_windows_big_nodes_and_double_backward(tmp_path):
    ranks = spawn(_edges, 2, args=(str(tmp_path / "store"),), timeout_s=120)
    for err, refused, groups in ranks:
        assert err < 1e-12 and len(refused) == 3, refused
        assert all("no second derivative" in r for r in refused), refused
        assert max(groups[k] for k in ("first group", "same ranks, new group",
                                       "default group again")) < 1e-12, groups
    assert "rank 1 is not a member of the process group" in ranks[1][2]["non-member"]


def _a_refused_backend_then_a_good_call(rank, world):
    from burst import burst_attn

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 4) for _ in range(3))
    try:
        burst_attn(q, k, v, causal=True, backend="cuda_sdpa")  # CPU tensors
        refused = ""
    except ValueError as e:
        refused = str(e)
    return refused, burst_attn(q, k, v, causal=True).shape


def test_a_refused_call_leaves_the_group_usable():
    """A backend that cannot run the tensors was found inside the first ring step, after its
    first transfer was posted: every later call on the group waited for the process group's
    timeout (found by an API audit). It is refused before any collective now."""
    for refused, shape in spawn(_a_refused_backend_then_a_good_call, 2, timeout_s=15):
        assert "needs CUDA tensors" in refused and shape == (1, 8, 2, 4)


def test_registry_accepts_a_node_bigger_than_the_group():
    from baselines import registry

    for name in ("burst", "double_ring"):
        registry.get(name).check(world=4, heads=4, kv_heads=4, seq_local=8, causal=True,
                                 ranks_per_node=8)



def test_posted_transfers_hold_their_buffers_until_wait(monkeypatch):
    """A backend's work handle need not keep the tensors alive (gloo's does; what NCCL's does
    depends on TORCH_NCCL_AVOID_RECORD_STREAMS): ``comm.exchange`` holds them until wait()."""
    import gc
    import weakref

    import torch.distributed as dist

    from burst import comm

    class Work:  # a handle that keeps nothing
        def wait(self):
            return True

    class Op:
        def __init__(self, op, tensor, peer, group):
            self.tensor = tensor

    monkeypatch.setattr(dist, "P2POp", Op)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [Work() for _ in ops])
    send, recv = torch.ones(4), torch.empty(4)
    alive = weakref.ref(send)
    pending = comm.exchange([(send, 1)], [(recv, 1)], None)
    del send  # the caller drops its block, as a ring step rebinds it to the received one
    gc.collect()
    assert alive() is not None
    pending.wait()
    gc.collect()
    assert alive() is None


def test_blocks_and_accumulators_travel_on_their_own_groups(monkeypatch):
    """The ring's accumulators go on their own communicators, so NCCL runs them beside the next
    block's transfer instead of queueing behind it (a mutation that sent them on the read
    group changed no value or byte count on gloo, which matches messages in posting order)."""
    from burst import ring
    from burst.comm import RingGroups

    posted = []

    class Done:
        def wait(self):
            return True

    def record(group, sends, recvs):
        posted.append((group, {tuple(t.shape) for t, _ in sends + recvs}))
        return Done()

    monkeypatch.setattr(ring, "_post_pairs", record)
    payload, acc = [torch.zeros(2)], [torch.zeros(3)]  # told apart by shape
    for nodes, local, span, back in ((1, 4, None, 0), (1, 4, 1, 1), (2, 2, None, 0)):
        posted.clear()
        rg = RingGroups(tuple(range(4)), nodes, local, 1, "read_intra", "acc_intra",
                        "read_inter", "acc_inter")
        ring.run_ring(rg, payload, lambda src, blk, a: None, acc_like=acc, span=span, back=back)
        groups = {(g, shape) for g, shapes in posted for shape in shapes}
        want = {("read_intra", (2,)), ("acc_intra", (3,))}
        if nodes > 1:
            want |= {("read_inter", (2,)), ("acc_inter", (3,))}
        assert groups == want, (nodes, span, back, groups)


def test_the_backward_allocates_no_block_only_to_name_its_accumulators_shape(monkeypatch):
    """``run_ring`` reads ``acc_like`` for a shape, dtype and device. Both backwards passed it
    whole ``torch.empty`` blocks (dQ; dK and dV), held to the end of the backward: 4 MiB of a
    ring method's 33 MiB CPU peak at 4 ranks and 4096 tokens, none of it the algorithm's
    (a profiling audit)."""
    from burst import attention, burst_attn

    held = []
    real = attention.run_ring

    def spy(rg, payload, step, acc_like=None, **kw):
        if acc_like is not None:
            held.append([t.untyped_storage().nbytes() for t in acc_like])
        return real(rg, payload, step, acc_like=acc_like, **kw)

    monkeypatch.setattr(attention, "run_ring", spy)
    q = torch.randn(1, 64, 2, 16, dtype=torch.float64, requires_grad=True)
    for backward in ("burst", "ring"):
        burst_attn(q, q, q, causal=True, backward=backward).sum().backward()
    assert held == [[8], [8, 8]]


def test_striped_blocks_without_their_diagonal_run_as_causal_calls(monkeypatch):
    """A striped ring's later key blocks see keys strictly before each query: the kernel made
    whole zero outputs and gradients for such a block and copied its result in, at every step
    (6 MiB of striped's 41 MiB CPU peak at 4 ranks and 4096 tokens, a profiling audit). The
    planner gives them as the causal call they are on queries 1.. against keys ..-1; a block
    of one token sees nothing and makes no call. Out and gradients as float64 attention."""
    from burst import attention
    from burst.emulate import emulate_attn
    from burst.reference import reference_attention

    kinds = []
    fwd, bwd = attention.block_forward, attention.block_backward

    def forward(q, k, v, **kw):
        kinds.append((kw["kind"], q.shape[1], k.shape[1]))
        return fwd(q, k, v, **kw)

    def backward(*a, **kw):
        kinds.append((kw["kind"], a[1].shape[1], a[2].shape[1]))
        return bwd(*a, **kw)

    monkeypatch.setattr(attention, "block_forward", forward)
    monkeypatch.setattr(attention, "block_backward", backward)
    g = torch.Generator().manual_seed(0)
    for n, calls in ((32, {("causal", 8, 8), ("causal", 7, 7)}), (4, {("causal", 1, 1)})):
        q, k, v, do = (torch.randn(1, n, 2, 8, dtype=torch.float64, generator=g)
                       for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        want = reference_attention(*ref, causal=True)[0]
        torch.autograd.backward(want, do)
        for scheme in ("burst", "ring"):
            kinds.clear()
            got = emulate_attn(*leaves, world=4, causal=True, layout="striped", backward=scheme)
            torch.autograd.backward(got, do)
            assert set(kinds) == calls, (n, scheme, set(kinds))
            assert (got - want).abs().max() < 1e-12
            for a, b in zip(leaves, ref, strict=True):
                assert (a.grad - b.grad).abs().max() < 1e-12, (n, scheme)
                a.grad = None


def _waits_on_a_dead_peer(rank: int, world: int):
    import time

    from burst import comm

    acc = comm.ring_groups(None).acc_intra  # a sub-group: the ring's accumulators travel here
    if rank == 1:
        time.sleep(60)  # never joins (a rank that hangs or died)
    comm.barrier(acc)


def test_sub_groups_time_out_as_the_process_group_does():
    """comm.init's timeout covers the groups made from it: the ring's accumulator group (and
    every double-ring, USP and engine group) took torch's default, 30 minutes, so a peer that
    died left the others waiting that long whatever init said."""
    from burst.spawn import SpawnError

    # rank 0's own timeout error, not spawn's deadline ("did not finish within 8 s", +30 s):
    # without the sub-group's timeout rank 0 waits 30 minutes in the barrier
    with pytest.raises(SpawnError, match="rank 0 raised") as e:
        spawn(_waits_on_a_dead_peer, 2, timeout_s=8)  # the ranks' init timeout, then +30 s
    assert "did not finish within" not in str(e.value)
    assert "imed out" in str(e.value) or "timeout" in str(e.value).lower()


def _aborts_on_rank1(rank: int, world: int):
    import os
    import time

    if rank == 1:  # what gloo does on a collective mismatch: a message on stderr, then abort
        os.write(2, b"Received data size doesn't match expected size (a test's abort)\n")
        os.abort()
    # rank 0 stays while rank 1 aborts: on a loaded machine rank 0 returned and exited while
    # rank 1 was still finishing gloo's connection handshake, whose init then failed on rank 1
    # ("Connection closed by peer", a raise, not the abort under test; CI, 2026-12-04)
    time.sleep(3.0)
    return rank


def test_a_rank_that_aborts_is_quoted_in_the_error():
    """A rank killed by an abort left only "killed by SIGABRT" in SpawnError (and so in a
    harness row); the reason gloo printed was on the console only."""
    from burst.spawn import SpawnError

    with pytest.raises(SpawnError, match="killed by SIGABRT") as e:
        spawn(_aborts_on_rank1, 2, timeout_s=60)
    assert "Received data size doesn't match expected size (a test's abort)" in str(e.value)


def _rank1_raises_then_rank0_waits_in_vain(rank: int, world: int):
    from burst import comm

    if rank == 1:
        raise ValueError("the cause (rank 1)")
    comm.barrier()  # gloo: the peer left ("Connection closed by peer"), the aftermath


def _rank1_exits_while_rank0_waits(rank: int, world: int, code: int = 3):
    import os

    from burst import comm

    if rank == 1:
        os._exit(code)
    comm.barrier()  # gloo: a read error as soon as rank 1 is gone, before it is seen dead


def _rank1_raises_then_rank0_aborts(rank: int, world: int):
    import os
    import time

    if rank == 1:
        raise ValueError("the cause (rank 1)")
    time.sleep(1.0)  # as gloo aborts a rank whose peer left
    os.abort()


def _rank1_exits_while_rank0_sleeps(rank: int, world: int):
    import os
    import time

    if rank == 1:
        time.sleep(0.5)
        os._exit(3)
    time.sleep(20)  # no collective: ended by torch's join (SIGTERM) when rank 1 dies


def test_spawn_reports_the_cause_first():
    """Found by a failure-injection audit: SpawnError listed ranks in rank order, so the
    harness's progress line (its last line) showed the aftermath on the last rank (gloo's
    "Connection closed by peer") and not the rank whose error stopped the cell; the first
    rank to raise (or die) now comes first, and the progress line quotes it."""
    from burst.spawn import SpawnError
    from suites.run import short_reason

    with pytest.raises(SpawnError) as e:
        spawn(_rank1_raises_then_rank0_waits_in_vain, 2, timeout_s=60)
    text = str(e.value)
    assert text.startswith("rank 1 raised:") and "rank 0 raised:" in text, text
    assert short_reason(text) == "ValueError: the cause (rank 1)"
    with pytest.raises(SpawnError) as e:  # a rank that died comes first too
        spawn(_aborts_on_rank1, 2, timeout_s=60)
    assert str(e.value).startswith("rank 1 exited without a result"), str(e.value)
    # a rank that exits while its peer waits on it: its death was timed when the launcher saw
    # it, up to a poll after the read error it caused, which then came first (a review's case)
    # exit code 0 without a result as well, which torch's join takes for success (an audit:
    # it came last, after the closed connection it caused)
    for code in (3, 3, 3, 0, 0):
        with pytest.raises(SpawnError) as e:
            spawn(_rank1_exits_while_rank0_waits, 2, timeout_s=60, args=(code,))
        text = str(e.value)
        assert text.startswith(f"rank 1 exited without a result: exit code {code}"), text
    # a rank that died after another raised (a review's case): the one that raised first
    with pytest.raises(SpawnError) as e:
        spawn(_rank1_raises_then_rank0_aborts, 2, timeout_s=60)
    text = str(e.value)
    assert text.startswith("rank 1 raised:") and "rank 0 exited without a result" in text, text
    assert short_reason(text) == "ValueError: the cause (rank 1)"
    # a rank torch's join terminated because another died was not killed from outside
    with pytest.raises(SpawnError) as e:
        spawn(_rank1_exits_while_rank0_sleeps, 2, timeout_s=60)
    text = str(e.value)
    assert text.startswith("rank 1 exited without a result: exit code 3"), text
    assert "rank 0 exited without a result: stopped by spawn after rank 1 died" in text, text
    assert "SIGTERM" not in text, text


def _rank1_returns_a_lambda(rank: int, world: int):
    return (lambda: rank) if rank == 1 else rank


def test_a_result_that_cannot_be_pickled_is_a_spawn_error():
    """It was torch's ProcessRaisedException from the rank's last line (the pickling of its
    result), with a half-written result file left behind."""
    from burst.spawn import SpawnError

    with pytest.raises(SpawnError) as e:
        spawn(_rank1_returns_a_lambda, 2, timeout_s=60)
    assert str(e.value).startswith("rank 1 raised:\nthe function's result on rank 1 cannot be "
                                   "pickled to return it ("), str(e.value)
    assert "<lambda>" in str(e.value), str(e.value)  # (Python's own words differ by version)
    assert "rank 0" not in str(e.value), str(e.value)


def _tracked_objects(rank: int, world: int):
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())


def test_a_rank_starts_with_what_it_imported_out_of_the_collectors_sight():
    """A rank freezes what it holds at its start (torch and this project: ~170K objects), so
    comm.destroy's gc.collect scans only what the function made: it scanned everything, 74 ms
    a rank, and a spawn from the fork server took twice as long (scripts/bench_spawn.py)."""
    for frozen, tracked in spawn(_tracked_objects, 2, timeout_s=60):
        assert frozen > 50_000 and tracked < frozen / 5, (frozen, tracked)


def test_nccl_spawn_needs_a_gpu_per_rank():
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected") at the first collective;
    spawn put rank r on GPU r % count."""
    import torch

    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"needs one GPU per rank: world={gpus + 1}"):
        spawn(_aborts_on_rank1, gpus + 1, backend="nccl")


def test_a_phase_label_ends_with_its_block():
    """Bytes are filed under the phase of the innermost ``comm.phase`` block; a label that
    outlived its block (at its end or on an exception) would file later traffic, issued
    outside any block, under it (no current caller would show it: each opens its own).
    Traffic outside any block is filed under ``unlabelled_phase``'s, forward by default."""
    from burst import comm

    assert comm.current_phase() == "forward"
    with comm.phase("backward"):
        with comm.phase("loss"):
            assert comm.current_phase() == "loss"
        assert comm.current_phase() == "backward"
    with pytest.raises(RuntimeError), comm.phase("backward"):
        raise RuntimeError("a failed step")
    assert comm.current_phase() == "forward"
    with pytest.raises(RuntimeError), comm.unlabelled_phase("backward"):
        assert comm.current_phase() == "backward"
        with comm.phase("forward"):  # a label wins
            assert comm.current_phase() == "forward"
        raise RuntimeError("a failed backward")
    assert comm.current_phase() == "forward"


def test_auto_backward_takes_burst_on_a_tie():
    """burst_attn's "auto" picks the backward that sends fewer bytes, burst on a tie (one rank:
    nothing is sent either way)."""
    from burst.volume import auto_backward

    shape = dict(batch=1, seq_local=16, heads=8, kv_heads=8, head_dim=64, elem=2, acc_elem=4)
    assert auto_backward(world=1, **shape) == "burst"
    assert auto_backward(world=4, **shape) == "burst"
    assert auto_backward(world=4, **dict(shape, kv_heads=1)) == "ring"  # GQA: K/V are small


def test_auto_backward_counts_the_gradient_sums_in_grad_acc_dtype():
    """With grad_acc="input" the travelling dQ (burst) or dK/dV (ring) are in the input dtype;
    "auto" priced them in fp32 whatever grad_acc said, and picked burst where ring sends fewer
    bytes (head_dim 1, bf16: 512 against 384 backward bytes; a fuzzing audit). burst_attn,
    the byte formulas and the simulator make the same choice."""
    from burst.attention import choose_backward
    from burst.volume import method_bytes, ring_attention_bytes
    from suites.schedule import AttnShape, Topo, plan_for

    shape = dict(world=2, batch=1, seq_local=16, heads=2, kv_heads=2, head_dim=1, elem=2)
    q = torch.zeros(1, 16, 2, 1, dtype=torch.bfloat16)
    sent = {(b, g): ring_attention_bytes(**shape, backward=b, grad_elem=g).sent("backward")
            for b in ("burst", "ring") for g in (None, 2)}
    assert sent[("ring", 2)] < sent[("burst", 2)] and sent[("burst", None)] <= sent[("ring", None)]
    attn = AttnShape(batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=1)
    for grad_acc, best in (("fp32", "burst"), ("input", "ring")):
        assert choose_backward(q, q, world=2, ranks_per_node=None, grad_acc=grad_acc) == best
        auto = method_bytes("burst", **shape, grad_acc=grad_acc)
        assert auto.sent("backward") == method_bytes("burst", **shape, grad_acc=grad_acc,
                                                     backward=best).sent("backward")
        opts = {"grad_acc": grad_acc, "backward": "auto"}  # the registry entry says "burst"
        assert plan_for("burst", opts, Topo(2, 2), attn).backward == best
    # on a double ring that a window sends to a flat ring, 'auto' chooses for the flat ring
    # (the byte formulas chose for the double ring: a review found head_dim 1 to 3 flip)
    shape = dict(world=4, batch=1, seq_local=8, heads=2, kv_heads=2, head_dim=1, elem=8,
                 acc_elem=8)
    flat = dict(layout="contiguous", causal=True, window=(8, 0))
    x = torch.zeros(1, 8, 2, 1, dtype=torch.float64)
    best = choose_backward(x, x, world=4, ranks_per_node=None)
    assert best != choose_backward(x, x, world=4, ranks_per_node=2)  # the case that flips
    attn = AttnShape(batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=1, dtype="float64",
                     window=(8, 0))
    assert plan_for("burst", dict(flat, ranks_per_node=2, backward="auto"), Topo(4, 2),
                    attn).backward == best
    auto = method_bytes("burst", **shape, **flat, ranks_per_node=2, backward="auto",
                        node_size=2)
    assert auto.by == method_bytes("burst", **shape, **flat, ranks_per_node=2, backward=best,
                                   node_size=2).by


def _ring_groups_used(rank: int, world: int):
    import torch.distributed as dist

    from burst import burst_attn

    used = []
    real = dist.batch_isend_irecv

    def spy(ops):
        used.extend(op.group for op in ops)
        return real(ops)

    dist.batch_isend_irecv = spy
    try:
        torch.manual_seed(rank)
        q, k, v = (torch.randn(1, 16, 2, 8, requires_grad=True) for _ in range(3))
        burst_attn(q, k, v, causal=True, layout="zigzag").sum().backward()
    finally:
        dist.batch_isend_irecv = real
    return len(used), sum(g is None or g is dist.group.WORLD for g in used)


def test_a_flat_ring_sends_nothing_through_the_callers_group():
    """The ring's reads and accumulators travel on groups of their own: under NCCL a
    communicator runs its operations in order, so reads on the caller's group (the world under
    fsdp_world, which FSDP's gathers and reduce-scatters share) would wait behind them. The
    flat ring read through the caller's group (a GPU review found it)."""
    for posted, on_caller in spawn(_ring_groups_used, 2):
        assert posted > 0 and on_caller == 0


def _groups_made(rank: int, world: int) -> list[int]:
    """Process groups this rank creates in each of three double-ring calls (nodes of 2):
    plain, with a window a flat ring serves in 1 hop, with one it does not."""
    from burst import burst_attn, comm

    made, real = [0], comm._new_group

    def counting(*a, **k):
        made[0] += 1
        return real(*a, **k)

    comm._new_group = counting
    per_call = []
    try:
        for window in (None, (8, 0), (16, 0)):
            made[0] = 0
            q, k, v = (torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(3))
            burst_attn(q, k, v, causal=True, layout="contiguous", ranks_per_node=2,
                       window=window).sum().backward()
            per_call.append(made[0])
    finally:
        comm._new_group = real
    return per_call


def test_the_groups_a_ring_makes_do_not_depend_on_its_mask():
    """Under NCCL every rank of the world joins each group's creation; data-parallel replicas
    may hold different documents, so the groups a rank makes must not depend on its mask. A
    double ring's first call makes the flat ring's groups too (which a window a flat ring
    serves in few hops runs on); they were made at the first such window (a review found it:
    6 groups on one replica, 4 on another, a hang under NCCL)."""
    for per_call in spawn(_groups_made, 4):
        assert per_call[0] > 0 and per_call[1:] == [0, 0], per_call


def _stays(rank: int, world: int, folder: str, launcher_err: str):
    """Rank 0 says a line on stderr and waits (10 s at most) to see the launcher echo it; then
    every rank writes its pid and lives on (60 s at most) unless killed."""
    import os
    import sys
    import time

    seen = False
    if rank == 0:
        print("a warning of rank 0", file=sys.stderr, flush=True)
        end = time.monotonic() + 10
        while not seen and time.monotonic() < end:
            time.sleep(0.1)
            with open(launcher_err) as f:
                seen = "a warning of rank 0" in f.read()
    with open(os.path.join(folder, f"rank{rank}.pid"), "w") as f:
        f.write(f"{os.getpid()} {seen}")
    time.sleep(60)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has died (reaped or not)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("holder", [False, True])
def test_ranks_die_with_their_launcher_and_their_stderr_is_echoed_as_it_comes(tmp_path, holder):
    """A launcher killed (SIGKILL) left its ranks running: torch asks for SIGINT at its death,
    which a rank started with SIGINT ignored (``cmd &`` in a script) ignores, so a training run
    went on writing its folder while the same command, run again, resumed it (a resume
    audit). And a rank's warning reached the console only when the ranks ended.
    ``holder``: another process from the same fork server lives on (it keeps the server, the
    ranks' parent, alive), which left the ranks running (a review)."""
    import signal
    import subprocess
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    err = tmp_path / "launcher.err"
    script = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "import multiprocessing, time\n"
              "from burst.spawn import spawn\n"
              "from tests.test_burst_attention import _callers_world, _stays\n")
    if holder:
        script += ("spawn(_callers_world, 1, args=('',))\n"
                   "h = multiprocessing.get_context('forkserver').Process(target=time.sleep,"
                   " args=(60,))\n"
                   f"h.start(); open({str(tmp_path / 'holder.pid')!r}, 'w').write(str(h.pid))\n")
    script += f"spawn(_stays, 2, args=({str(tmp_path)!r}, {str(err)!r}), timeout_s=120)\n"
    with open(err, "w") as f:
        launcher = subprocess.Popen([sys.executable, "-c", script], cwd=root, stderr=f,
                                    env={**os.environ, "PYTHONPATH": str(root)})
    try:
        pids = [tmp_path / f"rank{r}.pid" for r in range(2)]
        end = time.monotonic() + 90
        while not all(p.exists() and p.read_text() for p in pids):
            assert time.monotonic() < end and launcher.poll() is None, err.read_text()
            time.sleep(0.2)
        ranks = [int(p.read_text().split()[0]) for p in pids]
        assert pids[0].read_text().split()[1] == "True"  # echoed while the ranks ran
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        end = time.monotonic() + 10
        while any(map(_alive, ranks)) and time.monotonic() < end:
            time.sleep(0.1)
        assert not any(map(_alive, ranks)), "ranks outlived their launcher"
    finally:
        launcher.kill()
        for p in [*tmp_path.glob("rank*.pid"), tmp_path / "holder.pid"]:
            with contextlib.suppress(Exception):
                os.kill(int(p.read_text().split()[0]), signal.SIGKILL)


def _callers_world(rank: int, world: int, word: str):
    import os
    import sys

    if word:
        print(f"rank {rank}: {word}", flush=True)
    return os.environ.get("BURST_TEST_WORD"), os.getcwd(), sys.path[0]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ranks_start_in_the_callers_environment_folder_and_stdout(method, monkeypatch, capfd,
                                                                 tmp_path):
    """Ranks come from a fork server that started at the first spawn of this process (or anew,
    with "spawn"), and still see what the caller has at each spawn: its environment, working
    folder and sys.path, and its stdout (pytest's capture here, which moves per test)."""
    monkeypatch.setenv("BURST_START_METHOD", method)
    with capfd.disabled():  # (the server starts, if it had not, with another stdout)
        spawn(_callers_world, 1, args=("",))
    monkeypatch.setenv("BURST_TEST_WORD", "later")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    got = spawn(_callers_world, 2, args=("second",))
    assert got == [("later", str(tmp_path), str(tmp_path))] * 2
    out = capfd.readouterr().out
    assert "rank 0: second" in out and "rank 1: second" in out, out


def test_an_unknown_start_method_is_refused(monkeypatch):
    monkeypatch.setenv("BURST_START_METHOD", "fork")
    with pytest.raises(ValueError, match="BURST_START_METHOD='fork': use forkserver or spawn"):
        spawn(_callers_world, 1, args=("x",))


def _sums(rank: int, world: int, tensors: list) -> float:
    return sum(float(t.sum()) for t in tensors)


def test_many_tensors_reach_the_ranks():
    """A fork server takes at most 253 file descriptors per process it starts, and torch
    shares each tensor of a rank's arguments through one: 300 tensors failed ("too many
    fds"). The arguments now travel by value."""
    tensors = [torch.full((3,), float(i)) for i in range(300)]
    assert spawn(_sums, 2, args=(tensors,)) == [3.0 * sum(range(300))] * 2


def _speaks(rank: int, world: int) -> bool:
    import signal

    print("x" * 100_000)  # (more than a pipe holds)
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def _launch(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a launcher process of its own (after ``from burst.spawn import spawn``
    and this module's rank functions)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    # (SIGINT handled, as in a terminal: CI's background shell starts it ignored)
    script = ("import os, signal, sys\nfrom burst.spawn import spawn\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from tests.test_burst_attention import _callers_world, _speaks\n" + body)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})


def test_a_forked_launcher_spawns_and_a_closed_stdout_stays_closed(tmp_path):
    """Found by a review of the fork-server start: a process forked from a launcher after its
    first spawn could not spawn (ChildProcessError: it waited for its parent's server), and a
    launcher with stdout closed gave its ranks one of its own pipes as stdout (a print blocked,
    then failed)."""
    got = _launch(tmp_path, "spawn(_callers_world, 1, args=('',))\n"
                            "pid = os.fork()\n"
                            "if pid == 0:\n"
                            "    os._exit(0 if spawn(_callers_world, 1, args=('',)) else 3)\n"
                            "sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    assert got.returncode == 0, got.stderr[-3000:]
    got = _launch(tmp_path, "os.close(1)\n"
                            "print(spawn(_speaks, 2, timeout_s=60), file=sys.stderr)\n")
    assert got.returncode == 0 and "[False, False]" in got.stderr, got.stderr[-3000:]


def test_ranks_ignore_the_signals_their_caller_ignores_at_each_spawn(tmp_path):
    """The fork server started when SIGINT was not ignored; a later spawn's ranks ignore it as
    their caller now does (and the caller's stdout, a pipe here, takes their 100 kB)."""
    got = _launch(tmp_path, "first = spawn(_speaks, 1)\n"
                            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                            "print(first, spawn(_speaks, 2), file=sys.stderr)\n")
    assert got.returncode == 0 and "[False] [True, True]" in got.stderr, got.stderr[-3000:]
    assert got.stdout.count("x") == 300_000  # (two ranks' writes to a pipe may interleave)


def test_held_signals_act_in_order_once_the_block_ends():
    """``burst.spawn.held_signals``: the driver's guard around a job's submission and record.
    Each distinct signal that came inside acts at the end, in order (only the first did: a
    SIGTERM after an ignored SIGINT was lost); an ignored SIGHUP stays ignored (nohup); with
    ``block`` a process started inside holds them blocked too (sbatch, which a terminal's
    Ctrl-C killed after it had queued its array); every handler is restored."""
    import signal
    import time

    from burst.spawn import held_signals

    seen = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:  # SIGINT as at a terminal (CI may run the tests with it ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda signum, _: seen.append("TERM"))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with pytest.raises(KeyboardInterrupt), held_signals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append("inside")
        assert seen == ["inside", "TERM"]
        with held_signals(deliver=False):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        with held_signals(block=True):
            status = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status')"
                                     ".read().split('SigBlk:')[1].split()[0])"],
                                    capture_output=True, text=True, check=True).stdout
        for sig in (signal.SIGINT, signal.SIGTERM):  # (SIGHUP: ignored here, left alone)
            assert int(status, 16) & (1 << (sig - 1)), (sig, status)
        assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert seen == ["inside", "TERM"]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_signal_the_caller_ignores_stays_ignored_under_interrupt_on_termination():
    """nohup's SIGHUP: the CLI's handler (SIGTERM and SIGHUP as Ctrl-C) replaced it, and a
    driver started under nohup died when its ssh session dropped (a review)."""
    import signal

    from burst.spawn import _terminate, interrupt_on_termination

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with interrupt_on_termination():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is _terminate
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _readme_snippet(rank: int, world: int, code: str):
    from burst.layout import shard
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(11)
    full = [torch.randn(2, 8 * world, 4, 16, generator=g, dtype=torch.float64)
            for _ in range(3)]
    want = [t.clone().requires_grad_() for t in full]
    ref, _ = reference_attention(*want, causal=True)
    ref.square().sum().backward()
    names = dict(zip(("q_full", "k_full", "v_full"), (t.requires_grad_() for t in full),
                     strict=True))
    exec(code, names)  # the README's lines, as written
    names["out"].square().sum().backward()  # this rank's part of the same loss
    errs = [float((names["out_full"] - ref).abs().max())]
    errs += [float((shard(t.grad, layout="zigzag") - shard(w.grad, layout="zigzag")).abs().max())
             for t, w in zip(full, want, strict=True)]
    return errs


def test_the_readme_snippet_runs_as_written():
    """README.md's "BurstAttention in four lines", run as written on 4 gloo ranks (its
    ranks_per_node=8 is one node: a flat ring), against the float64 reference: the gathered
    output, and each rank's gradients of its shards (the local loss's, reaching q_full)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = text.split("## BurstAttention in four lines", 1)[1].split("```python\n", 1)[1]
    code = code.split("```", 1)[0]
    assert "burst_attn(" in code and "unshard(" in code
    for errs in spawn(_readme_snippet, 4, args=(code,), timeout_s=120):
        assert max(errs) < 1e-10, errs
