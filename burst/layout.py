"""Sequence layouts: which global tokens each context-parallel rank holds.

Three layouts (DESIGN.md 3, "Causal load balance"):

- ``contiguous``: rank r holds tokens [r*n, (r+1)*n), n = N/G. Causal work is unbalanced.
- ``zigzag``: the sequence is cut into 2G chunks of c = N/(2G) tokens; rank r holds chunks r and
  2G-1-r (ring-flash-attention's zigzag; Megatron/TransformerEngine's p2p context parallel).
- ``striped``: token t goes to rank t mod G (Striped Attention, Brandon et al. 2023).

With zigzag and striped every ring step after the first does half a block of causal work.

The same layout must be applied to tokens, targets and position ids (the official BurstEngine
training loop shards contiguously while its kernel assumes zigzag, so its loss is not that of a
causal LM). ``shard``/``unshard`` are exact inverses and work on any tensor with a sequence dim.

Names: G = number of ranks (``world``), N = global length, n = N/G local length.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

__all__ = [
    "LAYOUTS",
    "check_layout",
    "chunks_per_rank",
    "divisors",
    "global_positions",
    "heads_problem",
    "plain_integer",
    "length_problem",
    "local_length_problem",
    "local_index",
    "position_runs",
    "shard",
    "unshard",
]

LAYOUTS = ("contiguous", "zigzag", "striped")


def divisors(n: int) -> list[int]:
    """The degrees n splits evenly into, in order (error messages list them as the valid
    values). Trial division up to sqrt(n): a model's width of 2**40 is a million steps, where
    counting to n hung the message of a config with a digit too many."""
    small = [d for d in range(1, math.isqrt(max(n, 0)) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def plain_integer(v):
    """A numpy integer as Python's int (the same count, as burst_attn takes it: double_ring and
    usp refused ranks_per_node=np.int64(2) and named 2 as valid); anything else unchanged."""
    numpy_int = type(v).__module__ == "numpy" and isinstance(v, numbers.Integral)
    return operator.index(v) if numpy_int else v


def heads_problem(heads: int, kv_heads: int) -> str | None:
    """Why ``heads`` query heads cannot attend over ``kv_heads`` kv heads (None: they can); the
    one wording of the rule for burst_attn, the registry, the references and the byte counts."""
    if heads < 1 or kv_heads < 1:
        return f"{heads} query heads and {kv_heads} kv heads: need at least one of each"
    if heads % kv_heads:
        return (f"{heads} query heads are not divisible by {kv_heads} kv heads; valid kv head "
                f"counts: {', '.join(map(str, divisors(heads)))}")
    return None


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; valid layouts: {', '.join(LAYOUTS)}")


def chunks_per_rank(layout: str) -> int:
    """How many equal chunks of the local sequence the layout needs (zigzag: 2)."""
    check_layout(layout)
    return 2 if layout == "zigzag" else 1


def length_problem(seq_len: int, world: int, layout: str) -> str | None:
    """Why ``seq_len`` tokens cannot be split over ``world`` ranks in ``layout`` (None: they
    can); the one wording of the rule for the sharding, the engine, sweeps and scripts."""
    parts = world * chunks_per_rank(layout)
    if seq_len % parts:
        return (f"sequence length {seq_len} is not divisible by {parts} ({layout} layout over "
                f"{world} ranks needs a multiple of {parts}); pad to "
                f"{seq_len + (-seq_len) % parts} or change the world size")
    return None


def local_length_problem(seq_local: int, layout: str) -> str | None:
    """Why a rank's ``seq_local`` tokens cannot be its shard in ``layout`` (None: they can);
    the one wording of the rule for a shard that is already split."""
    parts = chunks_per_rank(layout)
    if seq_local % parts:
        return (f"local sequence length {seq_local} is not divisible by {parts} ({layout} "
                f"layout holds {parts} chunks per rank)")
    return None


def _check_global_len(seq_len: int, world: int, layout: str) -> None:
    if isinstance(world, bool) or not isinstance(world, numbers.Integral) or world < 1:
        raise ValueError(f"world={world!r} must be a whole number of ranks >= 1")
    why = length_problem(seq_len, world, layout)
    if why:
        raise ValueError(why)


def local_index(seq_len: int, world: int, rank: int, layout: str) -> torch.Tensor:
    """Global token indices held by ``rank``, in local order (int64, length N/G)."""
    _check_global_len(seq_len, world, layout)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < world:
        raise ValueError(f"rank={rank!r} must be a whole number in 0..{world - 1} (a group of "
                         f"{world} ranks)")
    n = seq_len // world
    if layout == "contiguous":
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "striped":  # (arange(rank, 0, world) refused an empty sequence past rank 0)
        return torch.arange(n) * world + rank
    c = n // 2
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)
    return torch.cat([first, second])


def global_positions(seq_local: int, world: int, rank: int, layout: str) -> torch.Tensor:
    """Global positions of a rank's local tokens, given the local length (what kernels need)."""
    return local_index(seq_local * world, world, rank, layout)


def position_runs(seq_local: int, world: int, rank: int,
                  layout: str) -> tuple[tuple[int, int], ...]:
    """(first, last) global position of each run of a rank's local tokens, in local order, in
    closed form: one run on the contiguous and striped layouts (striped: every G-th position
    from first to last), two on zigzag. What a test on position ranges needs, without the
    positions themselves (a 64K-token shard's min and max cost milliseconds per pair)."""
    check_layout(layout)
    n = seq_local
    if layout == "contiguous":
        return ((rank * n, rank * n + n - 1),)
    if layout == "striped":
        return ((rank, rank + (n - 1) * world),)
    c = n // 2
    late = 2 * world - 1 - rank
    return ((rank * c, rank * c + c - 1), (late * c, late * c + c - 1))


def _group_info(group) -> tuple[int, int]:
    from burst import comm

    return comm.world_size(group), comm.rank(group)


def _seq_dim(x: torch.Tensor, dim: int, who: str) -> int:
    """``dim`` as a non-negative index of ``x``'s dimensions (an out-of-range one was wrapped
    round, gathering along another dimension)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{who}: dim={dim!r} is not a dimension of a {x.ndim}-dim tensor; "
                         f"valid: {-x.ndim} to {x.ndim - 1}")
    return dim % x.ndim


def shard(x: torch.Tensor, *, layout: str, group=None, dim: int = 1, world: int | None = None,
          rank: int | None = None) -> torch.Tensor:
    """This rank's part of a full-sequence tensor ``x`` (sequence along ``dim``).

    ``world``/``rank`` may be given explicitly (e.g. to shard for another rank, or without an
    initialised process group); otherwise they come from ``group`` (default: the world).
    """
    check_layout(layout)
    if (world is None) != (rank is None):
        raise ValueError(f"shard: give world and rank together (got world={world!r}, "
                         f"rank={rank!r}), or neither to take them from the process group")
    if world is None:
        world, rank = _group_info(group)
    dim = _seq_dim(x, dim, "shard")
    idx = local_index(x.shape[dim], world, rank, layout).to(x.device)
    return x.index_select(dim, idx)


def unshard(x_local: torch.Tensor, *, layout: str, group=None, dim: int = 1) -> torch.Tensor:
    """Gather every rank's shard and restore global token order (inverse of ``shard``).

    Every rank of the group passes a shard of the same shape and dtype, as for ``burst_attn``:
    a mismatch of sizes fails in the transport (gloo aborts the process; NCCL may hang), one
    of shapes alone (the same number of elements) gives a wrong tensor."""
    from burst import comm

    check_layout(layout)
    dim = _seq_dim(x_local, dim, "unshard")  # before the gather: every rank refuses it alike
    world = comm.world_size(group)
    parts = comm.all_gather_list(x_local.contiguous(), group=group)
    full_len = x_local.shape[dim] * world
    out = torch.empty(
        (*x_local.shape[:dim], full_len, *x_local.shape[dim + 1 :]),
        dtype=x_local.dtype,
        device=x_local.device,
    )
    for r, part in enumerate(parts):
        idx = local_index(full_len, world, r, layout).to(x_local.device)
        out.index_copy_(dim, idx, part)
    return out
