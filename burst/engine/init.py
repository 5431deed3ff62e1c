"""The engine's deterministic weight init, drawn shard by shard.

A matrix's normal(0, std) draw is cut into blocks of whole rows (``INIT_BLOCK`` elements or
one row, whichever is more); block ``b`` of parameter ``name`` comes from its own fp32 CPU
generator, seeded with a hash of (seed, name, b). Any range of rows is therefore drawn alone,
and equals the same rows of the whole draw, so

- a rank of a sharded model (FSDP's ``Shard(0)``) draws only the blocks its rows touch: at
  G ranks about 1/G of the model instead of all of it (the whole 7B model is ~6.5e9 normal
  draws, tens of seconds of one host core per rank);
- every rank, device, dtype and world size holds the values of the one model built whole
  (a CUDA generator's draws depend on the device, so draws stay on the host).
"""

from __future__ import annotations

import hashlib
import math

import torch

__all__ = ["INIT_BLOCK", "init_rows", "local_rows"]

INIT_BLOCK = 1 << 20  # elements per independently seeded block (4 MiB of fp32)


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def init_rows(name: str, shape: tuple[int, ...], seed: int, std: float, start: int, stop: int,
              *, block: int = INIT_BLOCK) -> torch.Tensor:
    """Rows ``[start, stop)`` (along dim 0) of parameter ``name``'s normal(0, ``std``) init of
    ``shape``, fp32 on the host, drawing only the blocks of rows they touch."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError(f"init_rows: {name} is a scalar; only tensors of 1+ dims are drawn")
    rows = shape[0]
    if not 0 <= start <= stop <= rows:
        raise ValueError(f"init_rows: rows [{start}, {stop}) of {name}, which has {rows}")
    per = max(1, block // max(1, math.prod(shape[1:])))  # rows per block
    out = torch.empty((stop - start, *shape[1:]))
    if start == stop:
        return out
    for b in range(start // per, -(-stop // per)):
        lo, hi = b * per, min((b + 1) * per, rows)
        g = torch.Generator().manual_seed(_block_seed(seed, name, b))
        drawn = torch.randn((hi - lo, *shape[1:]), generator=g)
        a, z = max(lo, start), min(hi, stop)
        out[a - start:z - start] = drawn[a - lo:z - lo]
    return out.mul_(std)


def local_rows(param: torch.Tensor) -> tuple[int, int] | None:
    """The rows ``[start, stop)`` of the whole parameter that this rank holds: all of them for a
    plain tensor; for a DTensor sharded along dim 0 (``Shard(0)`` on any mesh dims, the rest
    ``Replicate``: FSDP's and HSDP's layouts) its own chunk, cut as ``torch.chunk`` cuts (ceil
    sizes, trailing ranks possibly empty), mesh dim by mesh dim. None for any other placement
    (the caller then draws the whole and lets DTensor slice it)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    rows = param.shape[0]
    if not isinstance(param, DTensor):
        return 0, rows
    start, size = 0, rows
    coords = param.device_mesh.get_coordinate()
    if coords is None:  # this rank is not in the mesh: it holds nothing
        return 0, 0
    for dim, placement in enumerate(param.placements):
        if isinstance(placement, Replicate):
            continue
        if not (isinstance(placement, Shard) and placement.dim == 0
                and type(placement) is Shard):
            return None
        n, c = param.device_mesh.size(dim), coords[dim]
        chunk = -(-size // n)
        lo = min(c * chunk, size)
        start, size = start + lo, min(chunk, size - lo)
    return start, start + size

