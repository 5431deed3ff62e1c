"""Layouts: shard/unshard are exact inverses for every layout and world size (issue 2)."""

from __future__ import annotations

import pytest
import torch

from burst.layout import (
    LAYOUTS,
    divisors,
    global_positions,
    local_index,
    position_runs,
    shard,
    unshard,
)
from burst.spawn import spawn


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_local_indices_partition_the_sequence(layout, world):
    n = 4 * world
    parts = [local_index(n, world, r, layout) for r in range(world)]
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(n))
    for r, p in enumerate(parts):
        assert torch.equal(p, global_positions(n // world, world, r, layout))
        x = torch.arange(n).view(1, n) * 10
        assert torch.equal(shard(x, layout=layout, world=world, rank=r), p.view(1, -1) * 10)
        runs = position_runs(n // world, world, r, layout)  # the runs, each in local order
        step = world if layout == "striped" else 1
        assert torch.equal(p, torch.cat([torch.arange(a, b + 1, step) for a, b in runs]))
        # an empty sequence: an empty shard on every layout (striped raised torch's "upper
        # bound and lower bound inconsistent with step sign" past rank 0: an audit)
        empty = shard(torch.zeros(1, 0, 2), layout=layout, world=world, rank=r)
        assert empty.shape == (1, 0, 2) and local_index(0, world, r, layout).dtype == torch.int64


def test_zigzag_and_striped_positions():
    assert local_index(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert local_index(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    assert local_index(8, 2, 1, "striped").tolist() == [1, 3, 5, 7]
    assert local_index(8, 2, 1, "contiguous").tolist() == [4, 5, 6, 7]


def _causal_pairs(layout: str, world: int, q_rank: int, k_rank: int, n: int) -> int:
    """Causal (query, key) pairs between two ranks' shards: the work of one ring step."""
    qp = global_positions(n, world, q_rank, layout)
    kp = global_positions(n, world, k_rank, layout)
    return int((qp[:, None] >= kp[None, :]).sum())


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_and_striped_balance_every_ring_step(world):
    """At ring step s rank r attends to the keys of rank r - s: with zigzag every rank has the
    same causal work at every step (steps after the first: n^2/2 pairs each), with striped the
    same up to the diagonal (n(n+1)/2 or n(n-1)/2 pairs); contiguous leaves `step` ranks idle
    (ranks 0..step-1, whose keys come from ranks after them)."""
    n = 8
    for step in range(1, world):
        work = {lay: [_causal_pairs(lay, world, r, (r - step) % world, n) for r in range(world)]
                for lay in LAYOUTS}
        assert work["zigzag"] == [n * n // 2] * world
        assert set(work["striped"]) <= {n * (n + 1) // 2, n * (n - 1) // 2}
        assert sum(w == 0 for w in work["contiguous"]) == step  # ranks below the source idle
    # the first step (a rank's own shard) is balanced too, but not equal to the others
    for lay in ("zigzag", "striped"):
        assert len({_causal_pairs(lay, world, r, r, n) for r in range(world)}) == 1


def test_divisors_in_order_and_fast_for_a_width_of_two_to_the_forty():
    """The valid degrees that messages list: every divisor, in order, found up to sqrt(n) (a
    count to n hung a ModelConfig message for a width of 2**40)."""
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    assert divisors(0) == divisors(-4) == []  # (a message's list of none, not isqrt's error)
    assert divisors(2**40) == [2**k for k in range(41)]


def test_bad_layout_and_length():
    with pytest.raises(ValueError, match="unknown layout 'spiral'"):
        local_index(8, 2, 0, "spiral")
    with pytest.raises(ValueError, match="not divisible by 8"):
        local_index(12, 4, 0, "zigzag")
    # striped deals single tokens round-robin: any multiple of the ranks (zigzag needs 2G)
    assert local_index(6, 2, 0, "striped").tolist() == [0, 2, 4]


def _roundtrip(rank: int, world: int) -> list[str]:
    failures = []
    g = torch.Generator().manual_seed(1)
    n = 4 * world
    tensors = {
        "tokens": torch.randint(0, 1000, (2, n), generator=g),
        "positions": torch.arange(n).expand(2, n).contiguous(),
        "acts": torch.randn(2, n, 3, 5, generator=g),
        "lse_BHS": torch.randn(2, 3, n, generator=g),
    }
    dims = {"tokens": 1, "positions": 1, "acts": 1, "lse_BHS": -1}
    for layout in LAYOUTS:
        for name, x in tensors.items():
            loc = shard(x, layout=layout, dim=dims[name])
            back = unshard(loc, layout=layout, dim=dims[name])
            if not torch.equal(back, x):
                failures.append(f"{layout} {name}: unshard(shard(x)) != x")
    return failures


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_shard_unshard_roundtrip_on_ranks(world):
    results = spawn(_roundtrip, world, timeout_s=120)
    assert results == [[]] * world, results
