"""Masks between one rank's queries and another rank's keys, as a plan of kernel calls.

A ring step pairs the queries of one rank with the keys of another. Depending on the layout and
on the mask (causal, sliding window, documents) the pair is fully visible, causal on the
diagonal, strictly causal (striped layout, keys from a later rank: planned as the causal call on
queries 1.. against keys ..-1), partly masked, or fully masked. ``plan_pair`` turns the pair
into a list of ``Call``s on slices of the local sequences so that fully masked work is skipped,
not masked (DESIGN.md 3): a fully masked pair gives no call at all, and zigzag's half-masked
pairs become one call on half of Q or half of K. A partly visible block is cropped to the rows
and keys that see anything (a strictly causal piece becomes a causal one) and, while it is
larger than ``TILE`` on a side or holds a document start and is longer than ``DOC_CUT_MIN``,
split in two (at the document start nearest the middle, else in halves), until every piece is
fully visible, causal, empty (dropped) or at most ``TILE`` x ``TILE``: no mask grows with the
block (a windowed 32K-token block would need a 1 GiB one), and the visible bulk of a window or
of documents goes to the kernels that take no mask. So every call is FULL, CAUSAL (square,
top-left) or DENSE.

Under every mask the keys a query sees form one interval of positions (causality, the window and
the document each leave one), and local positions ascend on every layout, so a DENSE call stores
two index bounds per query, not an (Sq, Sk) mask; ``Call.mask`` builds the small mask on demand.

Positions are global token indices (``burst.layout``). A query at position p sees a key at k when
  causal:   k <= p
  window:   p - left <= k <= p + right     (``window=(left, right)``, both >= 0)
  document: doc(k) == doc(p)              (``cu_seqlens`` = global document boundaries)
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from burst.layout import check_layout, global_positions, position_runs

__all__ = ["FULL", "CAUSAL", "DENSE", "TILE", "Call", "MaskSpec", "bounds_mask",
           "flat_ring_suffices", "interleaved_windows", "layer_windows", "model_window",
           "pair_geometry", "per_layer", "plan_pair", "ring_reach", "shown_window"]

FULL = "full"  # every query sees every key
CAUSAL = "causal"  # square block, query a sees key b iff b <= a (top-left aligned)
DENSE = "dense"  # anything else: per-query key bounds, or an explicit boolean mask

TILE = 1024
"""Largest side of a DENSE call (``plan_pair``); its mask is at most TILE**2 booleans."""
DOC_CUT_MIN = 128
"""Partly visible pieces longer than this are cut at a document start inside them, if any
(random documents of 1000 tokens on average, 1M tokens: under 0.1% of the visible pairs left to
dense tiles, about 60% when cut only in halves; much shorter documents want a variable-length
kernel, which the shim does not have)."""


def _scalar(x):
    """A 0-dim tensor or array as its Python number; anything else as it is."""
    return x.item() if getattr(x, "ndim", None) == 0 and hasattr(x, "item") else x


def _whole(x) -> int | None:
    """``x`` as an int if it is a whole number (not a bool), else None."""
    x = _scalar(x)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    if isinstance(x, numbers.Integral):
        return int(x)
    return int(x) if math.isfinite(x) and float(x).is_integer() else None


def _whole_numbers(xs) -> tuple[int, ...] | None:
    try:
        out = tuple(_whole(x) for x in xs)
    except TypeError:  # not iterable
        return None
    return None if None in out else out


def _unordered(x) -> bool:
    """A set or a mapping: iterable, but in no order a mask can rely on ({5, 0} iterates as
    0, 5: a window given as a set swapped its sides)."""
    return isinstance(x, collections.abc.Set | collections.abc.Mapping)


def _window_sides(window) -> tuple[int, int] | None:
    """(left, right) as ints clamped to 2**40 (no sequence is longer: a larger side, or inf,
    means unbounded, and clamping keeps p - left and p + right inside int64); None if malformed."""
    if _unordered(window):
        return None
    try:
        sides = list(window)
    except TypeError:
        return None
    if len(sides) != 2:
        return None
    out = []
    for x in sides:
        x = _scalar(x)
        unbounded = isinstance(x, numbers.Real) and not isinstance(x, bool) and x == math.inf
        n = (1 << 40) if unbounded else _whole(x)
        if n is None or n < 0:
            return None
        out.append(min(n, 1 << 40))
    return out[0], out[1]


def layer_windows(window, layers: int) -> tuple[tuple[int, int] | None, ...]:
    """A causal model's sliding window, one entry per decoder layer: a (left, right) pair, or
    None for a layer that attends its whole causal context.

    ``window`` is None (no layer has a window), one (left, right) pair (every layer's), or a
    sequence of ``layers`` entries, each a pair or None: the interleaved local and global layers
    of Gemma 2 and 3, GPT-OSS and Mistral's variants (``interleaved_windows`` builds one).
    """
    if window is None:
        return (None,) * layers
    if isinstance(window, (str, bytes)) or _unordered(window):
        entries = None
    else:
        sides = _window_sides(window)
        if sides is not None:  # one pair: every layer's
            return (sides,) * layers
        try:
            entries = list(window)
        except TypeError:
            entries = None
    per = None
    if entries is not None and len(entries) == layers:
        per = [None if w is None else _window_sides(w) for w in entries]
    if per is None or any(p is None for p, w in zip(per, entries, strict=True) if w is not None):
        raise ValueError(
            f"window={window!r}: expected (left, right), two whole numbers of tokens >= 0 "
            f"(math.inf or >= 2**40: unbounded) for every layer, or a list of {layers} entries, "
            "one per layer, each (left, right) or None (the whole causal context)")
    return tuple(per)


def model_window(window, layers: int):
    """``window`` in one form (``layer_windows``' entries checked, sides as ints): None, one
    (left, right) pair when every layer has the same, else the tuple of per-layer entries."""
    per = layer_windows(window, layers)
    return per[0] if len(set(per)) == 1 else per


def shown_window(window) -> str:
    """A model's window in a line (``model_window``'s form): its pair, or its distinct entries
    with their layer counts: "global on 9 layers, [32767, 0] on 27 layers"."""
    if not per_layer(window):
        return f"{list(window)} on every layer"
    return ", ".join(f"{'global' if w is None else list(w)} on {n} layer{'s' * (n != 1)}"
                     for w, n in collections.Counter(window).items())


def per_layer(window) -> bool:
    """``window`` holds one entry per layer (each a pair or None), not one pair of sides."""
    return window is not None and any(w is None or isinstance(w, (tuple, list)) for w in window)


def interleaved_windows(window, layers: int, global_every: int
                        ) -> tuple[tuple[int, int] | None, ...]:
    """Per-layer windows of a model that interleaves local and global attention: every
    ``global_every``-th layer (the last of each group) attends its whole causal context, the
    others the sliding ``window``. Gemma 3 uses 6 (five local layers of 1024 tokens, then a
    global one; arXiv 2503.19786); Gemma 2 and GPT-OSS alternate (2)."""
    if isinstance(global_every, bool) or not isinstance(global_every, int) or global_every < 1:
        raise ValueError(f"global_every={global_every!r} must be a whole number >= 1")
    sides = layer_windows(window, 1)[0]
    if sides is None:
        raise ValueError("window=None: give the local layers' (left, right) window")
    return tuple(None if (i + 1) % global_every == 0 else sides for i in range(layers))


@dataclass(frozen=True)
class MaskSpec:
    """What each query may attend to, in global positions."""

    causal: bool = False
    """Keys after the query are masked."""
    window: tuple[int, int] | None = None
    """(left, right) sliding window: keys in [p - left, p + right] are visible."""
    cu_seqlens: tuple[int, ...] | None = None
    """Document boundaries [0, e1, ..., N] of packed sequences; attention stays in a document.
    Any sequence of ints (a list, a tuple, a tensor; not a set) is accepted and stored as a
    tuple, without repeats (a repeated boundary, an empty document, changes no mask)."""

    def __post_init__(self):
        if type(self.causal).__name__ in ("bool", "bool_"):  # Python's or numpy's
            object.__setattr__(self, "causal", bool(self.causal))
        if not isinstance(self.causal, bool):  # causal="no" ran causal in every method
            raise ValueError(f"causal={self.causal!r}: expected True or False")
        if self.window is not None:
            sides = _window_sides(self.window)
            if sides is None:
                raise ValueError(
                    f"window={self.window!r}: expected (left, right), two whole numbers of "
                    "tokens >= 0 (math.inf or >= 2**40: unbounded)"
                )
            object.__setattr__(self, "window", sides)
        if self.cu_seqlens is not None:
            raw = self.cu_seqlens  # a device tensor crosses to the host once, not per element
            if isinstance(raw, torch.Tensor):
                raw = raw.tolist() if raw.dim() == 1 else None
            cu = (None if raw is None or isinstance(raw, (str, bytes)) or _unordered(raw)
                  else _whole_numbers(raw))
            if cu is not None:  # a repeated boundary is an empty document (flash-attention's
                cu = tuple(dict.fromkeys(cu))  # varlen takes them, TE pads with them): dropped
            if (cu is None or len(cu) < 2 or cu[0] != 0
                    or any(b <= a for a, b in zip(cu, cu[1:], strict=False))):
                raise ValueError(
                    f"cu_seqlens={self.cu_seqlens!r}: expected one dimension of non-decreasing "
                    "whole-number boundaries starting at 0 and ending at the global sequence "
                    "length (a repeated boundary is an empty document)"
                )
            object.__setattr__(self, "cu_seqlens", cu)

    @property
    def is_plain(self) -> bool:
        return self.window is None and self.cu_seqlens is None

    def over(self, seq_len: int) -> MaskSpec:
        """This mask on a sequence of ``seq_len`` tokens, without a window that spans it (one
        whose sides reach N - 1 tokens masks nothing a plain causal or full call would show)."""
        if self.window is None:
            return self
        left, right = self.window
        if left >= seq_len - 1 and (self.causal or right >= seq_len - 1):
            return dataclasses.replace(self, window=None)
        return self

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

    def key_bounds(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """Visible keys per query as an index range [lo, hi) into the ascending ``k_pos``, without
        the dense mask: causality, the window and the document each leave an interval of key
        positions, so their intersection is one interval; two binary searches find its ends.
        Rows that see nothing get hi == lo; int32, as plans keep them."""
        big = 1 << 62
        first, last = torch.full_like(q_pos, -big), torch.full_like(q_pos, big)
        if self.causal:
            last = torch.minimum(last, q_pos)
        if self.window is not None:
            left, right = self.window
            first, last = torch.maximum(first, q_pos - left), torch.minimum(last, q_pos + right)
        if self.cu_seqlens is not None:
            cu, d = torch.tensor(self.cu_seqlens, device=q_pos.device), self._doc(q_pos)
            first, last = torch.maximum(first, cu[d]), torch.minimum(last, cu[d + 1] - 1)
        lo = torch.searchsorted(k_pos, first, out_int32=True)
        return lo, torch.maximum(torch.searchsorted(k_pos, last, right=True, out_int32=True), lo)

    def visible_counts(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Visible keys per query (``key_bounds``' hi - lo)."""
        lo, hi = self.key_bounds(q_pos, k_pos)
        return hi - lo

    def doc_starts(self, pos: torch.Tensor) -> list[int]:
        """Indices 0 < i < len(pos) into the ascending ``pos`` where a new document begins."""
        if self.cu_seqlens is None:
            return []
        at = torch.searchsorted(pos, torch.tensor(self.cu_seqlens[1:-1], device=pos.device))
        return sorted({i for i in at.tolist() if 0 < i < len(pos)})

    def _doc(self, pos: torch.Tensor) -> torch.Tensor:
        cu = torch.tensor(self.cu_seqlens, device=pos.device)
        return torch.searchsorted(cu, pos, right=True) - 1

    def span_empty(self, q_lo, q_hi, k_lo, k_hi):
        """Cheap sufficient test that no query at positions q_lo..q_hi sees any key at
        k_lo..k_hi (inclusive ends): exact for runs of consecutive positions. Numbers or numpy
        arrays (broadcast together: one answer per element)."""
        empty = False
        if self.causal:
            empty = empty | (k_lo > q_hi)
        if self.window is not None:
            left, right = self.window
            empty = empty | (k_hi < q_lo - left) | (k_lo > q_hi + right)
        if self.cu_seqlens is not None:  # doc(p): the document index of position p
            def doc(x):
                return np.searchsorted(self.cu_seqlens, x, side="right")
            empty = empty | (doc(k_hi) < doc(q_lo)) | (doc(k_lo) > doc(q_hi))
        return empty

    def span_full(self, q_lo, q_hi, k_lo, k_hi):
        """Cheap sufficient test that every query at positions q_lo..q_hi sees every key at
        k_lo..k_hi (inclusive ends), for masks without documents (``pair_geometry``'s): exact
        for runs of consecutive positions. Numbers or numpy arrays, as ``span_empty``."""
        if self.cu_seqlens is not None:
            raise ValueError("span_full: a mask with documents (its pairs have no geometry)")
        full = True
        if self.causal:
            full = full & (k_hi <= q_lo)
        if self.window is not None:
            left, right = self.window
            full = full & (k_lo >= q_hi - left) & (k_hi <= q_lo + right)
        return full


@dataclass(frozen=True, eq=False)
class Call:
    """One kernel call: queries ``q`` (a slice of local rows) against keys ``k`` (a slice)."""

    q: slice
    k: slice
    kind: str
    bounds: tuple[torch.Tensor, torch.Tensor] | None = None
    """DENSE only: query i sees keys [lo[i], hi[i]) of this call's keys (``key_bounds``)."""
    pairs: int | None = None  # visible (query, key) pairs, only for DENSE

    @property
    def mask(self) -> torch.Tensor | None:
        """bool (len q, len k), True = visible; DENSE only (at most ``TILE`` x ``TILE``)."""
        if self.bounds is None:
            return None
        return bounds_mask(*self.bounds, self.k.stop - self.k.start)

    @property
    def visible_pairs(self) -> int:
        """Visible (query, key) pairs of this call."""
        lq, lk = self.q.stop - self.q.start, self.k.stop - self.k.start
        return {FULL: lq * lk, CAUSAL: lq * (lq + 1) // 2}.get(self.kind, self.pairs)


def bounds_mask(lo: torch.Tensor, hi: torch.Tensor, n_k: int) -> torch.Tensor:
    """bool (len(lo), n_k) mask, True where lo[i] <= j < hi[i], on the bounds' device."""
    j = torch.arange(n_k, dtype=lo.dtype, device=lo.device)
    return (j >= lo[:, None]) & (j < hi[:, None])


@lru_cache(maxsize=4096)
def _causal_plan(layout: str, world: int, q_rank: int, k_rank: int, n: int) -> tuple[Call, ...]:
    """Calls for a plain causal mask, derived from the layout (no dense mask needed)."""
    every, half = slice(0, n), n // 2  # zigzag: chunk r (early) then chunk 2G-1-r (late)
    if layout == "contiguous":
        if k_rank < q_rank:
            return (Call(every, every, FULL),)
        return (Call(every, every, CAUSAL),) if k_rank == q_rank else ()
    if layout == "striped":
        # query a holds position a*G + q_rank, key b holds b*G + k_rank: it sees b <= a from a
        # key rank up to its own, b < a from a later one, which is the causal block of queries
        # 1.. against keys ..-1 (query 0 sees nothing there; a one-token block makes no call)
        if k_rank <= q_rank:
            return (Call(every, every, CAUSAL),)
        return (Call(slice(1, n), slice(0, n - 1), CAUSAL),) if n > 1 else ()
    if k_rank == q_rank:
        return (Call(every, every, CAUSAL),)
    if k_rank < q_rank:  # all queries see the early key chunk, none the late one
        return (Call(every, slice(0, half), FULL),)
    return (Call(slice(half, n), every, FULL),)  # only the late query chunk sees anything


def _kind(lo: np.ndarray, hi: np.ndarray, n_k: int) -> str:
    """The mask kind of a block whose query i sees keys [lo[i], hi[i]) (some query sees some)."""
    if not lo.any():
        if (hi == n_k).all():
            return FULL
        if len(hi) == n_k and (hi == np.arange(1, n_k + 1)).all():
            return CAUSAL
    return DENSE


def _split(s: slice, sizes: tuple[int, int], starts: list[int]) -> tuple[slice, ...]:
    """A side cut in two: at the document start nearest the middle while one lies inside and the
    side is longer than ``DOC_CUT_MIN`` (a flash-attention tile), so whole documents meet in
    mask-free calls; else in the middle if it is longer than ``TILE``; else not at all."""
    tile, doc_cut_min = sizes
    mid = (s.start + s.stop) // 2
    first, end = bisect_right(starts, s.start), bisect_left(starts, s.stop)
    if first < end and s.stop - s.start > doc_cut_min:
        j = bisect_left(starts, mid, first, end)  # the nearest is starts[j - 1] or starts[j]
        cut = min(starts[max(j - 1, first):min(j + 1, end)], key=lambda i: abs(i - mid))
    elif s.stop - s.start > tile:
        cut = mid
    else:
        return (s,)
    return slice(s.start, cut), slice(cut, s.stop)


def _clamp(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``x.clip(lo, hi)`` at half its cost on small arrays (clip checks its bounds' range)."""
    return np.minimum(np.maximum(x, lo), hi)


def _tiles(qs: slice, ks: slice, lo_all: np.ndarray, hi_all: np.ndarray,
           sizes: tuple[int, int], starts: tuple[list[int], list[int]]) -> list[Call]:
    """Calls covering queries ``qs`` x keys ``ks`` whose local key bounds are lo_all/hi_all.
    The block is first cropped to the rows and keys that see anything (on the striped layout a
    document's queries and keys start one index apart: cropped, the document is causal).
    Host arrays in numpy: thousands of tiny blocks, where a torch call costs ten times more."""
    lo, hi = _clamp(lo_all[qs], ks.start, ks.stop), _clamp(hi_all[qs], ks.start, ks.stop)
    seen = hi > lo
    rows = np.flatnonzero(seen)
    if len(rows) == 0:
        return []
    first, last = int(rows[0]), int(rows[-1]) + 1
    qs = slice(qs.start + first, qs.start + last)
    ks = slice(int(lo[seen].min()), int(hi[seen].max()))
    lo = _clamp(lo[first:last], ks.start, ks.stop) - ks.start
    hi = _clamp(hi[first:last], ks.start, ks.stop) - ks.start
    kind = _kind(lo, hi, ks.stop - ks.start)
    if kind != DENSE:
        return [Call(qs, ks, kind)]
    q_parts, k_parts = _split(qs, sizes, starts[0]), _split(ks, sizes, starts[1])
    if len(q_parts) == len(k_parts) == 1:
        return [Call(qs, ks, DENSE, (torch.from_numpy(lo), torch.from_numpy(hi)),
                     int((hi - lo).sum()))]
    return [c for q in q_parts for k in k_parts
            for c in _tiles(q, k, lo_all, hi_all, sizes, starts)]


class _PlanCache:
    """Least recently used plans, bounded by their host bytes and by their number: a rank meets
    about 2G pairs per layer, each planned once; packed batches bring new documents (new specs)
    every step, and a 1M-token plan holds megabytes of key bounds."""

    def __init__(self, budget: int, entries: int = 4096):
        self.budget, self.entries, self.used, self.plans = budget, entries, 0, OrderedDict()

    @staticmethod
    def nbytes(key, calls) -> int:
        """About what an entry holds: ~1 KiB of objects, ~0.5 KiB per call, the key bounds and
        the spec's document boundaries."""
        docs = getattr(key[0], "cu_seqlens", None) or ()
        bounds = sum(2 * c.bounds[0].nbytes for c in calls if c.bounds is not None)
        return 1024 + 8 * len(docs) + 512 * len(calls) + bounds

    def get(self, key, make):
        if key in self.plans:
            self.plans.move_to_end(key)
            return self.plans[key][0]
        calls = make()
        size = self.nbytes(key, calls)
        self.plans[key] = (calls, size)
        self.used += size
        while len(self.plans) > 1 and (self.used > self.budget or len(self.plans) > self.entries):
            self.used -= self.plans.popitem(last=False)[1][1]
        return calls


_PLANS = _PlanCache(256 << 20)


def plan_pair(spec: MaskSpec, layout: str, world: int, q_rank: int, k_rank: int,
              n: int) -> tuple[Call, ...]:
    """Kernel calls for queries of ``q_rank`` against keys of ``k_rank`` (n local tokens each);
    DENSE calls are at most ``TILE`` x ``TILE`` and carry key bounds, not masks."""
    check_layout(layout)
    if spec.causal and spec.is_plain:
        return _causal_plan(layout, world, q_rank, k_rank, n)
    geometry = pair_geometry(spec, layout, world, q_rank, k_rank, n)
    key = (spec, layout, world, (q_rank, k_rank) if geometry is None else geometry, n, TILE,
           DOC_CUT_MIN)
    return _PLANS.get(key, lambda: _plan(spec, layout, world, q_rank, k_rank, n, TILE,
                                         DOC_CUT_MIN))


def _plan(spec: MaskSpec, layout: str, world: int, q_rank: int, k_rank: int, n: int,
          tile: int, doc_cut_min: int) -> tuple[Call, ...]:
    every = slice(0, n)
    calls = _causal_plan(layout, world, q_rank, k_rank, n) if spec.causal else (
        Call(every, every, FULL),)
    if spec.is_plain or not calls or n == 0:
        return calls if n else ()
    if pair_empty(spec, layout, world, q_rank, k_rank, n):
        return ()
    q_pos = global_positions(n, world, q_rank, layout)
    k_pos = global_positions(n, world, k_rank, layout)
    lo, hi = (b.numpy() for b in spec.key_bounds(q_pos, k_pos))
    starts = (spec.doc_starts(q_pos), spec.doc_starts(k_pos))
    return tuple(t for c in calls for t in _tiles(c.q, c.k, lo, hi, (tile, doc_cut_min), starts))


def pair_empty(spec: MaskSpec, layout: str, world: int, q_rank: int | np.ndarray,
               k_rank: int | np.ndarray, n: int):
    """Cheap test that a pair has no visible key (used to truncate the ring): no run of the
    query rank's positions sees any run of the key rank's (``span_empty`` on each pair of
    runs: zigzag's two chunks are tested apart, so a window that reaches neither of a rank's
    chunks from either of another's leaves the pair empty, although together the two ranks'
    positions span most of the sequence). Ranks are ints (a bool comes back) or numpy arrays
    of them, tested elementwise (``ring_reach`` tests every pair of a ring at once)."""
    # a plain causal pair is empty where _causal_plan gives no call: contiguous, keys later
    empty = (spec.causal and layout == "contiguous") & (k_rank > q_rank)
    if not spec.is_plain:
        empty = empty | _run_pairs(spec, layout, world, q_rank, k_rank, n)[1].all(axis=-1)
    return empty if isinstance(empty, np.ndarray) else bool(empty)


def pair_geometry(spec: MaskSpec, layout: str, world: int, q_rank: int | np.ndarray,
                  k_rank: int | np.ndarray, n: int):
    """What a pair's plan depends on, where the mask depends only on the distance from query
    to key (causal, a window; not documents: None): for each run of the query rank's positions
    and each of the key rank's (``position_runs``), the key run's start minus the query run's,
    or only its sign where the two runs see nothing of each other (``span_empty``: every key of
    the run lies before, or after, what the run's queries see), or one mark where each of the
    run's queries sees every key of the other (``span_full``: a long window's bulk, where the
    offset changes nothing; with the offset kept, a window of the whole sequence on 128 ranks
    planned all 16384 pairs, 4 s, against 0.1 s without it). Two pairs of one geometry (and
    one layout and n) get the same calls, so ``plan_pair`` plans a geometry once: the bulk of a
    windowed zigzag ring is one geometry per step (1024 ranks, 33 steps: 171 of 33792 pairs);
    a test compares the plans of every pair of many masks. Ints give a tuple; arrays of ranks
    an int64 array (..., runs x runs), one row per pair."""
    if spec.cu_seqlens is not None:
        return None
    offsets, empty, full = _run_pairs(spec, layout, world, q_rank, k_rank, n, full=True)
    far = 1 << 62
    out = np.where(empty, np.where(offsets > 0, far, -far), np.where(full, far // 2, offsets))
    return out if out.ndim > 1 else tuple(out.tolist())


@lru_cache(maxsize=16)
def _run_table(layout: str, world: int, n: int) -> np.ndarray:
    """int64 (world, runs, 2): ``position_runs`` of every rank."""
    return np.array([position_runs(n, world, r, layout) for r in range(world)], dtype=np.int64)


def _run_pairs(spec: MaskSpec, layout: str, world: int, q_rank: int | np.ndarray,
               k_rank: int | np.ndarray, n: int,
               full: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """For each run of the query rank's positions and each of the key rank's, in that order:
    the key run's start minus the query run's, whether the two runs see nothing of each other
    (``span_empty``) and, if ``full``, whether they see all of each other (``span_full``; else
    None: ``ring_reach`` tests G^2 pairs at once). Ranks are ints or numpy arrays (broadcast);
    each result has shape (..., runs x runs)."""
    for name, rank in (("q_rank", q_rank), ("k_rank", k_rank)):
        r = np.asarray(rank)  # numpy indexing would take -1 for world - 1 (a review)
        if r.dtype.kind not in "iu" or (r.size and not 0 <= r.min() <= r.max() < world):
            raise ValueError(f"{name}={rank!r}: expected ranks 0 .. {world - 1} of a world of "
                             f"{world}")
    runs = _run_table(layout, world, n)
    q = runs[q_rank][..., :, None, :]
    k = runs[k_rank][..., None, :, :]
    offsets = k[..., 0] - q[..., 0]
    spans = q[..., 0], q[..., 1], k[..., 0], k[..., 1]
    rows = offsets.shape[:-2] + (-1,)

    def each(x):
        return np.broadcast_to(x, offsets.shape).reshape(rows)

    seen_all = each(spec.span_full(*spans)) if full else None
    return offsets.reshape(rows), each(spec.span_empty(*spans)), seen_all


@lru_cache(maxsize=64)  # G^2 pair tests (in numpy: 1-3 s at G = 4096, 26 s one by one), once
# per (mask, layout, G, n); packed batches bring a new mask (its document boundaries) every step
def ring_reach(spec: MaskSpec, layout: str, world: int, n: int,
               nodes: int = 1) -> tuple[int, int]:
    """(span, back): the fewest ring steps that bring every rank i the keys it needs, as the
    blocks of ranks i-1 .. i-span one way and of ranks i+1 .. i+back the other
    (``burst.ring.run_ring``).

    Steps beyond them carry no useful data. One way, the ring stops at the last rank i-s whose
    keys some rank i needs (sliding windows on the contiguous layout: ceil(left / n) steps
    instead of G-1). Where the keys needed lie on both sides and sending them both ways takes
    fewer hops, the ring does that: a causal window of at most a zigzag chunk needs the ranks
    on either side (chunk r's left neighbour is rank r-1's, chunk 2G-1-r's is rank r+1's), 1 + 1
    hops instead of G-1; a window reaching only right, (0, w) on the contiguous layout, needs
    ranks i+1 .. i+ceil(w / n) alone: (0, ceil(w / n)). A tie keeps the one-way ring (back 0),
    whose steps hold half the buffers (``suites.memory_model._flat_ring_peak``). A double ring
    (``nodes`` > 1) is never shortened: (G-1, 0), each node's blocks go around every node ring.
    """
    if nodes > 1:
        return world - 1, 0
    needed, ranks = [], np.arange(world)
    chunk = max(1, (1 << 20) // world)  # offsets tested at once: 2^20 pairs, ~150 MB
    for first in range(1, world, chunk):
        offsets = np.arange(first, min(first + chunk, world))[:, None]
        empty = pair_empty(spec, layout, world, ranks, (ranks - offsets) % world, n)
        needed += offsets[~np.all(empty, axis=1), 0].tolist()
    if not needed:
        return 0, 0
    best = (needed[-1], 0)
    for j, s in enumerate(needed):  # offsets before s one way, s and beyond the other
        cut = (needed[j - 1] if j else 0, world - s)
        if sum(cut) < sum(best):
            best = cut
    return best


def flat_ring_suffices(spec: MaskSpec, layout: str, world: int, n: int, nodes: int) -> bool:
    """Whether a double ring of M = ``nodes`` nodes of L ranks runs as a flat ring instead:
    where the mask (a window, documents) lets a flat ring bring every rank its keys in at most
    M - 1 steps, S one way and B the other (``ring_reach``: max(S, B) <= M - 1; a causal
    window of at most a zigzag chunk: 1 + 1 hops instead of G - 1, from 2 nodes on).

    This keeps the flat ring from being slower. Its two directions step together, max(S, B)
    steps; at each, a node sends two blocks across its boundaries (its last GPU forward, its
    first back), while each of the double ring's M - 1 outer hops sends L blocks from a node,
    its L GPUs sharing the node's NICs: so the flat ring crosses with no more blocks per NIC
    (2 (M - 1) <= L (M - 1) on one NIC, at most M - 1 per NIC on more) and, inside the node,
    sends at most 2 (M - 1) blocks over each GPU's NVLink against the double ring's M (L - 1)
    (with L = 2 each GPU's second send crosses nodes: M - 1 over NVLink). Not memory: with
    L = 2 and both S and B of 2 or more the flat ring holds four blocks to the double ring's
    three (up to 9% more reserved, a review priced; it never made a cell run out). Priced
    on the a800 and h100 profiles, every cell of a grid this rule sends flat is at least as
    fast flat (tests/test_simulator.py), and one step more can be slower: 4 nodes of 4 with a
    zigzag window of 4 + 4 hops, 14% on the a800. (The first rules asked S + B <= L - 1,
    then S + B <= min(L, M) - 1: Ministral-8B's local layers, a window of 32768 on 32 GPUs at
    1M tokens, 2 + 2 steps, kept the double ring, 1.9x slower a layer; a review had found L - 1
    alone sent 2 nodes of 8 with 7 hops flat, 14% slower. These are priced with the double
    ring's blocks in burst.ring's order, which the simulator got wrong for windowed double
    rings before a later review: most cells beyond the bound then price faster flat too, so
    the bound is on the safe side.)"""
    if nodes <= 1 or spec.is_plain:
        return False
    return max(ring_reach(spec, layout, world, n)) <= nodes - 1
