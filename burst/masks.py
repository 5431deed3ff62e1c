"""Masks between one rank's queries and another rank's keys, as a plan of kernel calls.

A ring step pairs the queries of one rank with the keys of another. Depending on the layout and
on the mask (causal, sliding window, documents) the pair is fully visible, causal on the
diagonal, strictly causal (striped layout, keys from a later rank), partly masked, or fully
masked. ``plan_pair`` turns the pair into a list of ``Call``s on slices of the local sequences so
that fully masked work is skipped, not masked (DESIGN.md 3): a fully masked pair gives no call at
all, and zigzag's half-masked pairs become one call on half of Q or half of K.

Positions are global token indices (``burst.layout``). A query at position p sees a key at k when
  causal:   k <= p
  window:   p - left <= k <= p + right     (``window=(left, right)``, both >= 0)
  document: doc(k) == doc(p)              (``cu_seqlens`` = global document boundaries)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from burst.layout import check_layout, global_positions

__all__ = ["FULL", "CAUSAL", "STRICT", "DENSE", "Call", "MaskSpec", "plan_pair", "ring_span"]

FULL = "full"  # every query sees every key
CAUSAL = "causal"  # square block, query a sees key b iff b <= a (top-left aligned)
STRICT = "strict"  # square block, query a sees key b iff b < a
DENSE = "dense"  # explicit boolean mask (True = visible)


@dataclass(frozen=True)
class MaskSpec:
    """What each query may attend to, in global positions."""

    causal: bool = False
    """Keys after the query are masked."""
    window: tuple[int, int] | None = None
    """(left, right) sliding window: keys in [p - left, p + right] are visible."""
    cu_seqlens: tuple[int, ...] | None = None
    """Document boundaries [0, e1, ..., N] of packed sequences; attention stays in a document.
    Any sequence of ints (a list, a tensor) is accepted and stored as a tuple."""

    def __post_init__(self):
        if self.window is not None:
            if len(self.window) != 2 or min(self.window) < 0:
                raise ValueError(
                    f"window={self.window!r}: expected (left, right) with both >= 0 tokens"
                )
            # no sequence is longer than 2**40 tokens: a larger side means "unbounded", and
            # clamping keeps p - left and p + right inside int64
            object.__setattr__(self, "window", tuple(min(int(x), 1 << 40) for x in self.window))
        if self.cu_seqlens is not None:
            cu = tuple(int(x) for x in self.cu_seqlens)
            if len(cu) < 2 or cu[0] != 0 or any(b <= a for a, b in zip(cu, cu[1:], strict=False)):
                raise ValueError(
                    f"cu_seqlens={self.cu_seqlens!r}: expected strictly increasing boundaries "
                    "starting at 0 and ending at the global sequence length"
                )
            object.__setattr__(self, "cu_seqlens", cu)

    @property
    def is_plain(self) -> bool:
        return self.window is None and self.cu_seqlens is None

    def check_length(self, seq_len: int) -> None:
        if self.cu_seqlens is not None and self.cu_seqlens[-1] != seq_len:
            raise ValueError(
                f"cu_seqlens ends at {self.cu_seqlens[-1]} but the global sequence has "
                f"{seq_len} tokens; the last boundary must equal the sequence length"
            )

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Dense boolean (len(q_pos), len(k_pos)) mask; True where the key is visible."""
        qp, kp = q_pos[:, None], k_pos[None, :]
        vis = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool, device=q_pos.device)
        if self.causal:
            vis &= kp <= qp
        if self.window is not None:
            left, right = self.window
            vis &= (kp >= qp - left) & (kp <= qp + right)
        if self.cu_seqlens is not None:
            vis &= self._doc(q_pos)[:, None] == self._doc(k_pos)[None, :]
        return vis

    def visible_counts(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Visible keys per query, without the dense mask: causality, the window and the
        document each leave an interval of key positions, so their intersection is one
        interval, counted with two binary searches in the ascending ``k_pos``."""
        big = 1 << 62
        lo, hi = torch.full_like(q_pos, -big), torch.full_like(q_pos, big)
        if self.causal:
            hi = torch.minimum(hi, q_pos)
        if self.window is not None:
            left, right = self.window
            lo, hi = torch.maximum(lo, q_pos - left), torch.minimum(hi, q_pos + right)
        if self.cu_seqlens is not None:
            cu, d = torch.tensor(self.cu_seqlens, device=q_pos.device), self._doc(q_pos)
            lo, hi = torch.maximum(lo, cu[d]), torch.minimum(hi, cu[d + 1] - 1)
        count = torch.searchsorted(k_pos, hi, right=True) - torch.searchsorted(k_pos, lo)
        return count.clamp_min(0)

    def _doc(self, pos: torch.Tensor) -> torch.Tensor:
        cu = torch.tensor(self.cu_seqlens, device=pos.device)
        return torch.searchsorted(cu, pos, right=True) - 1

    def range_empty(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """Cheap sufficient test (min/max only) that no query sees any key."""
        q_lo, q_hi, k_lo, k_hi = (int(q_pos.min()), int(q_pos.max()), int(k_pos.min()),
                                  int(k_pos.max()))
        if self.causal and k_lo > q_hi:
            return True
        if self.window is not None:
            left, right = self.window
            if k_hi < q_lo - left or k_lo > q_hi + right:
                return True
        if self.cu_seqlens is not None:
            qd = self._doc(torch.tensor([q_lo, q_hi]))
            kd = self._doc(torch.tensor([k_lo, k_hi]))
            if kd[1] < qd[0] or kd[0] > qd[1]:
                return True
        return False

    def extra_irrelevant(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """True when window and documents mask nothing in this block (causal aside)."""
        q_lo, q_hi, k_lo, k_hi = (int(q_pos.min()), int(q_pos.max()), int(k_pos.min()),
                                  int(k_pos.max()))
        if self.window is not None:
            left, right = self.window
            # with causal, pairs with k > p are hidden anyway, so only the left edge can cut
            if q_hi - k_lo > left or (not self.causal and k_hi - q_lo > right):
                return False
        if self.cu_seqlens is not None:
            d = self._doc(torch.tensor([q_lo, q_hi, k_lo, k_hi]))
            if not bool((d == d[0]).all()):
                return False
        return True


@dataclass(frozen=True)
class Call:
    """One kernel call: queries ``q`` (a slice of local rows) against keys ``k`` (a slice)."""

    q: slice
    k: slice
    kind: str
    mask: torch.Tensor | None = None  # bool (len q, len k), only for DENSE
    pairs: int | None = None  # visible (query, key) pairs, only for DENSE


_ALL = slice(None)


@lru_cache(maxsize=4096)
def _causal_plan(layout: str, world: int, q_rank: int, k_rank: int, n: int) -> tuple[Call, ...]:
    """Calls for a plain causal mask, derived from the layout (no dense mask needed)."""
    if layout == "contiguous":
        if k_rank < q_rank:
            return (Call(_ALL, _ALL, FULL),)
        return (Call(_ALL, _ALL, CAUSAL),) if k_rank == q_rank else ()
    if layout == "striped":
        # query a holds position a*G + q_rank, key b holds b*G + k_rank
        return (Call(_ALL, _ALL, CAUSAL if k_rank <= q_rank else STRICT),)
    half = n // 2  # zigzag: chunk r (early) then chunk 2G-1-r (late)
    if k_rank == q_rank:
        return (Call(_ALL, _ALL, CAUSAL),)
    if k_rank < q_rank:  # all queries see the early key chunk, none the late one
        return (Call(_ALL, slice(0, half), FULL),)
    return (Call(slice(half, n), _ALL, FULL),)  # only the late query chunk sees anything


def _refine(call: Call, spec: MaskSpec, q_pos: torch.Tensor, k_pos: torch.Tensor,
            dense_masks: bool) -> Call | None:
    qp, kp = q_pos[call.q], k_pos[call.k]
    if spec.range_empty(qp, kp):
        return None
    if spec.extra_irrelevant(qp, kp):
        return call
    pairs = int(spec.visible_counts(qp, kp).sum())
    if pairs == 0:
        return None
    if pairs == len(qp) * len(kp):
        return Call(call.q, call.k, FULL)
    return Call(call.q, call.k, DENSE, spec.visible(qp, kp) if dense_masks else None, pairs)


def plan_pair(spec: MaskSpec, layout: str, world: int, q_rank: int, k_rank: int,
              n: int, *, dense_masks: bool = True) -> list[Call]:
    """Kernel calls for queries of ``q_rank`` against keys of ``k_rank`` (n local tokens each).

    ``dense_masks=False`` leaves a DENSE call's mask out (its ``pairs`` stay): what a cost
    model needs, without an (n, n) tensor per block."""
    check_layout(layout)
    if spec.causal:
        calls = list(_causal_plan(layout, world, q_rank, k_rank, n))
    else:
        calls = [Call(_ALL, _ALL, FULL)]
    if spec.is_plain or not calls:
        return calls
    q_pos = global_positions(n, world, q_rank, layout)
    k_pos = global_positions(n, world, k_rank, layout)
    return [c for c in (_refine(c, spec, q_pos, k_pos, dense_masks) for c in calls)
            if c is not None]


def pair_empty(spec: MaskSpec, layout: str, world: int, q_rank: int, k_rank: int, n: int) -> bool:
    """Cheap test that a pair has no visible key (used to truncate the ring)."""
    if spec.causal and not _causal_plan(layout, world, q_rank, k_rank, n):
        return True
    if spec.is_plain:
        return False
    return spec.range_empty(global_positions(n, world, q_rank, layout),
                            global_positions(n, world, k_rank, layout))


@lru_cache(maxsize=1024)  # O(G^2) pair tests: computed once per (mask, layout, G, n)
def ring_span(spec: MaskSpec, layout: str, world: int, n: int) -> int:
    """Last ring step s (0..G-1) at which some rank i still needs the keys of rank i-s.

    Steps after it carry no useful data, so a flat ring stops there (sliding windows on the
    contiguous layout need only ceil(left / n) steps instead of G-1).
    """
    span = 0
    for s in range(world):
        if any(not pair_empty(spec, layout, world, i, (i - s) % world, n) for i in range(world)):
            span = s
    return span
