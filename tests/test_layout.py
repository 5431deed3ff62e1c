"""Layouts: shard/unshard are exact inverses for every layout and world size (issue 2)."""

from __future__ import annotations

import pytest
import torch

from burst.layout import LAYOUTS, global_positions, local_index, shard, unshard
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


def test_zigzag_and_striped_positions():
    assert local_index(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert local_index(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    assert local_index(8, 2, 1, "striped").tolist() == [1, 3, 5, 7]
    assert local_index(8, 2, 1, "contiguous").tolist() == [4, 5, 6, 7]


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


@pytest.mark.parametrize("world", [3, 4])
def test_shard_unshard_roundtrip_on_ranks(world):
    results = spawn(_roundtrip, world, timeout_s=120)
    assert results == [[]] * world, results
