"""Block plans (``burst.masks.plan_pair``) cover exactly the visible pairs, with bounded masks.

Every (query rank, key rank) pair of every layout is planned under causal, window and document
masks with a tiny ``TILE``, so partly visible blocks are split many times. The calls must be
disjoint, cover exactly the pairs of the dense definition (``MaskSpec.visible``), carry the kind
their sub-block really has, and keep every dense mask within TILE x TILE.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import burst.masks as M
from burst.layout import LAYOUTS, global_positions
from burst.ring import visit_order
from burst.volume import ring_attention_bytes

SPECS = [
    M.MaskSpec(causal=True),
    M.MaskSpec(causal=False),
    M.MaskSpec(causal=True, window=(5, 0)),
    M.MaskSpec(causal=False, window=(3, 2)),
    M.MaskSpec(causal=False, window=(0, 1)),  # key blocks starting exactly at q_hi + right
    M.MaskSpec(causal=False, window=(2, 9)),
    M.MaskSpec(causal=False, window=(9, 0)),  # causal in effect on the diagonal: CAUSAL tiles
    M.MaskSpec(causal=True, cu_seqlens=(0, 5, 17, 18, 32)),
    M.MaskSpec(causal=False, window=(6, 6), cu_seqlens=(0, 11, 32)),
]


def _kind_pattern(kind: str, nq: int, nk: int) -> torch.Tensor:
    rows, cols = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    return {M.FULL: torch.ones(nq, nk, dtype=torch.bool), M.CAUSAL: cols <= rows}[kind]


@pytest.mark.parametrize(("tile", "doc_cut"), [(2, 1), (3, 128), (5, 2), (1024, 1), (1024, 128)])
def test_calls_cover_exactly_the_visible_pairs(monkeypatch, tile, doc_cut):
    monkeypatch.setattr(M, "TILE", tile)
    monkeypatch.setattr(M, "DOC_CUT_MIN", doc_cut)
    world, n, kinds = 4, 8, set()
    for spec in SPECS:
        for layout in LAYOUTS:
            for qr in range(world):
                for kr in range(world):
                    qp = global_positions(n, world, qr, layout)
                    kp = global_positions(n, world, kr, layout)
                    want = spec.visible(qp, kp)
                    got = torch.zeros(n, n, dtype=torch.int64)
                    for c in M.plan_pair(spec, layout, world, qr, kr, n):
                        kinds.add(c.kind)
                        nq, nk = c.q.stop - c.q.start, c.k.stop - c.k.start
                        if c.kind == M.DENSE:
                            assert max(nq, nk) <= tile and c.mask.shape == (nq, nk)
                            assert c.pairs == int(c.mask.sum()) > 0
                            pattern = c.mask
                        else:
                            pattern = _kind_pattern(c.kind, nq, nk)
                        assert torch.equal(pattern, want[c.q, c.k]), (spec, layout, qr, kr, c)
                        assert c.visible_pairs == int(pattern.sum())
                        got[c.q, c.k] += pattern.long()
                    assert torch.equal(got, want.long()), (spec, layout, qr, kr)  # disjoint
    assert kinds == {M.FULL, M.CAUSAL, M.DENSE}


def test_empty_pairs_are_found_without_planning_them():
    """``pair_empty`` (which shortens rings and skips planning) never calls a pair empty that has
    a visible key, and without documents it finds every empty pair of the contiguous and zigzag
    layouts: each chunk of a zigzag rank is tested apart, so a windowed pair of ranks whose
    positions together span the sequence is empty without its key bounds being computed. Given
    arrays of ranks (as ``ring_reach`` does, every pair of a ring at once), it answers the same
    pair by pair."""
    world, n, found = 8, 8, 0
    ranks = np.arange(world)
    for spec in SPECS:
        for layout in LAYOUTS:
            at_once = M.pair_empty(spec, layout, world, ranks[:, None], ranks[None, :], n)
            assert np.shape(at_once) == (world, world)
            for qr in range(world):
                for kr in range(world):
                    visible = bool(spec.visible(global_positions(n, world, qr, layout),
                                                global_positions(n, world, kr, layout)).any())
                    empty = M.pair_empty(spec, layout, world, qr, kr, n)
                    assert isinstance(empty, bool) and empty == at_once[qr, kr], (spec, layout)
                    assert not (empty and visible), (spec, layout, qr, kr)
                    if layout != "striped" and spec.cu_seqlens is None:
                        assert empty == (not visible), (spec, layout, qr, kr)
                        found += empty and layout == "zigzag" and spec.window is not None
    assert found > 0


def test_pairs_of_one_geometry_get_the_same_plan():
    """``plan_pair`` plans one pair per ``pair_geometry`` (each pair of position runs' offset, or
    its sign where the runs see nothing of each other) and hands that plan to every pair of the
    geometry: pair by pair, without the cache, every pair of one geometry has equal calls, on
    every layout, for masks that depend only on the distance from query to key. With
    documents a pair has no geometry (it is planned by its ranks)."""
    def described(calls):
        return [(c.q, c.k, c.kind, c.pairs,
                 None if c.bounds is None else [b.tolist() for b in c.bounds]) for c in calls]

    specs = [s for s in SPECS if s.cu_seqlens is None] + [
        M.MaskSpec(causal=True, window=(12, 0)), M.MaskSpec(causal=False, window=(20, 1)),
        M.MaskSpec(causal=True, window=(1, 0)),
        # long windows: most pairs of runs see all of each other (span_full's mark)
        M.MaskSpec(causal=True, window=(30, 0)), M.MaskSpec(causal=False, window=(25, 33)),
        M.MaskSpec(causal=True, window=(1000, 0)), M.MaskSpec(causal=False, window=(47, 47))]
    shared = 0
    for spec in specs:
        for layout in LAYOUTS:
            for world, n in ((8, 4), (6, 8)):
                plans = {}
                for qr in range(world):
                    for kr in range(world):
                        geometry = M.pair_geometry(spec, layout, world, qr, kr, n)
                        plan = described(M._plan(spec, layout, world, qr, kr, n, M.TILE,
                                                 M.DOC_CUT_MIN))
                        first = plans.setdefault(geometry, (plan, qr, kr))
                        assert plan == first[0], (spec, layout, world, (qr, kr), first[1:])
                        shared += first[1:] != (qr, kr)
    assert shared > 1000  # most pairs share a geometry with another
    assert M.pair_geometry(SPECS[-1], "zigzag", 8, 1, 2, 4) is None


def test_a_window_of_the_whole_sequence_has_the_geometries_of_no_window():
    """Runs that see all of each other share one mark whatever their offset (``span_full``):
    with a window spanning the sequence a causal zigzag ring of 64 ranks has three geometries
    (each rank's own pair, earlier and later key ranks) where the offsets made all 4096 pairs
    distinct (the simulator planned every one: 4 s at 128 ranks, 0.1 s without a window),
    and a half-sequence window a handful. The marks are sufficient tests: a pair marked full
    sees every key, one marked empty none."""
    g, n = 64, 8
    ranks = np.arange(g)
    q, k = np.repeat(ranks, g), np.tile(ranks, g)
    for window, most in (((g * n, 0), 3), ((g * n // 2, 0), 8)):
        spec = M.MaskSpec(causal=True, window=window)
        rows = M.pair_geometry(spec, "zigzag", g, q, k, n)
        assert len(np.unique(rows, axis=0)) <= most, window
    spec, marked = M.MaskSpec(causal=False, window=(40, 9)), 0
    for layout in LAYOUTS:
        for qr in range(8):
            for kr in range(8):
                qp, kp = (global_positions(n, 8, r, layout) for r in (qr, kr))
                seen = spec.visible(qp, kp)
                offsets, empty, full = M._run_pairs(spec, layout, 8, qr, kr, n, full=True)
                runs = M._run_table(layout, 8, n)
                for i, (a, b) in enumerate((a, b) for a in runs[qr] for b in runs[kr]):
                    block = seen[(qp >= a[0]) & (qp <= a[1])][:, (kp >= b[0]) & (kp <= b[1])]
                    assert not (full[i] and not block.all()), (layout, qr, kr, i)
                    assert not (empty[i] and block.any()), (layout, qr, kr, i)
                    marked += bool(full[i])
    assert marked > 100  # (contiguous 30, zigzag 130 of their runs' pairs)
    with pytest.raises(ValueError, match="documents"):
        M.MaskSpec(causal=True, cu_seqlens=(0, 4, 8)).span_full(0, 1, 0, 1)


def test_a_rank_outside_the_world_is_refused_not_wrapped():
    """Plans are cached by geometry, which indexes ranks: rank -1 was taken for rank G-1, and
    its plan, built for -1, was then handed to the pair (G-1, k) (a review: a windowed
    block's keys dropped). Ranks outside 0..G-1, bools and floats are refused."""
    spec = M.MaskSpec(causal=True, window=(4, 0))
    want = M.plan_pair(spec, "contiguous", 4, 3, 2, 8)
    assert want
    for bad in (-1, 4, True, 1.0, np.array([0, 4])):
        with pytest.raises(ValueError, match="expected ranks 0 .. 3 of a world of 4"):
            M.pair_geometry(spec, "contiguous", 4, bad, 2, 8)
        with pytest.raises(ValueError, match="expected ranks 0 .. 3"):
            M.pair_empty(spec, "contiguous", 4, 2, bad, 8)
    with pytest.raises(ValueError, match="q_rank=-1"):
        M.plan_pair(spec, "contiguous", 4, -1, 2, 8)
    assert M.plan_pair(spec, "contiguous", 4, 3, 2, 8) == want
    docs = M.MaskSpec(cu_seqlens=(0, 5, 32))  # any argument may be the array
    assert docs.span_empty(0, np.array([3, 9]), 10, 12).tolist() == [True, False]


def test_large_windowed_blocks_plan_without_large_masks():
    """A 64K-token windowed block: the visible bulk in mask-free calls, only the band's edges
    dense, each at most TILE x TILE (a single mask would be 4 GiB)."""
    n, spec = 1 << 16, M.MaskSpec(causal=True, window=(4096, 0))
    calls = M.plan_pair(spec, "contiguous", 4, 1, 1, n)
    dense = [c for c in calls if c.kind == M.DENSE]
    assert all(c.q.stop - c.q.start <= M.TILE and c.k.stop - c.k.start <= M.TILE for c in dense)
    total = sum(c.visible_pairs for c in calls)
    assert total == int(spec.visible_counts(torch.arange(n), torch.arange(n)).sum())
    assert sum(c.pairs for c in dense) < 0.3 * total


def test_documents_are_cut_at_their_boundaries():
    """Random document lengths (mean 300) in 16K tokens, on every layout: the splits follow
    document starts, so whole documents meet in causal calls and few pairs are left to dense
    tiles (on the striped layout only after cropping: a document's keys start one index off)."""
    n = 1 << 14
    cuts = torch.randint(1, n, (n // 300,), generator=torch.Generator().manual_seed(0))
    spec = M.MaskSpec(causal=True, cu_seqlens=(0, *sorted(set(cuts.tolist())), n))
    for layout, world in (("contiguous", 1), ("zigzag", 4), ("striped", 4)):
        total = dense = 0
        for q in range(world):
            for k in range(world):
                calls = M.plan_pair(spec, layout, world, q, k, n // world)
                total += sum(c.visible_pairs for c in calls)
                dense += sum(c.pairs for c in calls if c.kind == M.DENSE)
        assert total == int(spec.visible_counts(torch.arange(n), torch.arange(n)).sum())
        assert dense < 0.1 * total, layout


def test_empty_documents_change_nothing():
    """A repeated boundary (an empty document: flash-attention's varlen takes them, and
    TransformerEngine pads cu_seqlens with them) was refused; it is dropped, so attention, the
    engine's positions and targets are those of the boundaries without repeats."""
    from burst.emulate import emulate_attn
    from burst.engine import data

    padded, plain = (0, 0, 5, 5, 5, 21, 32, 32), (0, 5, 21, 32)
    assert M.MaskSpec(causal=True, cu_seqlens=padded).cu_seqlens == plain
    assert M.MaskSpec(cu_seqlens=torch.tensor(padded)).cu_seqlens == plain
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 32, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    a, b = (emulate_attn(q, k, v, world=4, causal=True, layout="zigzag", cu_seqlens=cu)
            for cu in (padded, plain))
    assert torch.equal(a, b)
    kw = dict(seq_len=32, batch=1, seed=0, vocab=64, layout="zigzag", world=4, rank=1)
    assert all(torch.equal(x, y) for x, y in zip(data.local_batch(cu_seqlens=padded, **kw),
                                                  data.local_batch(cu_seqlens=plain, **kw),
                                                  strict=True))


def test_plan_cache_is_bounded_by_bytes_and_entries():
    """Packed batches bring a new spec every step: the cache must not grow with the steps,
    whether the plans hold key bounds or nothing at all (empty or mask-free plans)."""
    lo = torch.zeros(1000, dtype=torch.int32)
    dense = (M.Call(slice(0, 1000), slice(0, 1000), M.DENSE, (lo, lo + 1), 1000),)
    made = []

    def spec(i):
        return M.MaskSpec(causal=True, cu_seqlens=(0, i + 1, 10**6))

    by_bytes = M._PlanCache(budget=5 * M._PlanCache.nbytes((spec(0),), dense), entries=100)
    for i in range(20):
        by_bytes.get((spec(i),), lambda i=i: made.append(i) or dense)
    assert len(by_bytes.plans) == 5 and by_bytes.used <= by_bytes.budget
    by_bytes.get((spec(19),), lambda: made.append(-1) or dense)  # still cached: not made again
    assert made == list(range(20))
    by_count = M._PlanCache(budget=1 << 30, entries=7)
    for i in range(50):
        by_count.get((spec(i),), tuple)  # empty plans
    assert len(by_count.plans) == 7


def test_plans_depend_on_the_tile_sizes():
    """Tile sizes are part of the cache key: a test or a benchmark that changes them gets plans
    made with the new sizes."""
    spec = M.MaskSpec(causal=True, cu_seqlens=(0, 300, 700, 2048))
    coarse = M.plan_pair(spec, "contiguous", 1, 0, 0, 2048)
    try:
        M.DOC_CUT_MIN = 1 << 20
        M.TILE = 4096
        assert len(M.plan_pair(spec, "contiguous", 1, 0, 0, 2048)) == 1  # one dense call
    finally:
        M.DOC_CUT_MIN, M.TILE = 128, 1024
    assert [c.kind for c in coarse] == [M.CAUSAL] * 3


def test_a_window_that_spans_the_sequence_is_a_plain_call(monkeypatch):
    """Ulysses' and TP's whole-sequence attention: a window whose sides reach N - 1 masks
    nothing, so it runs the plain causal call (it was tiled, with fp32 gradient buffers: 30% more
    memory in the simulator's count); one token shorter it is tiled. The simulator counts the
    same (suites/memory_model.py)."""
    import baselines.local_attention as la
    from suites.hardware import load
    from suites.simulate import predict

    def tiled(*_):
        raise AssertionError("tiled")

    n = 16
    q, k, v = (torch.randn(1, n, 2, 4, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    plain = la.local_attention(q, k, v, spec=M.MaskSpec(causal=True), scale=0.5)
    monkeypatch.setattr(la, "_one_rank", tiled)
    for window in ((n - 1, 0), (n, 3), (2**40, 0)):
        spanned = la.local_attention(q, k, v, spec=M.MaskSpec(causal=True, window=window),
                                     scale=0.5)
        assert torch.equal(spanned, plain), window
        spanned.sum().backward()  # the backward too runs no tile
    with pytest.raises(AssertionError, match="tiled"):
        la.local_attention(q, k, v, spec=M.MaskSpec(causal=True, window=(n - 2, 0)), scale=0.5)
    assert M.MaskSpec(causal=False, window=(n - 1, n - 2)).over(n).window == (n - 1, n - 2)

    cell = dict(workload="attention", method="ulysses", heads=32, kv_heads=8, head_dim=128,
                world=4, ranks_per_node=4, seq_len=16384)
    mem = {w: predict(dict(cell, window=w), load("a800")).memory.reserved
           for w in (None, (16383, 0), (16382, 0))}
    assert mem[(16383, 0)] == mem[None] < mem[(16382, 0)]


def test_only_a_flat_ring_is_shortened_by_a_window():
    """A window on the contiguous layout ends a flat ring after ceil(left / n) steps; a double
    ring (nodes > 1) visits every block, and refuses a shorter span instead of ignoring it."""
    spec = M.MaskSpec(causal=True, window=(100, 0))
    assert M.ring_reach(spec, "contiguous", 8, 64) == (2, 0)
    assert M.ring_reach(spec, "contiguous", 8, 64, nodes=2) == (7, 0)
    assert visit_order(8, 5, span=2) == [5, 4, 3]
    assert len(visit_order(8, 5, nodes=2, span=7)) == 8
    with pytest.raises(ValueError, match="a double ring visits all 8 blocks"):
        visit_order(8, 5, nodes=2, span=2)


@pytest.mark.parametrize("world", [4, 8])
def test_a_window_with_keys_on_both_sides_sends_the_ring_both_ways(world):
    """ring_reach's (span, back) covers every ring offset at which some rank needs keys, with
    the fewest hops (brute force over every split), and keeps the one-way ring on a tie. A causal
    window of at most a zigzag chunk needs the ranks on either side, 1 + 1 hops instead of G-1
    (it sent every hop before); a window reaching only right goes the other way alone."""
    n = 16  # zigzag chunks of 8 tokens
    cases = [(True, (3, 0)), (True, (8, 0)), (True, (12, 0)), (False, (0, 20)), (False, (20, 4)),
             (False, (3, 2)), (True, (100, 0)), (True, None)]
    for layout in LAYOUTS:
        for causal, window in cases:
            spec = M.MaskSpec(causal=causal, window=window)
            span, back = M.ring_reach(spec, layout, world, n)
            needed = {s for s in range(1, world) for i in range(world)
                      if not M.pair_empty(spec, layout, world, i, (i - s) % world, n)}
            assert all(s <= span or world - s <= back for s in needed), (layout, window)
            fewest = min([max(needed, default=0)] + [
                max([s for s in needed if s < cut], default=0)
                + max([world - s for s in needed if s >= cut], default=0)
                for cut in range(1, world)])
            assert span + back == fewest, (layout, window, span, back)
            assert back == 0 or span + back < max(needed), (layout, window)  # ties: one way
            order = visit_order(world, 0, span=span, back=back)
            assert sorted(order) == sorted({0, *((-s) % world for s in range(1, span + 1)),
                                            *(range(1, back + 1))}), order
    docs = M.MaskSpec(causal=True, cu_seqlens=tuple(range(0, world * n, 12)) + (world * n,))
    assert M.ring_reach(docs, "zigzag", world, n) == (1, 1)  # documents of 12 < chunks of 8 + 8
    assert M.ring_reach(docs, "contiguous", world, n) == (1, 0)
    zigzag = M.MaskSpec(causal=True, window=(8, 0))
    assert M.ring_reach(zigzag, "zigzag", world, n) == (1, 1)
    assert M.ring_reach(zigzag, "zigzag", world, n, nodes=2) == (world - 1, 0)
    right = M.MaskSpec(causal=False, window=(0, 20))
    assert M.ring_reach(right, "contiguous", world, n) == (0, 2)
    assert visit_order(world, 1, span=1, back=2) == [1, 0, 2, 3]
    with pytest.raises(ValueError, match="a double ring visits all"):
        visit_order(world, 1, nodes=2, back=1)
    with pytest.raises(ValueError, match="visits each block at most once"):
        visit_order(world, 0, back=1)  # the full span one way and a hop back: block 1 twice
    with pytest.raises(ValueError, match="visits each block at most once"):
        ring_attention_bytes(world=world, batch=1, seq_local=n, heads=1, kv_heads=1,
                             head_dim=8, elem=2, span=world - 2, back=2)


def test_a_window_that_a_flat_ring_serves_in_fewer_steps_than_nodes_runs_flat():
    """A double ring sends every block, across nodes from every GPU at once; where the mask
    lets a flat ring bring every rank its keys in at most M - 1 steps each way (M nodes), the
    ring runs flat (burst_attn, the emulation, the byte formulas and the simulator agree;
    test_simulator prices the rule, and one step more)."""
    n = 16  # zigzag chunks of 8
    near = M.MaskSpec(causal=True, window=(8, 0))  # zigzag: 1 + 1 hops
    assert M.ring_reach(near, "zigzag", 16, n) == (1, 1)
    assert M.flat_ring_suffices(near, "zigzag", 16, n, nodes=4)  # 1 <= M - 1 = 3
    assert M.flat_ring_suffices(near, "zigzag", 16, n, nodes=8)  # 1 <= 7 (2 ranks a node)
    assert M.flat_ring_suffices(near, "zigzag", 16, n, nodes=2)  # 1 <= 1
    assert not M.flat_ring_suffices(near, "zigzag", 16, n, nodes=1)  # already flat
    assert not M.flat_ring_suffices(M.MaskSpec(causal=True), "zigzag", 16, n, nodes=4)
    far = M.MaskSpec(causal=True, window=(40, 0))  # contiguous: 3 hops back
    assert M.ring_reach(far, "contiguous", 16, n) == (3, 0)
    assert M.flat_ring_suffices(far, "contiguous", 16, n, nodes=4)  # 3 <= 3
    assert M.flat_ring_suffices(far, "contiguous", 16, n, nodes=8)
    assert not M.flat_ring_suffices(far, "contiguous", 16, n, nodes=2)  # 3 > 1
    farther = M.MaskSpec(causal=True, window=(56, 0))  # 4 hops: one step more than 4 nodes
    assert M.ring_reach(farther, "contiguous", 16, n) == (4, 0)
    assert not M.flat_ring_suffices(farther, "contiguous", 16, n, nodes=4)
    assert not M.flat_ring_suffices(far, "striped", 16, n, nodes=4)  # every rank needed
    # a right-only window steps back alone: B, not S, is what the bound counts (a review: the
    # rule with S alone sent (0, 16384) at 32K tokens on 4 nodes of 8 flat, 1.7x slower)
    right = M.MaskSpec(causal=False, window=(0, 40))
    assert M.ring_reach(right, "contiguous", 16, n) == (0, 3)
    assert M.flat_ring_suffices(right, "contiguous", 16, n, nodes=4)  # 3 <= 3
    assert not M.flat_ring_suffices(right, "contiguous", 16, n, nodes=2)  # 3 > 1


def test_a_models_window_is_one_pair_or_one_entry_per_layer():
    """``layer_windows``: None, one pair for every layer (its sides as ints, inf unbounded),
    or one entry per layer; anything else is refused with what was given."""
    from burst.masks import layer_windows, model_window

    assert layer_windows(None, 2) == (None, None)
    assert layer_windows((np.int64(3), 0.0), 2) == ((3, 0), (3, 0))
    assert layer_windows((math.inf, 0), 1) == ((1 << 40, 0),)
    assert layer_windows([[3, 0], None, (np.int64(1), 2)], 3) == ((3, 0), None, (1, 2))
    assert layer_windows(np.array([[3, 0], [5, 0]]), 2) == ((3, 0), (5, 0))
    assert model_window([(3, 0), [3, 0]], 2) == (3, 0)
    assert model_window([None, None], 2) is None
    for bad in ([(3, 0)], [(3, 0), None, None], [3, None], [(3, 0), (1, 2, 3)],
                [(3, 0), (-1, 0)], "ab", {3, 0}, [{3, 0}, None], 3):
        with pytest.raises(ValueError, match=re.escape(f"window={bad!r}: expected")):
            layer_windows(bad, 2)
