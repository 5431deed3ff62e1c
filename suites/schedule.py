"""Schedule model of one attention layer (forward + backward) per method, for the simulator.

Time comes from two sources only: kernel work per ring step (the same ``burst.masks.plan_pair``
calls the real code makes, FLOPs from ``burst.flops``, priced by the hardware profile's kernel
efficiency) and bytes per rank (``burst.volume``, the formulas the byte-counter tests verify),
priced by the profile's link bandwidths. The schedule says how they combine (DESIGN.md 3):

  flat ring      each of the S = G-1 steps takes max(compute, hop); the last block is computed
                 with nothing left to send. Backward: step 0 sends the payload (K, V or Q, dO,
                 D, LSE), steps 1..S-1 the payload and the previous step's accumulator (dK, dV
                 or dQ) on the same link, step S the last accumulator, which then hops home:
                 a ring bound by its link takes exactly its bytes over the bandwidth.
                 A flat ring that spans nodes waits every step for its one inter-node hop, on
                 one NIC (the other GPUs of the node are not crossing). A window shortens it
                 to the steps it needs (burst.masks.ring_reach); its last accumulators then
                 go straight home, S members back, leaving a node from every GPU whose owner
                 lies on another node. A window that needs keys on both sides sends the
                 blocks both ways at once, each step working on both arrivals (inside a node
                 a GPU's two sends share its NVLink; across nodes the GPUs that cross either
                 way share the node's NICs, and a GPU whose both sends cross sends both
                 through its share). Each step is priced on the GPUs of each node that cross
                 in it (``_crossings``: every rank of the job, USP's rings too).
  double ring    M rounds (burst.ring._double), each an inner flat ring of L steps on NVLink
                 (its accumulators home within it) while one inter-node hop, made by all L GPUs
                 of a node at once (they share the node's NICs), carries the next outer block
                 and the previous round's accumulators: round = max(inner ring, inter hop);
                 the last round's accumulators then cross home. Bound by either link, it takes
                 that link's bytes over its bandwidth. An inner ring longer than a node crosses
                 a NIC every step, from one GPU per node, which also makes its outer hop: both
                 go through that GPU's one NIC.
  ulysses        all-to-all of q, k, v, then the whole sequence for H/U heads, all-to-all of o;
                 backward mirrors it (dO in, dq/dk/dv out). Nothing overlaps.
  usp            Ulysses inside groups of U ranks, a flat ring across the G/U groups on blocks of
                 U*n tokens and H/U heads: U rings side by side (ranks j, j + U, ...), whose
                 GPUs that cross nodes in a step share their node's NICs.
  allgather      all-gather K/V, local queries against all keys, reduce-scatter dK/dV.
  tp             heads split over G ranks, the sequence gathered and scattered around the layer
                 (reached by no cell: 'tp' is block-level, so the harness and the simulator
                 make a tp cell an error row; checked against no run).

A masked edge tile (DENSE) costs its whole rectangle: the kernel shim runs it with its mask as
a bias. Causal balance comes from the layout through ``plan_pair``: contiguous makes the
slowest rank do a full block every step, zigzag and striped half a block. Every step also
pays memory-bound accumulator traffic (fp32 merge of (o, lse) forward; dq or dk/dv
accumulation backward).

Names: G ranks, N global tokens, n = N/G local, H heads, Hk kv heads, d head dim, U Ulysses degree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from burst import flops as F
from burst import volume
from burst.attention import choice_problems
from burst.comm import ranks_per_node_ok, ring_shape
from burst.masks import (
    CAUSAL,
    DENSE,
    MaskSpec,
    flat_ring_suffices,
    pair_empty,
    pair_geometry,
    plan_pair,
    ring_reach,
)
from suites.hardware import Hardware

__all__ = ["ELEM", "MAX_PLANNED_TOKENS", "AttnShape", "AttnTiming", "Plan", "Topo", "acc_bytes",
           "attention_timing", "collective_seconds", "method_volume", "plan_for",
           "pricing_problem", "regather_volume", "ring_reach_of", "step_compute"]

ELEM = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}  # bytes per element


def acc_bytes(elem: int) -> int:
    """Bytes per accumulator element (O, LSE, D, gradient sums) for inputs of ``elem`` bytes:
    fp32, never narrower than the input (float64 accumulates in float64:
    burst.kernel.acc_dtype). Travelling gradients in the input dtype are the method option
    grad_acc="input" (burst.volume)."""
    return max(4, elem)


# the methods the schedule models, by kind; their defaults (layout, backward, ranks_per_node,
# ulysses_degree) are the registry entry's options
RING_METHODS = ("burst", "ring", "zigzag_ring", "striped_ring", "double_ring",
                "ring_flash_attn")  # ring_flash_attn: the package's flat ring (no window)
OTHER_KINDS = {"ulysses": "ulysses", "usp": "usp", "allgather": "allgather", "tp": "tp",
               "yunchang": "usp"}  # yunchang: Ulysses x a classic ring, as our usp


@dataclass(frozen=True)
class AttnShape:
    """Global shape of one attention layer."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool = True
    dtype: str = "bfloat16"
    """Of q/k/v: their bytes per element (``elem``) and the peak the kernels run at."""
    window: tuple[int, int] | None = None

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)!r} must be a positive int" for k in
               ("batch", "seq_len", "heads", "kv_heads", "head_dim")
               if not isinstance(getattr(self, k), int) or getattr(self, k) <= 0]
        if self.dtype not in ELEM:
            bad.append(f"dtype={self.dtype!r}; valid: {', '.join(ELEM)}")
        if not bad and self.heads % self.kv_heads:
            bad.append(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if bad:
            raise ValueError("attention shape: " + "; ".join(bad))

    @property
    def elem(self) -> int:
        return ELEM[self.dtype]

    @functools.cached_property  # asked for per pair: hundreds of thousands of times a cell
    def mask(self) -> MaskSpec:
        return MaskSpec(causal=self.causal, window=self.window)

    def pair_flops(self, heads: int | None = None) -> float:
        """Forward FLOPs of one visible (query, key) pair over ``heads`` heads (burst.flops)."""
        return F.attention_flops(self.batch, 1, heads or self.heads, self.head_dim)


@dataclass(frozen=True)
class Topo:
    """G ranks placed node-major, ``ranks_per_node`` per node."""

    world: int
    ranks_per_node: int

    def __post_init__(self):
        if self.world < 1 or self.ranks_per_node < 1:
            raise ValueError(f"topology world={self.world}, ranks_per_node="
                             f"{self.ranks_per_node}: both must be >= 1")
        if self.world > self.ranks_per_node and self.world % self.ranks_per_node:
            raise ValueError(f"world={self.world} is not a multiple of ranks_per_node="
                             f"{self.ranks_per_node}")

    @property
    def local(self) -> int:
        return min(self.world, self.ranks_per_node)

    @property
    def nodes(self) -> int:
        return max(1, self.world // self.local)


@dataclass(frozen=True)
class Plan:
    """What a method does, reduced to what the schedule needs."""

    kind: str
    """ring | ulysses | usp | allgather | tp"""
    layout: str = "zigzag"
    backward: str = "ring"
    """ring methods: 'burst' (Q, dO, D, LSE travel, dQ trails) or 'ring' (K, V travel)."""
    ring_local: int | None = None
    """Double ring with this many ranks per inner ring; None: flat ring."""
    ulysses: int = 1
    """Ulysses (head-parallel) degree: G for ulysses, U for usp."""
    options: dict = field(default_factory=dict, compare=False)


@dataclass
class AttnTiming:
    forward_s: float
    backward_s: float
    compute_forward_s: float
    compute_backward_s: float
    plan: Plan | None = None
    rank_volume: Callable[[int], volume.Volume] | None = field(default=None, repr=False,
                                                               compare=False)
    """Bytes ``rank`` sends, by phase and link (``burst.volume``)."""
    world: int = 1

    @functools.cached_property
    def volumes(self) -> tuple:
        """Every rank's bytes, rank 0's first (result rows take the maximum over ranks of each
        byte column, as measured rows do). Computed when asked for, so fits that only need
        times do not pay for it."""
        return tuple(self.rank_volume(r) for r in range(self.world)) if self.rank_volume else ()

    @property
    def volume(self):
        """Rank 0's bytes (``burst.volume.Volume``)."""
        return self.volumes[0]

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def _registry_defaults(method: str) -> dict:
    from baselines import registry

    try:
        return dict(registry.get(method).options)
    except ValueError:  # not registered: refused below, naming what is modelled
        return {}


def plan_for(method: str, options: dict | None, topo: Topo, shape: AttnShape) -> Plan:
    """Reduce a registry method and its options to a schedule plan (defaults from the registry's
    entry, as a run's)."""
    opts = {**_registry_defaults(method), **(options or {})}
    if method in RING_METHODS:
        layout, backward = opts["layout"], opts.get("backward", "ring")
        rpn = opts.get("ranks_per_node")
        if not ranks_per_node_ok(topo.world, rpn):
            raise ValueError(f"ranks_per_node={rpn} does not divide world={topo.world}")
        nodes = ring_shape(topo.world, rpn)[0]
        local = None if nodes == 1 or flat_ring_suffices(  # the one rule, as burst_attn's
            shape.mask, layout, topo.world, shape.seq_len // topo.world, nodes) else rpn
        if backward == "auto":
            backward = _auto_backward(shape, topo, opts.get("ranks_per_node") if local else None,
                                      opts.get("grad_acc", "fp32"))
        if why := choice_problems(backward=backward):
            raise ValueError(why[0])
        return Plan("ring", layout=layout, backward=backward, ring_local=local, options=opts)
    if method in OTHER_KINDS:
        kind = OTHER_KINDS[method]
        u = (topo.world if kind in ("ulysses", "tp") else int(opts["ulysses_degree"])
             if kind == "usp" else 1)  # (all-gather: no head split)
        if kind == "usp" and (u < 1 or topo.world % u):
            raise ValueError(f"ulysses_degree={u} does not divide world={topo.world}")
        # usp's ring: the registry runs the classic ring backward; BurstEngine-USP the burst one
        backward = opts.get("backward", "ring")
        if kind == "usp" and backward == "auto":
            backward = volume.usp_auto_backward(
                ulysses_degree=u, **_vol_kw(shape, topo.world, shape.seq_len // topo.world,
                                            acc_elem=acc_bytes(shape.elem)),
                grad_elem=shape.elem if opts.get("grad_acc") == "input" else None)
        return Plan(kind, layout=opts.get("layout", "zigzag"), backward=backward, ulysses=u,
                    options=opts)
    raise ValueError(f"method {method!r} has no schedule model; modelled: "
                     f"{', '.join([*RING_METHODS, *OTHER_KINDS])}")


def _auto_backward(shape: AttnShape, topo: Topo, ranks_per_node: int | None,
                   grad_acc: str = "fp32") -> str:
    """Same rule as burst.attention's 'auto': whichever backward moves fewer bytes."""
    return volume.auto_backward(**_vol_kw(shape, topo.world, shape.seq_len // topo.world,
                                          acc_elem=acc_bytes(shape.elem)),
                                ranks_per_node=ranks_per_node,
                                grad_elem=shape.elem if grad_acc == "input" else None)


def _vol_kw(shape: AttnShape, world: int, seq_local: int, heads: int | None = None,
            kv_heads: int | None = None, acc_elem: int = 4) -> dict:
    return dict(world=world, batch=shape.batch, seq_local=seq_local, heads=heads or shape.heads,
                kv_heads=kv_heads or shape.kv_heads, head_dim=shape.head_dim, elem=shape.elem,
                acc_elem=acc_elem)


def _method_bytes(method: str, opts: dict, shape: AttnShape, world: int, seq_local: int,
                  node_size: int, acc_elem: int, heads: int | None = None,
                  kv_heads: int | None = None, rank: int = 0) -> volume.Volume:
    kw = {k: opts[k] for k in volume.formula_options(method) if k in opts}
    return volume.method_bytes(method, **_vol_kw(shape, world, seq_local, heads, kv_heads,
                                                 acc_elem),
                               node_size=node_size, causal=shape.causal, window=shape.window,
                               rank=rank, **kw)


def method_volume(method: str, options: dict | None, shape: AttnShape, topo: Topo, *,
                  acc_elem: int = 4, rank: int = 0) -> volume.Volume:
    """Bytes ``rank`` sends in one attention layer: ``burst.volume.method_bytes`` of the
    method with the plan's options (usp's ring runs either backward: the registry's usp the
    classic one, BurstEngine-USP the burst one)."""
    plan = plan_for(method, options, topo, shape)
    return _method_bytes(method, plan.options, shape, topo.world, shape.seq_len // topo.world,
                         topo.local, acc_elem, rank=rank)


def regather_volume(method: str, options: dict | None, shape: AttnShape, topo: Topo, *,
                    acc_elem: int = 4, rank: int = 0) -> volume.Volume:
    """Bytes ``rank`` sends again in one layer's backward under this project's selective
    checkpointing: ``burst.volume.regather_bytes`` (Ulysses' and USP's forward all-to-alls)."""
    plan = plan_for(method, options, topo, shape)
    kw = {k: plan.options[k] for k in volume.formula_options(method) if k in plan.options}
    return volume.regather_bytes(method, **_vol_kw(shape, topo.world, shape.seq_len // topo.world,
                                                   acc_elem=acc_elem),
                                 node_size=topo.local, causal=shape.causal, window=shape.window,
                                 rank=rank, **kw)


def _usp_a2a(plan: Plan, shape: AttnShape, topo: Topo, acc_elem: int) -> volume.Volume:
    """Bytes of usp's all-to-alls on rank 0: Ulysses' formula over its U ranks (the ring's
    hops are the rest of ``method_volume``)."""
    return _method_bytes("ulysses", {}, shape, plan.ulysses, shape.seq_len // topo.world,
                         topo.local, acc_elem)


# ---------------------------------------------------------------------------------------------
# Kernel work per ring step


def _pair_seconds(hw: Hardware, shape: AttnShape, layout: str, g: int, q_rank: int,
                  k_rank: int, m: int, heads: int, pass_: str) -> tuple[float, bool]:
    """Kernel time of one (query rank, key rank) pair of G ranks with m tokens each, call by
    call from ``burst.masks.plan_pair`` at the efficiency of each call's smaller side; and
    whether the pair has any call (fully masked pairs cost nothing, not even a merge).

    A DENSE call (a window's or a document's edge, at most ``burst.masks.TILE`` a side) runs
    torch's memory-efficient kernel with its mask as a bias (``burst.kernel``: no flash kernel
    takes one), which computes the whole rectangle: its work is the rectangle, priced at the
    same efficiency (that kernel's own rate is not profiled)."""
    calls = _pair_calls(shape.mask, layout, g, q_rank, k_rank, m)
    scale = shape.pair_flops(heads) * (F.BACKWARD_OVER_FORWARD if pass_ == "backward" else 1)
    return sum(hw.attn_seconds(work * scale, side, pass_, causal=causal, dtype=shape.dtype)
               for work, side, causal in calls), bool(calls)


@functools.lru_cache(maxsize=1 << 16)
def _pair_calls(mask: MaskSpec, layout: str, g: int, q_rank: int, k_rank: int,
                m: int) -> tuple[tuple[int, int, bool], ...]:
    """(work in query-key pairs, smaller side, causal) of each call of a pair's plan. Kept here,
    not re-planned per pass: a windowed cell plans every pair (G^2 of them, 4096 at G = 64),
    more than ``burst.masks``' plan cache holds, so its forward and backward passes both missed
    it and planned every pair twice; these summaries are a few dozen bytes per pair."""
    def work(c):
        rows, cols = c.q.stop - c.q.start, c.k.stop - c.k.start
        return rows * cols if c.kind == DENSE else c.visible_pairs

    return tuple((work(c), min(c.q.stop - c.q.start, c.k.stop - c.k.start),
                  c.kind == CAUSAL)
                 for c in plan_pair(mask, layout, g, q_rank, k_rank, m))


def _ranks_bounding(g: int, mask) -> list[int]:
    """The ranks whose work bounds the slowest one at every step. Without a window or
    documents: the first, middle and last (contiguous causal is imbalanced, zigzag and striped
    are not). With a window, every rank: on the zigzag layout it binds the ranks near the
    middle of the second half at later steps, up to 2x the sampled ranks' work (a simulator
    audit). ``_distinct`` picks one rank per geometry of work, so every rank costs little
    more than three. (Documents would need every rank too; no ``AttnShape`` holds them.)"""
    if mask.is_plain:
        return sorted({0, g // 2, g - 1})
    return list(range(g))


Priced = tuple[tuple[tuple[int, int], ...], ...]  # per rank priced: its (q rank, k rank) pairs


def _slowest_rank(hw: Hardware, shape: AttnShape, layout: str, g: int, m: int, heads: int,
                  pass_: str, merge: float, priced: Priced) -> float:
    """Kernel time of the slowest of the ranks ``priced`` at one ring step (``_distinct``):
    each works on its (query rank, key rank) pairs, each pair that has a call followed by a
    merge."""
    worst = 0.0
    for pairs in priced:
        total = 0.0
        for q, k in pairs:
            sec, any_call = _pair_seconds(hw, shape, layout, g, q, k, m, heads, pass_)
            total += sec + (merge if any_call else 0.0)
        worst = max(worst, total)
    return worst


def _distinct(mask, layout: str, g: int, m: int,
              pairs: list[tuple[np.ndarray, np.ndarray]]) -> Priced:
    """The ranks to price at one ring step, where the i-th rank of ``_ranks_bounding`` works on
    the pair (q[i], k[i]) of each (q, k) in ``pairs`` (arrays over those ranks). Pairs of one
    geometry (``burst.masks.pair_geometry``) get the same calls, so of the ranks whose pairs
    have equal geometries one is priced: the same maximum, to the bit, as pricing each (a
    windowed ring of 4096 ranks has a handful of geometries a step; a window of half the
    sequence on 512 ranks priced in 61 s while run pairs that see all of each other kept their
    offsets, 0.4 s with them marked alike). ``AttnShape`` masks hold no documents, so every
    pair has a geometry. Which ranks these are depends on the ring's shape alone, not on the
    hardware: ``_one_way_work`` and ``_two_way_work`` keep them for
    every evaluation of a fit (worked out at each, ``calibrate.fit()`` took 169 s; kept, 18 s)."""
    rows = [pair_geometry(mask, layout, g, q, k, m) for q, k in pairs]
    chosen = np.unique(np.concatenate(rows, axis=-1), axis=0, return_index=True)[1]
    return tuple(tuple((int(q[i]), int(k[i])) for q, k in pairs) for i in chosen)


@functools.lru_cache(maxsize=64)  # (a fit prices 23 rings; one of 4096 ranks keeps ~5 MB)
def _one_way_work(mask, layout: str, members: int, m: int, steps: int,
                  nodes: int) -> tuple[Priced, ...]:
    """``_distinct`` at each of the first ``steps`` steps of a flat or double ring
    (``step_compute``)."""
    local = members // nodes
    r = np.array(_ranks_bounding(members, mask))
    out = []
    for s in range(steps):
        outer, inner = divmod(s, local)
        k = ((r // local - outer) % nodes) * local + (r % local - inner) % local
        out.append(_distinct(mask, layout, members, m, [(r, k)]))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _two_way_work(mask, layout: str, members: int, m: int, span: int, back: int,
                  queries_travel: bool) -> tuple[Priced, ...]:
    """``_distinct`` at each step of a ring that sends its blocks both ways
    (``_two_way_compute``)."""
    r = np.array(_ranks_bounding(members, mask))
    out = []
    for t in range(max(span, back) + 1):
        pairs = []
        for other, works in ((r - t, t <= span), (r + t, 0 < t <= back)):
            if works:
                q, k = (2 * r - other, r) if queries_travel else (r, other)
                pairs.append((q % members, k % members))
        out.append(_distinct(mask, layout, members, m, pairs))
    return tuple(out)


def _merge_seconds(hw: Hardware, shape: AttnShape, m: int, heads: int, kv_heads: int,
                   pass_: str) -> float:
    """Memory-bound accumulator traffic of one step (fp32 partial results, DESIGN.md 3)."""
    bm, d = shape.batch * m, shape.head_dim
    acc = acc_bytes(shape.elem)
    if pass_ == "forward":  # read o_r, read+write O, lse
        nbytes = bm * heads * (d * (shape.elem + 2 * acc) + 3 * acc)
    else:  # read+write the dq and dk/dv partial sums
        nbytes = bm * (heads + 2 * kv_heads) * d * 2 * acc
    return hw.hbm_seconds(nbytes)


def step_compute(hw: Hardware, shape: AttnShape, layout: str, members: int, m: int, heads: int,
                 kv_heads: int, pass_: str, steps: int | None = None,
                 nodes: int = 1) -> list[float]:
    """Kernel time of the slowest rank at each ring step 0..members-1 (0 = its own block), or
    at the first ``steps`` of them (a ring a window shortens: the steps it never takes would
    plan fully masked pairs, 15x the work of a 256-rank cell with 17 steps). Each rank works
    on the blocks ``burst.ring.visit_order`` gives it: r - s on a flat ring; on a double ring
    of ``nodes`` nodes of L, at step s = outer m x L + inner i, the block of node n - m and
    local rank l - i (a review: pricing it as r - s took the previous node's block for l < i,
    and with a window on the contiguous layout timed the double ring 1.3-1.9x too fast)."""
    merge = _merge_seconds(hw, shape, m, heads, kv_heads, pass_)
    work = _one_way_work(shape.mask, layout, members, m, members if steps is None else steps,
                         nodes)
    return [_slowest_rank(hw, shape, layout, members, m, heads, pass_, merge, priced)
            for priced in work]


def ring_reach_of(shape: AttnShape, layout: str, members: int, m: int,
                  nodes: int = 1) -> tuple[int, int]:
    """(span, back) of a ring of ``members`` ranks of ``m`` tokens (``burst.masks.ring_reach``)."""
    if shape.window is None:  # (the pair tests would find the same, in O(G^2))
        return members - 1, 0
    return ring_reach(shape.mask, layout, members, m, nodes)


def _two_way_compute(hw: Hardware, shape: AttnShape, layout: str, members: int, m: int,
                     heads: int, kv_heads: int, pass_: str, span: int, back: int,
                     queries_travel: bool) -> list[float]:
    """Kernel time of the slowest rank at each step t of a ring that sends its blocks both
    ways (``burst.ring._flat`` with ``back`` > 0), summed per rank before the slowest is taken:
    rank r's queries against the keys of r - t (t <= span) and of r + t (1 <= t <= back); where
    the queries travel (the burst backward), the queries of r + t and of r - t against r's keys."""
    merge = _merge_seconds(hw, shape, m, heads, kv_heads, pass_)
    work = _two_way_work(shape.mask, layout, members, m, span, back, queries_travel)
    return [_slowest_rank(hw, shape, layout, members, m, heads, pass_, merge, priced)
            for priced in work]


# ---------------------------------------------------------------------------------------------
# Phase times


def _ring_hops(span: int, pay: float, acc: float | None,
               first: int = 0) -> tuple[list[float], float]:
    """Bytes each of steps 0..span sends (``burst.ring._Chain``), and the last
    accumulator's hop home: each step's payload goes out while it computes (none after the
    last step); in the backward the accumulator of each working step (``first``..span) hops
    one step behind on the same link and the last then hops home. No hop without a second
    member."""
    hops = [(pay if t < span else 0.0) + (acc if acc is not None and first < t <= span else 0.0)
            for t in range(span + 1)]
    return hops, (acc if acc is not None and span > 0 else 0.0)


Hop = Callable[..., float]  # hop((bytes, offset), ...): seconds of one step's sends


def _ring_pass(steps: list[float], span: int, hop: Hop, pay: float,
               acc: float | None = None) -> float:
    """Steps 0..span of a ring: each takes max(compute, its hop) (``_ring_hops``); each hop goes
    to the next member (offset 1), the last accumulator's straight home, ``span`` members back
    (``burst.ring._Chain``: the next member again when the ring goes all the way round)."""
    hops, end = _ring_hops(span, pay, acc)
    return (sum(max(c, hop((h, 1))) for c, h in zip(steps[:span + 1], hops, strict=True))
            + hop((end, -span)))


def _two_way_pass(steps: list[float], span: int, back: int, hop: Hop, pay: float,
                  acc: float | None = None) -> float:
    """A flat ring that sends its blocks ``span`` hops one way and ``back`` hops the other at
    the same steps (``burst.ring._flat``): each step takes max(compute, ``hop`` of both ways'
    sends); a chain that ends first sends its last accumulator home, ``span`` (``back``) members
    away, in the next step."""
    last = max(span, back)
    chains = [(_ring_hops(span, pay, acc), 1, span),
              (_ring_hops(back, pay, acc, first=1), -1, back)]

    def sent(chain, t):
        (hops, end), way, reach = chain
        if t < len(hops):
            return hops[t], way
        return (end if t == len(hops) else 0.0), -way * reach

    total = sum(max(steps[t], hop(*(sent(c, t) for c in chains))) for t in range(last + 1))
    return total + hop(*(sent(c, last + 1) for c in chains))


@functools.lru_cache(maxsize=1024)
def _crossings(offsets: tuple[int, ...], members: int, rings: int,
               local: int) -> frozenset[tuple[tuple[bool, ...], int]]:
    """Which of a step's sends cross nodes, for every GPU of a job of ``rings`` flat rings of
    ``members`` ranks each (node-major, ``local`` GPUs a node): ring j holds the ranks j,
    j + rings, j + 2 rings, ... (USP's rings across its Ulysses groups; one ring: every rank
    in order), and its member i sends to member i + offset of the same ring. Returns the
    distinct (crosses per send, GPUs of its node that cross in the step) pairs."""
    node = [r // local for r in range(members * rings)]
    sends = [tuple(node[((r // rings + o) % members) * rings + r % rings] != node[r]
                   for o in offsets) for r in range(members * rings)]
    crossing = [0] * (node[-1] + 1)
    for r, s in enumerate(sends):
        crossing[node[r]] += any(s)
    return frozenset((s, crossing[node[r]]) for r, s in enumerate(sends))


def _flat_hop_seconds(hw: Hardware, transfers, members: int, rings: int,
                      local: int) -> float:
    """One step's sends of ``rings`` flat rings of ``members`` ranks side by side
    (``_crossings``): ``transfers`` are (bytes, offset) pairs, each sent by every member to the
    member ``offset`` places on. A GPU sends what stays on its node over its NVLink and what
    leaves it through its share of the NICs, shared with every GPU of its node that crosses
    in the same step; the slowest GPU prices the step. A regular hop crosses from one member
    of each ring per node; a shortened ring's last accumulators, S members back, from every
    member whose owner lies on another node (a review: priced as one GPU's crossing, that hop
    was up to 19.5% optimistic)."""
    transfers = [(nbytes, offset) for nbytes, offset in transfers if nbytes > 0]
    if not transfers:
        return 0.0
    worst = 0.0
    for crosses, senders in _crossings(tuple(o for _, o in transfers), members, rings, local):
        inter = sum(nbytes for (nbytes, _), x in zip(transfers, crosses, strict=True) if x)
        intra = sum(nbytes for nbytes, _ in transfers) - inter
        worst = max(worst, hw.link_seconds(intra, "intra"),
                    hw.link_seconds(inter, "inter", senders))
    return worst


def _double_ring(steps: list[float], nodes: int, local: int, hop_in: Hop,
                 hop_out: Callable[[float], float], pay: float, acc: float | None,
                 shared: Callable[[float, float], float] | None = None) -> float:
    """M rounds (``burst.ring._double``): each passes an outer block around the inner ring while
    the next outer block and the previous round's accumulators cross to the next node; the last
    round's accumulators then cross home. ``shared(inner bytes, outer bytes)``: where both
    rings use the same links (both inside one node, or an inner ring that crosses nodes too),
    its hops and the outer hop share them, a floor on each round."""
    total = 0.0
    hops, home = _ring_hops(local - 1, pay, acc)
    inner_bytes = sum(hops) + home
    for r in range(nodes):
        inner = _ring_pass(steps[r * local:(r + 1) * local], local - 1, hop_in, pay, acc)
        crossing = (pay if r < nodes - 1 else 0.0) + (acc if acc is not None and r else 0.0)
        total += max(inner, hop_out(crossing),
                     shared(inner_bytes, crossing) if shared else 0.0)
    return total + (hop_out(acc) if acc is not None else 0.0)


def _ring_phases(hw, shape, topo, plan, members, m, heads, kv_heads, *, rings: int = 1,
                 efficiency: float = 1.0, acc_elem: int = 4):
    """Forward and backward seconds of a (flat or double) ring of ``members`` ranks holding
    ``m`` tokens of ``heads`` (``kv_heads``) heads each, beside ``rings - 1`` others (USP: one
    per rank of a Ulysses group, ``_crossings``); its hops carry the bytes of
    ``burst.volume.ring_hop_bytes``, those ``burst.volume.method_bytes`` counts (a test holds
    a ring bound by its links to exactly those bytes over the bandwidth)."""
    out = {}
    double = bool(plan.ring_local) and plan.ring_local < members
    nodes = members // plan.ring_local if double else 1
    span, back = ring_reach_of(shape, plan.layout, members, m, nodes)
    grad = shape.elem if plan.options.get("grad_acc") == "input" else None
    hop_kw = dict(batch=shape.batch, seq_local=m, heads=heads, kv_heads=kv_heads,
                  head_dim=shape.head_dim, elem=shape.elem, acc_elem=acc_elem, grad_elem=grad)
    kv = volume.ring_hop_bytes("ring", **hop_kw)[0]
    pay, acc = volume.ring_hop_bytes(plan.backward, **hop_kw)
    if double:
        local = plan.ring_local
        # hops run in lockstep, so the slowest link prices each: an inner ring longer than
        # a node, or one whose windows straddle node boundaries (L = 6 on nodes of 8),
        # crosses a NIC; outer hops leave the node for min(L, node) of its GPUs at once
        # (all of them when L >= node)
        inner = "inter" if local > topo.local or topo.local % local else "intra"
        outer = "inter" if topo.world > topo.local else "intra"

        def hop_in(sent):  # (the inner ring's last hop goes home to the next member)
            return hw.link_seconds(sent[0], inner)

        def hop_out(nbytes):
            return hw.link_seconds(nbytes, outer, min(local, topo.local))

        shared = None
        if inner == outer == "intra":
            def shared(inner_bytes, outer_bytes):
                # the whole double ring on one node: each GPU sends its inner and its outer
                # hops through its own NVLink, whose bandwidth they share
                return hw.link_seconds(inner_bytes + outer_bytes, "intra")
        elif inner == outer == "inter":
            senders = min(local, topo.local)

            def shared(inner_bytes, outer_bytes):
                # one GPU per node sends the inner ring's crossing hops while every sender
                # makes its outer hop: the node's pooled NICs carry both, and that GPU gets at
                # most one NIC (hw.inter_gbps)
                return max(hw.link_seconds(outer_bytes + inner_bytes / senders, "inter",
                                           senders),
                           hw.link_seconds(outer_bytes + inner_bytes, "inter", 1))
    else:
        def hop_in(*sent):
            return _flat_hop_seconds(hw, sent, members, rings, topo.local)

    for pass_ in ("forward", "backward"):
        p, a = (kv, None) if pass_ == "forward" else (pay, acc)
        if back:
            steps = [c / efficiency for c in
                     _two_way_compute(hw, shape, plan.layout, members, m, heads, kv_heads, pass_,
                                      span, back, pass_ == "backward" and plan.backward == "burst")]
            out[pass_] = (_two_way_pass(steps, span, back, hop_in, p, a), sum(steps))
            continue
        steps = [c / efficiency for c in
                 step_compute(hw, shape, plan.layout, members, m, heads, kv_heads, pass_,
                              None if double else span + 1, nodes)]
        t = (_double_ring(steps, nodes, plan.ring_local, hop_in, hop_out, p, a, shared)
             if double else _ring_pass(steps, span, hop_in, p, a))
        out[pass_] = (t, sum(steps[:span + 1]))
    return out


def _whole_sequence_seconds(hw: Hardware, shape: AttnShape, layout: str, g: int, heads: int,
                            pass_: str) -> float:
    """Kernel time of the busiest rank when its queries meet the whole sequence (all-gather:
    G ranks of n tokens; Ulysses and TP: one rank of N), from the same kernel plans as the ring
    (windows and documents are tiled as ``burst.masks.plan_pair`` runs them)."""
    n = shape.seq_len // g
    keys = np.arange(g)

    def busy(r: int) -> float:  # pairs with no call cost nothing: not priced one by one
        empty = pair_empty(shape.mask, layout, g, np.full(g, r), keys, n)
        return sum(_pair_seconds(hw, shape, layout, g, r, int(k), n, heads, pass_)[0]
                   for k in keys[~empty])

    return max(busy(r) for r in _ranks_bounding(g, shape.mask))


COLLECTIVES = ("all_to_all", "gather")


def collective_seconds(hw: Hardware, nbytes: float, group: int, topo: Topo,
                       kind: str = "all_to_all") -> float:
    """A collective over a group of consecutive ranks, ``nbytes`` sent per rank (burst.comm's
    convention: the group's other members' shares).

    ``all_to_all``: every rank's off-node share is its own data, so it all crosses the NICs
    while every GPU of the node sends. ``gather`` (all-gather, reduce-scatter) across nodes:
    NCCL's ring, whose every link, the node's way out included, carries all but one of the G
    shards (its channels spread over the node's NICs): G - 1 shards, ``nbytes``, through the
    node's NICs, so its bus bandwidth is theirs (DESIGN.md 4). (A hierarchical algorithm,
    each shard into a node once, would move G - L; NCCL's ring does not.)"""
    if kind not in COLLECTIVES:
        raise ValueError(f"kind={kind!r}; valid: {', '.join(COLLECTIVES)}")
    if group <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all_to_all":
        return max(_a2a_seconds(hw, nbytes, group, topo, off, senders)
                   for off, senders in _a2a_members(group, topo))
    on_node = min(group, topo.local)
    if group <= on_node:
        return _a2a_seconds(hw, nbytes, group, topo, 0, 1)
    # each of the node's GPUs puts 1/on_node of the ring's through the NICs
    nic_bytes = nbytes / on_node
    return max(hw.link_seconds(nbytes - nic_bytes, "intra"),
               hw.link_seconds(nic_bytes, "inter", on_node)) + _latency(hw, group, True)


def _latency(hw: Hardware, group: int, crosses: bool) -> float:
    return (group - 1) * 1e-6 * (hw.nic_latency_us if crosses else hw.nvlink_latency_us) / 4


def _a2a_members(group: int, topo: Topo) -> set[tuple[int, int]]:
    """(members on other nodes, the GPUs of its node that cross nodes at once) of every rank,
    the world tiled into groups of ``group`` consecutive ranks that all run at once. A group
    that straddles a node boundary (4 ranks on nodes of 6: ranks 4-7) sends part of every
    member's share through the NICs, though the group is no larger than a node."""
    if topo.world % group:
        raise ValueError(f"groups of {group} ranks do not tile world={topo.world}")
    node = [r // topo.local for r in range(topo.world)]
    off = [sum(node[q] != node[r] for q in range(r - r % group, r - r % group + group))
           for r in range(topo.world)]
    crossing = [0] * topo.nodes
    for r in range(topo.world):
        crossing[node[r]] += off[r] > 0
    return {(off[r], crossing[node[r]]) for r in range(topo.world)}


def _a2a_seconds(hw: Hardware, nbytes: float, group: int, topo: Topo, off: int,
                 senders: int) -> float:
    """One member's all-to-all: its ``off`` of ``group - 1`` shares to other nodes cross the
    NICs, shared by the ``senders`` GPUs of its node that cross at once; the rest NVLink."""
    nic_bytes = nbytes * off / (group - 1)
    intra = hw.link_seconds(nbytes - nic_bytes, "intra") if nbytes > nic_bytes else 0.0
    inter = hw.link_seconds(nic_bytes, "inter", senders) if nic_bytes > 0 else 0.0
    return max(intra, inter) + _latency(hw, group, off > 0)


MAX_PLANNED_TOKENS = 1 << 24
"""The most tokens a side that a masked (windowed) cell's kernel plans are priced at. Planning
is per token (``burst.masks.plan_pair`` tiles key-bound arrays): about 80 bytes of host memory
and 0.8 microseconds per token (measured here: 2**24 tokens a side, 1.3 GB and 12 s; 2**25,
2.6 GB and 27 s), so a tiny model that never runs out of GPU memory could exhaust the host's."""


def planned_tokens(plan: Plan, shape: AttnShape, topo: Topo) -> int:
    """Tokens a side of the (query rank, key rank) pairs that ``attention_timing`` plans: a
    ring's block (USP's ring: U ranks' tokens, the block its ring is priced on), the
    all-gather's rank, Ulysses' and TP's whole sequence."""
    if plan.kind in ("ulysses", "tp"):
        return shape.seq_len
    return shape.seq_len // topo.world * (plan.ulysses if plan.kind == "usp" else 1)


def pricing_problem(plan: Plan, shape: AttnShape, topo: Topo) -> str | None:
    """Why a cell's time cannot be priced here (a masked cell past ``MAX_PLANNED_TOKENS``),
    else None. Its memory can: ``suites.simulate.predict`` still says OOM where it is one."""
    n = planned_tokens(plan, shape, topo)
    if shape.mask.is_plain or n <= MAX_PLANNED_TOKENS:
        return None
    return (f"not priced: a windowed {plan.kind} plans its kernel tiles per token, here {n} "
            f"tokens a side, past the simulator's {MAX_PLANNED_TOKENS} (about 80 bytes of host "
            f"memory and 0.8 us a token: {n * 80 / 2**30:.1f} GiB); a shorter sequence"
            + ("" if plan.kind in ("ulysses", "tp") else " or more ranks") + " is priced")


def attention_timing(hw: Hardware, method: str, options: dict | None, shape: AttnShape,
                     topo: Topo, *, acc_elem: int = 4, efficiency: float = 1.0) -> AttnTiming:
    """Seconds of one attention layer's forward and backward on the slowest rank.

    ``efficiency`` scales the kernel work of every step (a system whose attention computes
    slower than the model, ``Implementation.attention_efficiency``); transfers are not scaled, so
    where a step waits for its hop the slower compute stays hidden."""
    plan = plan_for(method, options, topo, shape)
    problem = pricing_problem(plan, shape, topo)
    if problem:
        raise ValueError(problem)
    g, n = topo.world, shape.seq_len // topo.world
    if plan.kind == "ring":
        vol = method_volume(method, options, shape, topo, acc_elem=acc_elem)
        ph = _ring_phases(hw, shape, topo, plan, g, n, shape.heads, shape.kv_heads,
                          efficiency=efficiency, acc_elem=acc_elem)
        fwd, bwd = ph["forward"], ph["backward"]
    elif plan.kind == "usp":
        u = plan.ulysses
        vol = method_volume(method, options, shape, topo, acc_elem=acc_elem)
        a2a = _usp_a2a(plan, shape, topo, acc_elem)
        hu = shape.heads // u
        hku = max(1, volume.ulysses_kv_heads(shape.kv_heads, u) // u)
        sub = dataclasses.replace(shape, heads=hu, kv_heads=hku)
        inner = Plan("ring", layout=plan.layout, backward=plan.backward,
                     options={"grad_acc": plan.options.get("grad_acc", "fp32")})
        # every rank of a Ulysses group runs its own ring: U rings side by side
        ph = _ring_phases(hw, sub, topo, inner, g // u, planned_tokens(plan, shape, topo), hu,
                          hku, rings=u, efficiency=efficiency, acc_elem=acc_elem)
        fwd, bwd = ((ph[p][0] + collective_seconds(hw, a2a.sent(p), u, topo), ph[p][1])
                    for p in ("forward", "backward"))
    elif plan.kind in ("ulysses", "tp", "allgather"):
        vol = method_volume(method, options, shape, topo, acc_elem=acc_elem)
        if plan.kind == "allgather":  # every rank's queries against the gathered K/V, all heads
            layout, ranks, heads = plan.layout, g, shape.heads
        else:  # the whole sequence on one rank, for its heads (runnable cells divide evenly)
            layout, ranks, heads = "contiguous", 1, -(-shape.heads // plan.ulysses)
        cf, cb = (_whole_sequence_seconds(hw, shape, layout, ranks, heads, p) / efficiency
                  for p in ("forward", "backward"))
        kind = "all_to_all" if plan.kind == "ulysses" else "gather"
        fwd = (cf + collective_seconds(hw, vol.sent("forward"), g, topo, kind), cf)
        bwd = (cb + collective_seconds(hw, vol.sent("backward"), g, topo, kind), cb)
    else:  # pragma: no cover - plan_for rejects unknown kinds
        raise AssertionError(plan.kind)

    def rank_volume(rank: int) -> volume.Volume:  # method_volume with the plan made once
        return vol if rank == 0 else _method_bytes(method, plan.options, shape, g, n,
                                                   topo.local, acc_elem, rank=rank)

    return AttnTiming(forward_s=fwd[0], backward_s=bwd[0], compute_forward_s=fwd[1],
                      compute_backward_s=bwd[1], plan=plan, rank_volume=rank_volume, world=g)
