"""Every CPU-capable baseline on gloo ranks against the float64 single-process reference (issue 3).

One spawn per world size (2, 4, 8) runs every core case and every tensor-parallel block case;
each case asserts forward out and dq/dk/dv (block: y, dx and the weight gradients) against the
float64 oracle, and that the byte counter's (phase, link) totals equal the method's analytic
formula (``Method.bytes``: ``burst.volume.method_bytes``) on every rank. Bad inputs must raise
a ValueError naming the problem; the GPU-only adapters must import and say why they cannot run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines import registry
from baselines.tp import AttentionBlockWeights, attention_block_reference, tp_attention_block
from burst import burst_attn, comm
from burst.layout import shard
from burst.spawn import spawn
from burst.volume import METHODS, method_bytes
from tests.parity import DTYPES, case, check, run_cases, transport_check

F32_TOL = 2e-5  # float32 inputs vs float64, as in tests/test_burst_attention.py
ROOT = Path(__file__).resolve().parents[1]


def _core_cases(world: int) -> list[dict]:
    h = 8 if world == 8 else 4
    cs = []

    def add(method, **kw):
        kw.setdefault("heads", h)
        kw.setdefault("kv_heads", kw["heads"])
        cs.append(case(method, seed=len(cs), **kw))

    add("burst", options=dict(backward="auto"), causal=True, kv_heads=h // 2)
    for causal in (True, False):
        add("ring", causal=causal, kv_heads=h // 2 if causal else h, batch=2)
        add("allgather", causal=causal, kv_heads=h // 2,
            options=dict(layout="zigzag" if causal else "contiguous"))
        add("ulysses", causal=causal, options=dict(layout="contiguous" if causal else "striped"))
        add("usp", causal=causal, kv_heads=h // 2,
            options=dict(ulysses_degree=2, layout="zigzag" if causal else "contiguous"))
        add("double_ring", causal=causal, options=dict(ranks_per_node=2))
    add("zigzag_ring", causal=True, kv_heads=1)
    add("striped_ring", causal=True, kv_heads=h // 2)
    add("allgather", causal=True, options=dict(layout="striped"), kv_heads=1)
    add("ulysses", causal=True, kv_heads=2 if world > 2 else 1,  # kv heads replicated to G
        options=dict(layout="zigzag"))
    add("ulysses", causal=True, options=dict(layout="striped"))  # its reorder under a mask
    if world == 2:
        add("usp", causal=True, options=dict(ulysses_degree=1))  # pure ring
        add("usp", causal=True, options=dict(ulysses_degree=2, layout="zigzag"))  # pure Ulysses
        for m in ("ring", "allgather", "ulysses", "usp"):  # low precision: the naive-error rule
            add(m, causal=True, dtype="bfloat16", naive=True, seq_local=32, head_dim=32)
    if world == 4:
        # per-link counts: two "nodes" of 2 ranks each
        for m, opts in (("ring", {}), ("zigzag_ring", {}), ("double_ring", {}),
                        ("allgather", {}), ("ulysses", {}),
                        ("usp", dict(ulysses_degree=2, layout="zigzag"))):
            add(m, causal=True, options=opts, kv_heads=2, ranks_per_node=2)
        add("usp", causal=True, kv_heads=1, options=dict(ulysses_degree=2))  # kv replicated
        add("burst", causal=True, kv_heads=1)  # registry defaults (backward=burst) under GQA
        # inner rings of one rank: a flat ring (InternEvo's window of cp/4 on 4 GPUs)
        add("double_ring", causal=True, options=dict(ranks_per_node=1), ranks_per_node=2)
        for node in (None, 2):  # Burst-USP: Ulysses inside a node, burst backward across
            add("usp", causal=True, ranks_per_node=node,
                options=dict(ulysses_degree=2, layout="zigzag", backward="burst"))
        add("usp", causal=True, options=dict(ulysses_degree=4, layout="zigzag"))  # = Ulysses
        for kv in (h, 1):  # backward="auto": burst for MHA, ring for one kv head (replicated)
            add("usp", causal=True, kv_heads=kv, ranks_per_node=2,
                options=dict(ulysses_degree=2, layout="zigzag", backward="auto"))
        for m in ("ring", "allgather", "ulysses", "usp"):  # sliding window (ring span 1)
            add(m, causal=True, window=(5, 0), options=dict(layout="contiguous"))
        add("zigzag_ring", causal=True, cu_seqlens=(0, 5, 21, 32))  # documents
        for m, opts in (("zigzag_ring", {}), ("burst", dict(backward="burst")),
                        ("usp", dict(ulysses_degree=2, layout="zigzag", backward="burst"))):
            # gradients travel in bf16 (TransformerEngine's dK/dV, BurstEngine's dQ): bytes and
            # the naive-error rule
            add(m, causal=True, dtype="bfloat16", naive=True, seq_local=32, head_dim=32,
                options=dict(opts, grad_acc="input"))
        # bad inputs: each must raise a ValueError naming the rule before any communication
        add("ulysses", heads=6, kv_heads=6, expect_error="does not divide 6 query heads")
        add("zigzag_ring", causal=False, expect_error="causal work only")
        add("striped_ring", causal=False, expect_error="causal work only")
        add("usp", options=dict(ulysses_degree=3), expect_error="ulysses_degree=3")
        add("usp", options=dict(layout="striped"), expect_error="layout 'striped'")
        add("double_ring", options=dict(ranks_per_node=3), expect_error="ranks_per_node=3")
        add("double_ring", options=dict(ranks_per_node=0), expect_error="ranks_per_node=0")
        add("double_ring", options=dict(ranks_per_node=None), expect_error="ranks_per_node=None")
        for m in ("ulysses", "allgather", "usp"):  # the kernel is named before any transfer
            add(m, options=dict(backend="triton"), expect_error="unknown kernel backend 'triton'")
            # and one that cannot run these tensors (it sent 768-12288 bytes first: an audit)
            add(m, options=dict(backend="cuda_sdpa"), expect_error="needs CUDA tensors")
        add("allgather", seq_local=8, cu_seqlens=(0, 3, 6), expect_error="cu_seqlens")
        for m in ("usp", "ulysses", "double_ring"):  # masks are checked before any transfer
            add(m, seq_local=8, cu_seqlens=(0, 3, 6), expect_error="cu_seqlens")
            add(m, causal=True, window=(-1, 0), expect_error="window=(-1, 0)")
        add("allgather", seq_local=7, expect_error="not divisible by 2")
        for m in ("zigzag_ring", "usp"):
            add(m, causal=True, options=dict(grad_acc="bf16"),
                expect_error="unknown grad_acc 'bf16'; valid: fp32, input")
        add("tp", expect_error="block-level")
        add("ring_flash_attn", expect_error="pip install ring-flash-attn flash-attn")
        add("yunchang", expect_error="pip install yunchang")
    if world == 8:
        add("double_ring", causal=True, options=dict(ranks_per_node=4), ranks_per_node=4)
        add("usp", causal=True, options=dict(ulysses_degree=4), ranks_per_node=4)
        # inner rings of 2 inside nodes of 4: its outer hops cross a node boundary or not
        add("double_ring", causal=True, options=dict(ranks_per_node=2), ranks_per_node=4)
        # a window truncates USP's ring over U x n tokens, not n
        add("usp", causal=True, window=(12, 0), options=dict(ulysses_degree=2,
                                                               layout="contiguous"))
        # Burst-USP over nodes of 4: a ring of 4 whose accumulators' last hop home crosses a
        # node where the next hop would not (at world 4 both peers are one rank: untested)
        add("usp", causal=True, ranks_per_node=4,
            options=dict(ulysses_degree=2, layout="zigzag", backward="burst"))
        # windows whose keys lie on both sides: the rings send both ways (ring_reach (1, 1)),
        # their hops labelled by the nodes of 4 they cross in either direction
        add("zigzag_ring", causal=True, window=(3, 0), ranks_per_node=4)
        for backward in ("ring", "burst"):  # USP's ring of 4 over 16-token blocks
            add("usp", causal=True, window=(6, 0), ranks_per_node=4,
                options=dict(ulysses_degree=2, layout="zigzag", backward=backward))
    return cs


def _block_cases(world: int) -> list[dict]:
    cs = [dict(causal=True, heads=2 * world, kv_heads=world, head_dim=8, hidden=24, seq_local=6,
               batch=2, ranks_per_node=None, weights=True, seed=1),
          dict(causal=False, heads=world, kv_heads=world, head_dim=8, hidden=32, seq_local=4,
               batch=1, ranks_per_node=2 if world == 4 else None, weights=True, seed=2)]
    n = 4 * world  # a window, and documents with one straddling ranks (and with a window)
    docs = (0, 3, n - 1, n)
    cs += [dict(causal=True, heads=world, kv_heads=world, head_dim=8, hidden=16, seq_local=4,
                batch=1, ranks_per_node=None, weights=True, seed=4, **mask)
           for mask in (dict(window=(3, 0)), dict(cu_seqlens=docs),
                        dict(window=(2, 0), cu_seqlens=docs))]
    cs.append(dict(causal=False, heads=world, kv_heads=world, head_dim=8, hidden=16,
                   seq_local=4, batch=1, ranks_per_node=None, weights=True, seed=5,
                   window=(2, 1)))
    if world == 4:
        # none, the whole weights instead of a share, documents short of the sequence, or a
        # CUDA kernel on CPU tensors (refused after the gather: an audit)
        for weights in (False, "whole", "short_docs", "cuda_backend"):
            cs.append(dict(causal=True, heads=4, kv_heads=4, head_dim=8, hidden=32,
                           seq_local=4, batch=1, ranks_per_node=None, weights=weights, seed=3))
    return cs


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _run_block(c: dict, rank: int, world: int) -> dict:
    g = torch.Generator().manual_seed(c["seed"])
    n = c["seq_local"] * world
    full = AttentionBlockWeights.random(c["hidden"], c["heads"], c["kv_heads"], c["head_dim"],
                                        generator=g, dtype=torch.float64)
    x = torch.randn(c["batch"], n, c["hidden"], generator=g, dtype=torch.float64)
    dy = torch.randn(c["batch"], n, c["hidden"], generator=g, dtype=torch.float64)
    x_loc = shard(x, layout="contiguous").float().requires_grad_()
    if c["weights"] is not True:
        given = {False: None, "whole": full}.get(c["weights"], full.shard(rank, world))
        with comm.count_bytes() as cnt:
            try:
                tp_attention_block(
                    x_loc, None if given is None else given.map(torch.Tensor.float),
                    causal=c["causal"],
                    cu_seqlens=(0, n - 1) if c["weights"] == "short_docs" else None,
                    backend="cuda_sdpa" if c["weights"] == "cuda_backend" else "auto")
            except ValueError as e:
                return {"raised": str(e), "sent": cnt.sent()}
        return {"raised": None}
    ref_w = full.map(lambda t: t.clone().requires_grad_())
    ref_x = x.clone().requires_grad_()
    mask = {k: c[k] for k in ("window", "cu_seqlens") if k in c}
    y_ref = attention_block_reference(ref_x, ref_w, causal=c["causal"], **mask)
    y_ref.backward(dy)
    mine = full.shard(rank, world).map(lambda t: t.float().contiguous().requires_grad_())
    with comm.count_bytes(ranks_per_node=c["ranks_per_node"]) as cnt:
        y = tp_attention_block(x_loc, mine, causal=c["causal"], **mask)
        y.backward(shard(dy, layout="contiguous").float())
    ref_mine = AttentionBlockWeights(ref_w.wq.grad, ref_w.wk.grad, ref_w.wv.grad, ref_w.wo.grad,
                                     c["heads"], c["kv_heads"]).shard(rank, world)
    errs = {"y": _rel(y, shard(y_ref.detach(), layout="contiguous")),
            "dx": _rel(x_loc.grad, shard(ref_x.grad, layout="contiguous"))}
    for f in ("wq", "wk", "wv", "wo"):
        errs["d" + f] = _rel(getattr(mine, f).grad, getattr(ref_mine, f))
    return {"errs": errs, "bytes": dict(cnt._sent), "recv": dict(cnt._recv)}


def run_world(rank: int, world: int, cases: list[dict], block_cases: list[dict]):
    torch.manual_seed(0)
    return (run_cases(rank, world, cases), [_run_block(c, rank, world) for c in block_cases],
            _subgroup_collectives(rank, world) if world == 4 else None,
            transport_check(rank, world, "cpu") if world == 4 else None)


_RESULTS: dict = {}


def _results(world: int):
    if world not in _RESULTS:
        cs, bs = _core_cases(world), _block_cases(world)
        out = spawn(run_world, world, args=(cs, bs), timeout_s=240)
        _RESULTS[world] = (cs, bs, [r[0] for r in out], [r[1] for r in out],
                           [r[2] for r in out], [r[3] for r in out])
    return _RESULTS[world]


def _expected(c: dict, world: int, rank: int):
    m = registry.get(c["method"])
    dtype = DTYPES[c["dtype"]]
    return m.bytes(world=world, batch=c["batch"], seq_local=c["seq_local"], heads=c["heads"],
                   kv_heads=c["kv_heads"], head_dim=c["head_dim"],
                   elem=torch.empty((), dtype=dtype).element_size(),
                   acc_elem=8 if dtype == torch.float64 else 4, **c["options"], rank=rank,
                   node_size=c["ranks_per_node"], causal=c["causal"], window=c["window"],
                   cu_seqlens=c["cu_seqlens"])


def _nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_core_parity_and_bytes(world):
    cases, _, per_rank, *_ = _results(world)
    failures = check(cases, per_rank, world, _expected, F32_TOL)
    assert not failures, "\n".join(failures[:20])


def test_usp_auto_backward_is_burst_attns_rule_on_its_ring():
    """usp's backward="auto" (it was refused): the ring across the Ulysses groups takes the
    scheme whose bytes are fewer, as burst_attn's rule gives for the ring's own tensors (U*n
    tokens x H/U heads); the parity cases above run both outcomes on gloo."""
    from burst.volume import auto_backward, usp_auto_backward

    shape = dict(batch=1, seq_local=16, heads=4, head_dim=8, elem=4, acc_elem=4)
    for kv, want in ((4, "burst"), (1, "ring")):
        got = usp_auto_backward(ulysses_degree=2, world=4, kv_heads=kv, **shape)
        own = auto_backward(**{**shape, "seq_local": 32, "heads": 2}, world=2,
                            kv_heads=max(kv, 2) // 2)  # kv heads replicated up to U = 2
        assert got == own == want, (kv, got, own)
    # one kv head replicated up to U = 4 is as many as the heads: burst, as for MHA (ring
    # for the one kv head unreplicated); usp's bytes under "auto" are those of that pick
    assert usp_auto_backward(ulysses_degree=4, world=8, kv_heads=1, **shape) == "burst"
    case = dict(shape, world=8, kv_heads=1, ulysses_degree=4, causal=True)
    assert method_bytes("usp", **case, backward="auto").by == method_bytes(
        "usp", **case, backward="burst").by != method_bytes("usp", **case, backward="ring").by
    registry.get("usp").check(world=4, heads=4, kv_heads=4, seq_local=16, causal=True,
                              ulysses_degree=2, backward="auto")  # raised before


@pytest.mark.parametrize("world", [2, 4, 8])
def test_tp_block_parity_and_bytes(world):
    _, cases, _, per_rank, *_ = _results(world)
    failures = block_failures(cases, per_rank, world)
    assert not failures, "\n".join(failures[:20])


def block_failures(cases: list[dict], per_rank: list[list[dict]], world: int) -> list[str]:
    """Every failure of ``_run_block``'s results: the expected refusals, relative errors under
    F32_TOL, bytes sent == the tp formula."""
    failures = []
    for i, c in enumerate(cases):
        for rank in range(world):
            r = per_rank[rank][i]
            if c["weights"] is not True:  # G x the output, silently, with the whole weights
                want = {False: "needs this rank's projection weights",
                        "whole": "a 1-way share (the whole weights) but the group has 4 ranks",
                        "short_docs": "cu_seqlens ends at 15 but the global sequence has 16 "
                                      "tokens",
                        "cuda_backend": "'cuda_sdpa' needs CUDA tensors"}[c["weights"]]
                if not r["raised"] or want not in r["raised"]:
                    failures.append(f"tp with weights={c['weights']}: got {r['raised']!r}")
                elif r["sent"]:
                    failures.append(f"tp with weights={c['weights']}: sent {r['sent']} bytes "
                                    "before raising")
                continue
            bad = {k: e for k, e in r["errs"].items() if not e < F32_TOL}
            if bad:
                failures.append(f"rank {rank} tp {c}: relative errors {bad}")
            want = _nonzero(registry.get("tp").bytes(
                world=world, batch=c["batch"], seq_local=c["seq_local"], heads=c["heads"],
                kv_heads=c["kv_heads"], head_dim=c["head_dim"], elem=4, hidden=c["hidden"],
                rank=rank, node_size=c["ranks_per_node"]).by)
            if _nonzero(r["bytes"]) != want:
                failures.append(f"rank {rank} tp {c}: bytes {_nonzero(r['bytes'])} != {want}")
    return failures


def test_every_cpu_method_is_exercised():
    tested = {c["method"] for w in (2, 4, 8) for c in _core_cases(w) if not c["expect_error"]}
    cpu_core = set(registry.names(available_only=True, level="core"))
    assert cpu_core <= tested, f"untested CPU methods: {cpu_core - tested}"
    assert registry.names(level="block") == ["tp"]
    assert set(registry.names()) <= set(METHODS)  # every built-in has a byte formula


def test_gpu_only_adapters_import_and_say_why():
    for name, install in (("ring_flash_attn", "pip install ring-flash-attn flash-attn"),
                          ("yunchang", "pip install yunchang")):
        m = registry.get(name)
        q = torch.zeros(1, 4, 2, 8, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=rf"method '{name}' does not support window=\(4, 0\)"):
            m(q, q, q, causal=True, window=(4, 0))  # was a TypeError
        why = m.unavailable()
        if torch.cuda.is_available() and why is None:
            continue  # really installed: nothing to report
        assert why and "\n" not in why and install in why and "missing" in why, why
        assert name not in registry.names(available_only=True)
        with pytest.raises(ValueError, match=re.escape(install)):
            m(q, q, q, causal=True)  # no process group needed: it fails before any transfer


def test_bad_names_and_options_are_rejected():
    with pytest.raises(ValueError, match=r"unknown method 'nope'; registered: .*usp, .*"):
        registry.get("nope")
    shape = dict(world=4, batch=1, seq_local=8, heads=4, kv_heads=4, head_dim=8, elem=4)
    with pytest.raises(ValueError, match="no byte formula for method 'nope'"):
        method_bytes("nope", **shape)
    with pytest.raises(ValueError, match="has no option"):
        method_bytes("usp", ulysses_degre=2, **shape)
    with pytest.raises(ValueError, match="backward='Burst': expected 'burst' or 'ring'"):
        method_bytes("burst", backward="Burst", **shape)  # was priced as the ring backward
    # the shapes every method refuses get no byte count (kv_heads 0 counted 0 bytes)
    for bad, why in ((dict(kv_heads=8), "4 query heads are not divisible by 8 kv heads"),
                     (dict(kv_heads=3), "4 query heads are not divisible by 3 kv heads"),
                     (dict(kv_heads=0), "kv_heads=0"), (dict(world=True), "world=True"),
                     (dict(head_dim=8.0), "head_dim=8.0")):
        with pytest.raises(ValueError, match=why):
            method_bytes("burst", **{**shape, **bad})
    import numpy as np

    assert method_bytes("burst", **{**shape, "world": np.int64(4)}).by == method_bytes(
        "burst", **shape).by
    with pytest.raises(ValueError, match="2 query heads and 0 kv heads: need at least one"):
        registry.get("ring")(torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 0, 8),
                             torch.zeros(1, 8, 0, 8), causal=True)  # was ZeroDivisionError
    with pytest.raises(ValueError, match="block-level"):
        registry.get("tp")(torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8),
                           torch.zeros(1, 4, 2, 8))
    w = AttentionBlockWeights.random(12, 4, 2, 4)  # hidden 12, 4 heads x 4
    with pytest.raises(ValueError, match="valid group sizes: 1, 2$"):
        w.shard(0, 4)  # 2 kv heads cannot split 4 ways
    with pytest.raises(ValueError, match="wo has shape"):
        AttentionBlockWeights(w.wq, w.wk, w.wv, w.wo.T, 4, 2)
    with pytest.raises(ValueError, match="already a 2-way share"):
        w.shard(0, 2).shard(0, 1)
    # what a method's check refuses, the harness refuses before its cell runs (these were
    # accepted: a cell that failed only at run time, usp after its all-to-alls had sent)
    checks = dict(world=4, heads=4, kv_heads=4, seq_local=8, causal=True)
    with pytest.raises(ValueError, match=r"ranks_per_node=3 \(the inner ring size\)"):
        registry.get("double_ring").check(**checks, ranks_per_node=3)
    with pytest.raises(ValueError, match="backward='bogus'; valid: auto, ring, burst"):
        registry.get("usp").check(**checks, ulysses_degree=2, backward="bogus")
    # every method's call is checked before a shape is read (an AttributeError or an
    # IndexError from the wrapper itself, where burst_attn said what was wrong: an audit)
    t = torch.zeros(1, 8, 2, 8)
    for name in ("burst", "ring", "ulysses"):
        with pytest.raises(TypeError, match=f"method '{name}': q must be a torch.Tensor"):
            registry.get(name)([1.0], t, t)
        with pytest.raises(ValueError, match=r"q has shape \(\); expected 4 dims"):
            registry.get(name)(torch.tensor(1.0), t, t)
    # a numpy integer is the same count for every method, as for burst_attn: the registry
    # hands the method a Python int (double_ring and usp refused np.int64(2), naming 2 valid)
    import dataclasses

    import numpy as np

    seen = dataclasses.replace(registry.get("usp"), fn=lambda q, k, v, **kw: kw)(
        t, t, t, ulysses_degree=np.int64(2))
    assert type(seen["ulysses_degree"]) is int and seen["ulysses_degree"] == 2


def test_numpy_counts_and_the_tp_blocks_refusals_before_any_transfer():
    """Method.check took what its call converts (np.int64(2) for ulysses_degree or
    ranks_per_node was refused, naming 2 as valid); the tp block refused no local tokens only in
    a reshape after its gather, and a CUDA kernel on CPU tensors only after it."""
    import numpy as np

    from baselines.double_ring import double_ring_attn

    shape = dict(world=4, heads=4, kv_heads=4, seq_local=8, causal=True)
    registry.get("usp").check(**shape, ulysses_degree=np.int64(2))
    for m in ("double_ring", "burst"):
        registry.get(m).check(**shape, ranks_per_node=np.int64(2))
    q = torch.randn(1, 8, 2, 4)
    torch.testing.assert_close(double_ring_attn(q, q, q, causal=True, ranks_per_node=np.int64(2)),
                               double_ring_attn(q, q, q, causal=True, ranks_per_node=2))
    w = AttentionBlockWeights.random(16, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="local sequence length 0"):
        tp_attention_block(torch.zeros(1, 0, 16), w)
    with pytest.raises(ValueError, match="kernel backend 'cuda_sdpa' needs CUDA tensors"):
        tp_attention_block(torch.zeros(1, 4, 16), w, backend="cuda_sdpa")
    # a share made for another group size ran: 8-way shares on 4 ranks were 0.66 off, silently
    with pytest.raises(ValueError, match="a 2-way share but the group has 1 ranks"):
        tp_attention_block(torch.zeros(1, 4, 16), w.shard(0, 2))
    with pytest.raises(ValueError, match="x is torch.float64 but the weights are torch.float32"):
        tp_attention_block(torch.zeros(1, 4, 16, dtype=torch.float64), w)


def test_each_ring_adapter_runs_on_its_own_layout_by_default():
    """The adapters' default layouts (the tests pass the layout through the registry, so
    striped_ring_attn defaulting to zigzag, which it refuses, went unseen)."""
    from baselines.ring_family import ring_attn, striped_ring_attn, zigzag_ring_attn

    q = torch.randn(1, 8, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for fn, layout in ((ring_attn, "contiguous"), (zigzag_ring_attn, "zigzag"),
                       (striped_ring_attn, "striped")):
        torch.testing.assert_close(fn(q, q, q, causal=True),
                                   burst_attn(q, q, q, causal=True, layout=layout,
                                              backward="ring"))


def test_formulas_agree_where_methods_coincide():
    shape = dict(world=8, batch=2, seq_local=64, heads=8, kv_heads=2, head_dim=16, elem=2)
    ring = method_bytes("ring", **shape).by
    assert method_bytes("usp", ulysses_degree=1, **shape).by == ring  # U = 1: a ring
    assert method_bytes("double_ring", ranks_per_node=8, **shape).by == ring  # one node
    # inner rings of one rank are a flat ring; without node_size, one node (the counter's
    # default) as for every method, not a node per rank
    assert method_bytes("double_ring", ranks_per_node=1, **shape).by == ring
    assert method_bytes("ring_flash_attn", layout="contiguous", **shape).by == ring
    ulysses = method_bytes("ulysses", **shape)
    assert method_bytes("usp", ulysses_degree=8, **shape).by == ulysses.by  # U = G: Ulysses
    # selective checkpointing's re-sent all-to-alls: USP's are Ulysses' over its U ranks (a
    # group of 2 whatever the degree passed a test audit)
    from burst.volume import regather_bytes

    for u in (2, 4, 8):
        usp = regather_bytes("usp", ulysses_degree=u, **shape).by
        assert usp == regather_bytes("ulysses", **{**shape, "world": u}).by, u
        assert usp == {("forward", "intra"): method_bytes(  # the forward's all-to-alls
            "usp", ulysses_degree=u, **{**shape, "world": u}).sent("forward")}, u
    assert (method_bytes("allgather", **shape).sent("forward")
            == method_bytes("ring", **shape).sent("forward"))  # both move (G-1) K/V blocks
    # Ulysses: 8 all-to-alls of (G-1)/G of a local tensor; 2 kv heads replicated to 8
    u = shape["batch"] * shape["seq_local"] * shape["head_dim"] * shape["elem"]
    assert ulysses.sent() == 2 * 7 * (2 * 8 + 2 * 8) * u // 8


def test_bytes_table_in_docs_is_current():
    out = subprocess.run([sys.executable, "-m", "baselines.bytes_table"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    doc = (ROOT / "docs" / "communication.md").read_text()
    assert out.strip() in doc, "docs/communication.md is stale: python -m baselines.bytes_table"


def _subgroup_collectives(rank: int, world: int):
    from burst import comm

    group = comm.subgroup([[0, 1], [2, 3]], purpose="test")
    me, peer = rank % 2, rank - rank % 2 + 1 - rank % 2  # rank in the pair, the other one
    x = torch.arange(4.0) + 10 * rank
    with comm.count_bytes(ranks_per_node=2) as c:
        got = {
            "reduce_scatter": comm.reduce_scatter(x.clone(), group=group).tolist(),
            "all_gather": comm.all_gather(x[:1], group=group).tolist(),
            "all_to_all": comm.all_to_all(x, split_dim=0, cat_dim=0, group=group).tolist(),
            "all_reduce": comm.all_reduce(x.clone(), group=group, op="max").tolist(),
            "gather_objects": comm.gather_objects({"rank": rank}, group=group),
        }
    both = sorted((rank, peer))
    xs = {r: torch.arange(4.0) + 10 * r for r in both}
    want = {
        "reduce_scatter": (xs[both[0]] + xs[both[1]]).chunk(2)[me].tolist(),
        "all_gather": [xs[both[0]][0].item(), xs[both[1]][0].item()],
        "all_to_all": torch.cat([xs[r].chunk(2)[me] for r in both]).tolist(),
        "all_reduce": torch.maximum(xs[both[0]], xs[both[1]]).tolist(),
        "gather_objects": [{"rank": r} for r in both],
    }
    with comm.count_bytes(ranks_per_node=2) as objects:  # the pickled object, to the peer
        comm.gather_objects("abc", group=group)
    import pickle

    want["object bytes"] = len(pickle.dumps("abc"))
    got["object bytes"] = objects.sent()
    # objects of other sizes on the two ranks: each sends its own and receives its peer's (a
    # mutation audit: recorded the other way round, unseen with the same object everywhere)
    mine, theirs = ("x" * (10 + 1000 * r) for r in (me, 1 - me))
    with comm.count_bytes(ranks_per_node=2) as sized:
        comm.gather_objects(mine, group=group)
    got["sized objects"] = [sized.sent(), sized.received()]
    want["sized objects"] = [len(pickle.dumps(mine)), len(pickle.dumps(theirs))]
    # a group per purpose, over the same ranks too: the ring's reads and accumulators never
    # share a communicator (NCCL would serialise them), nor USP's groups the ring's (merged
    # when the cache key dropped the purpose: a mutation audit)
    flat, double = comm.ring_groups(None), comm.ring_groups(None, ranks_per_node=2)
    got["own groups"] = [flat.read_intra is not flat.acc_intra,
                         double.read_intra is not double.acc_intra,
                         double.read_inter is not double.acc_inter,
                         comm.subgroup([[0, 1], [2, 3]], purpose="another test") is not group,
                         comm.subgroup([[0, 1], [2, 3]], purpose="test") is group]
    want["own groups"] = [True] * 5
    # a ring on ranks {1, 2, 3} after one on {0, 1, 2}: rank 3 had made none of the first
    # ring's groups, so torch named the second ring's groups otherwise there than on ranks 1
    # and 2, and they waited on each other until the timeout (a topology audit). Refused instead
    ring, refused = registry.get("ring"), "the ranks of this group have made different numbers"
    got["overlapping rings"] = []
    for part in ([[0, 1, 2], [3]], [[1, 2, 3], [0]]):
        g = comm.subgroup(part, purpose=f"overlap {part}")
        if rank in part[0]:
            q = torch.randn(1, 8, 2, 8, requires_grad=True)
            try:
                ring(q, q.detach(), q.detach(), causal=True, group=g).sum().backward()
                got["overlapping rings"].append("ok")
            except ValueError as e:
                got["overlapping rings"].append(str(e)[:len(refused)])
    want["overlapping rings"] = {0: ["ok"], 3: [refused]}.get(rank, ["ok", refused])
    with comm.count_bytes(ranks_per_node=2) as tiny:  # one byte: was counted as none
        comm.all_reduce(torch.ones(1, dtype=torch.uint8), group=group, op="max")
    # split and joined on other dims (one buffer each way): my part of each peer's tensor, the
    # peers' parts in group order, as the list all-to-all and a concatenation give
    mine = [0, 1] if rank < 2 else [2, 3]
    y = torch.arange(24.0).reshape(2, 3, 4) + 100 * rank
    got["all_to_all dims"], want["all_to_all dims"] = [], []
    for split, cat in ((2, 0), (-1, 1), (0, 2), (-3, -2)):
        got["all_to_all dims"].append(comm.all_to_all(y, split_dim=split, cat_dim=cat,
                                                      group=group).tolist())
        part = [(torch.arange(24.0).reshape(2, 3, 4) + 100 * s).chunk(2, dim=split)
                [mine.index(rank)] for s in mine]
        want["all_to_all dims"].append(torch.cat(part, dim=cat).tolist())
    # a node size that does not divide the world (3 of 4): refused, as burst_attn refuses it
    # (it made nodes {0, 1, 2} and {3}: a topology audit)
    try:
        with comm.count_bytes(ranks_per_node=3):
            pass
        got["node of 3"] = "no error"
    except ValueError as e:
        got["node of 3"] = str(e)
    want["node of 3"] = ("count_bytes: a group of 4 ranks is not divisible by ranks_per_node=3; "
                         "valid values: 1, 2, 4, or any number >= 4 (one node: a flat ring)")
    return (got == want, (got, want), c.sent(link="inter"), c.received(link="inter"),
            tiny.sent())


def test_collectives_on_subgroups():
    """Collectives inside a group that is not the world (USP's and the engine's sub-groups):
    gloo's stand-in reduce-scatter reduces to each piece's global rank; nothing crosses the
    node boundary when the group sits inside one node; an all-reduce of fewer bytes than the
    group has ranks still counts its ring all-reduce (2 x ceil(1 / 2) bytes to the peer)."""
    for ok, detail, inter_sent, inter_recv, tiny in _results(4)[4]:  # in the world-4 spawn
        assert ok, detail
        assert inter_sent == inter_recv == 0
        assert tiny == 2


def test_links_come_from_the_counter_or_local_world_size(monkeypatch):
    """Under torchrun / submitit the node size is $LOCAL_WORLD_SIZE; the counter's own
    ranks_per_node wins; without either every rank is on one node."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with comm.count_bytes() as c:
        assert c._link(0, 3) == "intra"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with comm.count_bytes() as c:
        assert c._link(0, 3) == "inter" and c._link(0, 1) == "intra"
    with comm.count_bytes(ranks_per_node=4) as c:
        assert c._link(0, 3) == "intra"
    # read unchecked, -1 labelled every link inter, 0 none, "abc" failed at the first transfer
    for bad in ("-1", "0", "abc", ""):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with (pytest.raises(ValueError, match=re.escape(
                "count_bytes: $LOCAL_WORLD_SIZE must be a whole number >= 1 (or None), got "
                f"{int(bad) if bad.lstrip('-').isdigit() else bad!r}")),
              comm.count_bytes()):
            pass


def test_every_method_over_the_transport_of_the_process_group():
    """The worker the GPU check runs over NCCL (tests/test_gpu.py), here over gloo inside the
    world-4 spawn: it must pass wherever the transport is sound, so a failure on GPUs is the
    transport's."""
    for errs in _results(4)[5]:
        assert len(errs) == 10 and max(errs.values()) < 1e-4, errs


# where torch.distributed may be called: the one communication module, the engine's DDP/FSDP
# wrapping and state saving (torch's own, README "What is here"), and the adapters of the
# external packages, which call it themselves (their byte columns stay empty)
_CALLERS = {"burst/comm.py", "burst/engine/parallel.py", "baselines/external.py"}
# elsewhere only what sends nothing: DTensor types and placements, distribute_tensor with
# src_data_rank=None (each rank keeps its own piece), and reading a checkpoint's metadata
_QUIET = {"torch.distributed.tensor": {"DTensor", "Replicate", "Shard", "distribute_tensor"},
          "torch.distributed.checkpoint": {"FileSystemReader"},
          "torch.distributed.checkpoint.metadata": {"TensorStorageMetadata"}}


def _distributed_uses(tree) -> list[str]:
    import ast

    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("torch.distributed")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distrib"):
            quiet = _QUIET.get(node.module, set())
            bad += [f"{node.module}.{a.name}" for a in node.names if a.name not in quiet]
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            bad += [f"torch.{a.name}" for a in node.names if a.name == "distributed"]
        elif isinstance(node, ast.Attribute) and node.attr == "distributed" and \
                isinstance(node.value, ast.Name) and node.value.id == "torch":
            bad.append(f"torch.distributed (line {node.lineno})")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "distribute_tensor":
            src = [k.value for k in node.keywords if k.arg == "src_data_rank"]
            if not (src and isinstance(src[0], ast.Constant) and src[0].value is None):
                bad.append(f"distribute_tensor without src_data_rank=None (line {node.lineno})")
    return bad


def test_only_the_communication_module_and_torchs_wrappers_call_torch_distributed():
    """What moves bytes goes through ``burst.comm`` (so the byte counter sees it), except
    torch's DDP/FSDP and checkpoint calls in ``burst/engine/parallel.py`` and the external
    adapters: an import of torch.distributed anywhere else fails here, with its file."""
    import ast

    found = {}
    for path in sorted([*ROOT.glob("burst/**/*.py"), *ROOT.glob("baselines/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        uses = _distributed_uses(ast.parse(path.read_text(), rel))
        if uses and rel not in _CALLERS:
            found[rel] = uses
    assert not found, found
    # and the check itself sees each kind of use
    probe = ast.parse("import torch.distributed as dist\nfrom torch.distributed import "
                      "all_reduce\nx = torch.distributed.get_rank()\n"
                      "from torch.distributed.tensor import DTensor, distribute_tensor\n"
                      "distribute_tensor(w, mesh, p)\ndistribute_tensor(w, mesh, p, "
                      "src_data_rank=None)\n")
    assert sorted(_distributed_uses(probe)) == [
        "distribute_tensor without src_data_rank=None (line 5)", "torch.distributed",
        "torch.distributed (line 3)", "torch.distributed.all_reduce"]


def test_index_tensors_cached_under_inference_mode_still_train():
    """Ulysses' and USP's cached index tensors, first made under torch.inference_mode (an
    evaluation pass before training), were inference tensors: every later training call with
    those shapes failed, autograd cannot save them (a core API audit)."""
    from baselines.ulysses import _gathered_positions
    from baselines.usp import _ring_order

    _gathered_positions.cache_clear()
    _ring_order.cache_clear()
    with torch.inference_mode():
        made = [_gathered_positions(8, 4, "zigzag"), *_ring_order(8, 4, 2, 1, "zigzag")]
    assert not any(t.is_inference() for t in made)
    x = torch.randn(1, 32, 2, requires_grad=True)
    x.index_select(1, _gathered_positions(8, 4, "zigzag")).sum().backward()  # it raised
    assert torch.equal(x.grad, torch.ones_like(x))
    _gathered_positions.cache_clear()
    _ring_order.cache_clear()


def _tp_gradient_penalty(rank: int, world: int):
    """A gradient penalty on d(loss)/d(wo) through the TP block, taken back to x: the
    reduce-scatter's backward all-gathers dy with raw collectives (no graph), so the term of
    the penalty through dy was dropped without a word (x.grad off by 2340 of 4369 at 2 ranks
    against float64)."""
    g = torch.Generator().manual_seed(0)
    n = 4 * world
    full = AttentionBlockWeights.random(8, 2, 2, 4, generator=g, dtype=torch.float64)
    x = torch.randn(1, n, 8, generator=g, dtype=torch.float64)
    x_loc = shard(x, layout="contiguous").clone().requires_grad_()
    mine = full.shard(rank, world).map(lambda t: t.clone().requires_grad_())
    y = tp_attention_block(x_loc, mine, causal=True)
    try:
        torch.autograd.grad(y.square().sum(), mine.wo, create_graph=True)
    except RuntimeError as e:
        refused = str(e)
    else:
        refused = None
    y = tp_attention_block(x_loc, mine, causal=True)  # a plain backward still runs
    (dwo,) = torch.autograd.grad(y.square().sum(), mine.wo)
    # Ulysses' all-to-all, alone (in a method, the guarded local attention refuses first)
    from baselines.ulysses import all_to_all

    t = torch.randn(1, 2, 2 * world, 3, generator=g, dtype=torch.float64, requires_grad=True)
    a2a = all_to_all(t, split_dim=2, cat_dim=1, group=None)
    try:
        torch.autograd.grad(a2a.square().sum(), t, create_graph=True)
    except RuntimeError as e:
        a2a_refused = str(e)
    else:
        a2a_refused = None
    return refused, a2a_refused, bool(torch.isfinite(dwo).all() and dwo.abs().sum() > 0)


def test_raw_collective_backwards_refuse_a_second_derivative():
    for refused, a2a_refused, plain_ok in spawn(_tp_gradient_penalty, 2, timeout_s=120):
        assert refused is not None and refused.startswith("ReduceScatterSeq: no second "
                                                          "derivative"), refused
        assert a2a_refused is not None and a2a_refused.startswith("AllToAll: no second"), \
            a2a_refused
        assert plain_ok


def test_a_failed_adapter_import_leaves_no_partial_registry():
    """The registry marked its built-ins loaded before importing them: after one adapter's
    import failed, the next call returned the registry without it, silently."""
    code = ("import sys; sys.modules['baselines.tp'] = None\n"
            "from baselines import registry\n"
            "try:\n    registry.names()\nexcept ImportError:\n    print('raised')\n"
            "del sys.modules['baselines.tp']\n"
            "print(' '.join(registry.names()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == "raised" and "tp" in out[1:], out


def test_registry_order_is_the_builtins_whatever_was_imported_first():
    """baselines._builtins promises its MODULES order for the registry (BurstAttention first),
    whichever adapter a caller imported first: the random cases draw methods by their index in
    registry.names(), so a seed drew another method after another import order. No test held
    the promise (the sort in registry._load_builtins could go: a mutation audit). And every
    adapter module that registers a method is in MODULES (else it is missing from the registry
    until something imports it)."""
    from baselines._builtins import MODULES

    registering = {p.stem for p in (ROOT / "baselines").glob("*.py")
                   if "register(Method(" in p.read_text()}
    assert registering == set(MODULES), registering ^ set(MODULES)
    code = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
            "from baselines import registry; "
            "print(' '.join(registry.get(n).fn.__module__ + ':' + n for n in registry.names()))")
    orders = {}
    for first in ("baselines.usp", "baselines.tp", "baselines.registry"):
        out = subprocess.run([sys.executable, "-c", code, first], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
        orders[first] = out
        rank = [MODULES.index(entry.split(":")[0].removeprefix("baselines.")) for entry in out]
        assert rank == sorted(rank) and out[0] == "baselines.burst_method:burst", (first, out)
    assert len({tuple(o) for o in orders.values()}) == 1, orders


def test_a_degree_that_is_the_world_names_the_group_sizes_that_work():
    """Ulysses and TP split heads over the whole group: no option sets their degree, so the
    valid values are group sizes, any that split the heads (the divisors of the world said
    "valid degrees: 1, 2, 4, 8" to 40 heads on 32 ranks, and named no size above the world).
    USP's ulysses_degree is an option: its valid degrees are the world's divisors."""
    def why(name, world, heads, kv_heads, **options):
        with pytest.raises(ValueError) as e:
            registry.get(name).check(world=world, heads=heads, kv_heads=kv_heads,
                                     seq_local=64, causal=True, **options)
        return str(e.value)

    assert why("ulysses", 32, 40, 40).endswith(  # (a kv-heads line alike is not added)
        "ulysses degree (group size) 32 does not divide 40 query heads; valid group sizes: "
        "1, 2, 4, 5, 8, 10, 20, 40")
    assert why("tp", 4, 6, 2).endswith(
        "valid group sizes: 1, 2, 3, 6; tensor-parallel degree (group size) 4 and 2 kv heads: "
        "the degree must divide them; valid group sizes: 1, 2")
    assert why("usp", 8, 6, 6, ulysses_degree=4).endswith(
        "ulysses_degree 4 does not divide 6 query heads; valid degrees: 1, 2")


SCALE = 0.3  # not head_dim ** -0.5 (8 ** -0.5 = 0.354): a method that drops it is caught
SCALED = {"burst": ("burst", dict(backward="burst")),
          "burst-ring": ("burst", dict(backward="ring")),
          "burst-double": ("burst", dict(backward="burst", ranks_per_node=2)),
          "burst-double-ring": ("burst", dict(backward="ring", ranks_per_node=2)),
          "ring": ("ring", {}), "zigzag_ring": ("zigzag_ring", {}),
          "striped_ring": ("striped_ring", {}), "allgather": ("allgather", {}),
          "ulysses": ("ulysses", {}), "double_ring": ("double_ring", dict(ranks_per_node=2)),
          "usp": ("usp", dict(ulysses_degree=2, layout="zigzag")),
          "usp-burst": ("usp", dict(ulysses_degree=2, layout="zigzag", backward="burst"))}


def _softmax_scale_reaches_every_method(rank: int, world: int) -> dict:
    from burst.reference import reference_attention

    g = torch.Generator().manual_seed(11)
    n, h, d = 8 * world, 4, 8
    q, k, v, do = (torch.randn(1, n, h, d, generator=g, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = reference_attention(*leaves, causal=True, scale=SCALE)
    out.backward(do)
    ref = [out.detach(), *(t.grad for t in leaves)]
    errs = {}
    for label, (name, opts) in SCALED.items():
        method = registry.get(name)
        layout = method.layout(opts)
        mine = [shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
        got = method(*mine, causal=True, softmax_scale=SCALE, **opts)
        got.backward(shard(do, layout=layout))
        errs[label] = max(float((a.detach() - shard(w, layout=layout)).abs().max())
                          for a, w in zip((got, *(t.grad for t in mine)), ref, strict=True))
    # the tensor-parallel block: the scale of its local attention
    full = AttentionBlockWeights.random(16, h, h, d, generator=g, dtype=torch.float64)
    x = torch.randn(1, n, 16, generator=g, dtype=torch.float64)
    dy = torch.randn(1, n, 16, generator=g, dtype=torch.float64)
    ref_x = x.clone().requires_grad_()
    y_ref = attention_block_reference(ref_x, full, causal=True, softmax_scale=SCALE)
    y_ref.backward(dy)
    x_loc = shard(x, layout="contiguous").requires_grad_()
    y = tp_attention_block(x_loc, full.shard(rank, world), causal=True, softmax_scale=SCALE)
    y.backward(shard(dy, layout="contiguous"))
    errs["tp"] = max(_rel(y, shard(y_ref.detach(), layout="contiguous")),
                     _rel(x_loc.grad, shard(ref_x.grad, layout="contiguous")))
    return errs


def test_every_method_takes_the_callers_softmax_scale():
    """Every parity case runs at the default scale, where a method (or a backward) that drops
    ``softmax_scale`` and falls back to head_dim ** -0.5 agrees with the oracle: a mutation
    audit found double_ring, usp, ulysses, allgather, the ring family, tp and both ring
    backwards could each ignore it unseen. Here a scale of 0.3, float64, out and dq/dk/dv."""
    for rank, errs in enumerate(spawn(_softmax_scale_reaches_every_method, 4, timeout_s=120)):
        assert len(errs) == len(SCALED) + 1, errs
        bad = {label: e for label, e in errs.items() if not e < 1e-12}
        assert not bad, (rank, bad)
