"""The data path of a context-parallel step: each rank makes its own shard, never the sequence.

Tokens, targets and position ids are all taken at the global token indices this rank holds in
the attention method's layout (``burst.layout.local_index``, the index form of
``burst.layout.shard``), so the three stay aligned under every layout; the official BurstEngine
loop shards them contiguously while its kernel assumes zigzag (DESIGN.md 3).

Synthetic tokens are a pure function of (seed, sequence id, global position), a small
counter-based hash, so a rank computes its tokens and their next-token targets without the rest
of the sequence and without communication. They come in runs of ``RUN`` equal tokens: a model
can learn to predict most of them (the loss of a training run visibly goes down) while the run
starts stay random.

Targets are the next token; the last token of the sequence (and of every document, with
``cu_seqlens``) has no visible next token and gets ``ignore_index``. With documents, position ids
restart at every document start, as for packed sequences.

Shapes: (batch, local tokens), int64.
"""

from __future__ import annotations

import torch

from burst.layout import local_index, shard
from burst.masks import MaskSpec

__all__ = ["RUN", "local_batch", "shard_batch", "synthetic_tokens"]

RUN = 4
_M = 2**31 - 1  # Park-Miller modulus: every product below stays inside int64


def synthetic_tokens(seq_ids_B: torch.Tensor, pos_T: torch.Tensor, *, vocab: int, seed: int,
                     run: int = RUN) -> torch.Tensor:
    """Token ids (B, T) at global positions ``pos_T`` of sequences ``seq_ids_B``."""
    block = pos_T.to(torch.int64) // run
    x = ((seed % _M) * 1_000_003 + seq_ids_B.to(torch.int64)[:, None] * 7_919
         + block[None, :] * 104_729 + 12_345) % _M
    for _ in range(3):
        x = (x * 48_271) % _M
        x = x ^ (x >> 13)
    return x % vocab


def _doc_starts(pos_T: torch.Tensor, cu_seqlens) -> torch.Tensor:
    cu = torch.tensor([int(c) for c in cu_seqlens], dtype=torch.int64)
    return cu[torch.searchsorted(cu, pos_T, right=True) - 1]


def local_batch(*, seq_len: int, batch: int, seed: int, vocab: int, layout: str, world: int,
                rank: int, seq_offset: int = 0, cu_seqlens=None, ignore_index: int = -100):
    """(tokens, targets, positions) of this rank's shard, each (batch, seq_len / world).

    ``seq_offset`` numbers the sequences of this rank's batch (data-parallel replicas take
    different sequences). ``cu_seqlens``: document boundaries 0 .. seq_len, as every mask
    takes them (``burst.masks.MaskSpec``; [1, 8, 16] gave position -16, a review)."""
    if cu_seqlens is not None:
        docs = MaskSpec(causal=True, cu_seqlens=cu_seqlens)
        docs.check_length(seq_len)
        cu_seqlens = docs.cu_seqlens
    idx = local_index(seq_len, world, rank, layout)
    seq_ids = torch.arange(batch) + seq_offset
    tokens = synthetic_tokens(seq_ids, idx, vocab=vocab, seed=seed)
    nxt = idx + 1
    targets = synthetic_tokens(seq_ids, nxt, vocab=vocab, seed=seed)
    no_next = nxt >= seq_len
    positions = idx
    if cu_seqlens is not None:
        ends = torch.tensor([int(c) for c in cu_seqlens[1:]], dtype=torch.int64)
        no_next = no_next | torch.isin(nxt, ends)
        positions = idx - _doc_starts(idx, cu_seqlens)
    targets[:, no_next] = ignore_index
    return tokens, targets, positions.expand(batch, -1).clone()


def shard_batch(tokens_BN: torch.Tensor, targets_BN: torch.Tensor, positions_BN: torch.Tensor,
                *, layout: str, group=None):
    """This rank's shard of full-sequence (tokens, targets, positions), e.g. from a data loader
    that reads whole sequences: the same layout for all three."""
    return tuple(shard(t, layout=layout, group=group, dim=1)
                 for t in (tokens_BN, targets_BN, positions_BN))
