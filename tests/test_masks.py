"""Block plans (``burst.masks.plan_pair``) cover exactly the visible pairs, with bounded masks.

Every (query rank, key rank) pair of every layout is planned under causal, window and document
masks with a tiny ``TILE``, so partly visible blocks are split many times. The calls must be
disjoint, cover exactly the pairs of the dense definition (``MaskSpec.visible``), carry the kind
their sub-block really has, and keep every dense mask within TILE x TILE.
"""

from __future__ import annotations

import pytest
import torch

import burst.masks as M
from burst.layout import LAYOUTS, global_positions

SPECS = [
    M.MaskSpec(causal=True),
    M.MaskSpec(causal=False),
    M.MaskSpec(causal=True, window=(5, 0)),
    M.MaskSpec(causal=False, window=(3, 2)),
    M.MaskSpec(causal=False, window=(9, 0)),  # causal in effect on the diagonal: CAUSAL tiles
    M.MaskSpec(causal=True, cu_seqlens=(0, 5, 17, 18, 32)),
    M.MaskSpec(causal=False, window=(6, 6), cu_seqlens=(0, 11, 32)),
]


def _kind_pattern(kind: str, nq: int, nk: int) -> torch.Tensor:
    rows, cols = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    return {M.FULL: torch.ones(nq, nk, dtype=torch.bool), M.CAUSAL: cols <= rows,
            M.STRICT: cols < rows}[kind]


def _pairs(c: M.Call) -> int:
    if c.kind == M.DENSE:
        return c.pairs
    nq, nk = c.q.stop - c.q.start, c.k.stop - c.k.start
    return int(_kind_pattern(c.kind, nq, nk).sum())


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
                        got[c.q, c.k] += pattern.long()
                    assert torch.equal(got, want.long()), (spec, layout, qr, kr)  # disjoint
    assert kinds == {M.FULL, M.CAUSAL, M.STRICT, M.DENSE}


def test_large_windowed_blocks_plan_without_large_masks():
    """A 64K-token windowed block: the visible bulk in mask-free calls, only the band's edges
    dense, each at most TILE x TILE (a single mask would be 4 GiB)."""
    n, spec = 1 << 16, M.MaskSpec(causal=True, window=(4096, 0))
    calls = M.plan_pair(spec, "contiguous", 4, 1, 1, n)
    dense = [c for c in calls if c.kind == M.DENSE]
    assert all(c.q.stop - c.q.start <= M.TILE and c.k.stop - c.k.start <= M.TILE for c in dense)
    total = sum(_pairs(c) for c in calls)
    assert total == int(spec.visible_counts(torch.arange(n), torch.arange(n)).sum())
    assert sum(c.pairs for c in dense) < 0.3 * total


def test_documents_are_cut_at_their_boundaries():
    """Random document lengths (mean 300) in 16K tokens: the splits follow document starts, so
    whole documents meet in causal calls and few pairs are left to dense tiles."""
    n = 1 << 14
    cuts = torch.randint(1, n, (n // 300,), generator=torch.Generator().manual_seed(0))
    spec = M.MaskSpec(causal=True, cu_seqlens=(0, *sorted(set(cuts.tolist())), n))
    calls = M.plan_pair(spec, "contiguous", 1, 0, 0, n)
    total = int(spec.visible_counts(torch.arange(n), torch.arange(n)).sum())
    assert sum(_pairs(c) for c in calls) == total
    assert sum(c.pairs for c in calls if c.kind == M.DENSE) < 0.1 * total


def test_plan_cache_is_bounded_by_bytes():
    cache, made = M._PlanCache(budget=3 * 2 * 4 * 16), []

    def make(i):
        made.append(i)
        lo = torch.zeros(16, dtype=torch.int32)
        return (M.Call(slice(0, 16), slice(0, 16), M.DENSE, (lo, lo + 1), 16),)

    for i in range(10):
        cache.get(i, lambda i=i: make(i))
    assert cache.used <= cache.budget and len(cache.plans) == 3
    cache.get(9, lambda: make(99))  # still cached: not made again
    assert made == list(range(10))
