"""Analytic communication volume per rank: the formulas the byte counter must reproduce.

Every figure here is bytes *sent* by one rank in one attention layer, split by phase
(forward/backward) and link (intra/inter node), with q, k and v all needing gradients (the
training case; Ulysses' all-to-alls skip the gradients autograd does not ask for, the rings
always carry them). Received bytes equal sent bytes for every rank
of a ring or a symmetric collective. Tests compare these with ``burst.comm.count_bytes`` on real
gloo runs; the simulator (``suites``) prices them with link bandwidths. Not in the formulas: the
int32 flag a ``burst_attn(..., return_lse=True)`` call on a fused kernel backend all-reduces in
the backward, over its ring (a double ring: its inner rings, then across them;
``burst.attention._backend_for_dlse``; the counter counts it).

Units (DESIGN.md 3): b*n = batch * local tokens, H heads, Hk kv heads, D head dim, e = element
size of the inputs, a = element size of accumulators (fp32 = 4; float64 inputs: 8).
  K+V block  kv   = 2*b*n*Hk*D*e          Q+dO block  qdo  = 2*b*n*H*D*e
  D+LSE      dl   = 2*b*n*H*a             dQ          dq   = b*n*H*D*a
  dK+dV      dkdv = 2*b*n*Hk*D*a
Flat ring of G ranks (span S = G-1 unless a window truncates it):
  forward S*kv; burst backward S*(qdo+dl) + (S+1)*dq; ring backward S*kv + (S+1)*dkdv
  (no accumulator hops when S = 0). A window that needs keys on both sides may send the blocks
  B hops the other way as well (``burst.masks.ring_reach``): B more payload and B more
  accumulator hops (my own block's accumulator stays with the first chain).
Double ring, M nodes x L ranks: the payload makes M(L-1) intra + (M-1) inter hops, the
accumulators M*L intra + M inter hops (a mask that a flat ring serves in at most M - 1 steps
each way runs on that flat ring: ``burst.masks.flat_ring_suffices``).
For MHA with D = 128 and one dtype throughout, burst backward ~ 3G units vs ring ~ 4G: 25% fewer.

``method_bytes(name, ...)`` gives the same for every registry method (``baselines``), under the
counting convention of ``burst.comm`` (a collective counts the logical peer-to-peer bytes: an
all-gather of an X-byte shard sends X to every other member). Per rank, G members, per peer:
  ring, zigzag_ring, striped_ring, double_ring: the ring formulas above with backward="ring".
  allgather (Llama 3 CP, as TransformerEngine implements it): forward all-gathers K and V
    (kv per peer); backward all-gathers them again (only the local shards are saved) and
    reduce-scatters dK, dV in the input dtype: forward (G-1)*kv, backward 2*(G-1)*kv.
  ulysses: four all-to-alls each way, each sending (G-1)/G of a local tensor: forward Q, K, V
    in and O out, backward dO in and dQ, dK, dV out. K/V count Hk' = Hk heads, or G heads when
    Hk < G (kv heads are replicated up to the degree, see ``baselines.ulysses``). The engine's
    selective checkpointing runs the forward's again in backward (``regather_bytes``; USP's
    too, over its Ulysses group).
  usp: Ulysses inside groups of U consecutive ranks, then a ring of R = G/U ranks (members
    u, U+u, ...) on the head-sharded, U-times longer blocks: a ring unit is U*n tokens x Hk'/U
    heads, i.e. the same bytes as Hk' heads of n tokens.
  tp (Megatron TP + sequence parallelism, block level, hidden size E, x = b*n*E*e per peer):
    forward all-gather x + reduce-scatter y = 2*(G-1)*x; backward all-gather dy, all-gather x
    again (Megatron keeps only the local input for the weight gradient) and reduce-scatter dx
    = 3*(G-1)*x.
  ring_flash_attn, yunchang: the packages' own rings move what ``ring`` / ``usp`` move (K/V in
    the input dtype, dK/dV in fp32, no ring truncation); their bytes are not counted by
    ``burst.comm`` (they call torch.distributed themselves), so these are the formulas only.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

from burst.comm import ranks_per_node_ok, ranks_per_node_problem, ring_shape
from burst.layout import heads_problem, plain_integer
from burst.masks import MaskSpec, flat_ring_suffices, ring_reach
from burst.ring import check_reach

__all__ = ["METHODS", "Volume", "auto_backward", "formula_options", "method_bytes",
           "regather_bytes", "ring_attention_bytes", "ring_hop_bytes", "ulysses_kv_heads",
           "usp_auto_backward"]


@dataclass
class Volume:
    """Bytes sent by one rank, keyed by (phase, link)."""

    by: dict = field(default_factory=lambda: defaultdict(int))

    def add(self, phase: str, link: str, nbytes: float) -> None:
        self.by[(phase, link)] += int(nbytes)

    def sent(self, phase: str | None = None, link: str | None = None) -> int:
        return sum(v for (p, lk), v in self.by.items()
                   if (phase is None or p == phase) and (link is None or lk == link))


def _units(batch, seq_local, heads, kv_heads, head_dim, elem, acc_elem, grad_elem=None):
    bn, grad = batch * seq_local, grad_elem or acc_elem
    return dict(kv=2 * bn * kv_heads * head_dim * elem, qdo=2 * bn * heads * head_dim * elem,
                dl=2 * bn * heads * acc_elem, dq=bn * heads * head_dim * grad,
                dkdv=2 * bn * kv_heads * head_dim * grad)


def ring_hop_bytes(backward: str, *, batch: int, seq_local: int, heads: int, kv_heads: int,
                   head_dim: int, elem: int, acc_elem: int = 4,
                   grad_elem: int | None = None) -> tuple[int, int]:
    """(payload, accumulator) bytes of one backward ring hop: Q, dO, D, LSE and the trailing dQ
    (burst), or K, V and the trailing dK, dV (ring). The forward's hop is K, V."""
    u = _units(batch, seq_local, heads, kv_heads, head_dim, elem, acc_elem, grad_elem)
    return (u["qdo"] + u["dl"], u["dq"]) if backward == "burst" else (u["kv"], u["dkdv"])


def auto_backward(**shape) -> str:
    """burst_attn's backward="auto": the scheme whose backward sends fewer bytes for the whole
    ring (``ring_attention_bytes``' shape arguments; burst on a tie)."""
    by = {b: ring_attention_bytes(**shape, backward=b).sent("backward") for b in ("burst", "ring")}
    return "burst" if by["burst"] <= by["ring"] else "ring"


def ring_attention_bytes(*, world: int, batch: int, seq_local: int, heads: int, kv_heads: int,
                         head_dim: int, elem: int, acc_elem: int = 4, backward: str = "burst",
                         ranks_per_node: int | None = None, node_size: int | None = None,
                         rank: int = 0, span: int | None = None, back: int = 0,
                         grad_elem: int | None = None) -> Volume:
    """Bytes one rank sends in a (Burst or ring) attention layer.

    ``grad_elem``: bytes per element of the travelling gradient accumulators (dQ, dK/dV);
    default ``acc_elem`` (D and LSE always travel in ``acc_elem``).

    ``span`` and ``back`` shorten a flat ring (``burst.masks.ring_reach``: blocks go ``span``
    hops one way and ``back`` hops the other).

    ``ranks_per_node`` selects the double ring (None: flat). ``node_size`` is the physical node
    that labels a flat ring's links (default: one node; a node per rank with
    ``ranks_per_node=1``). A double ring's hops are labelled by its own rings, inner "intra"
    and outer "inter", whatever ``node_size``; ``method_bytes`` relabels them by the physical
    nodes where the two differ.
    """
    if backward not in ("burst", "ring"):
        raise ValueError(f"backward={backward!r}: expected 'burst' or 'ring'")
    ranks_per_node, node_size = plain_integer(ranks_per_node), plain_integer(node_size)
    for name, value in (("ranks_per_node", ranks_per_node), ("node_size", node_size)):
        if why := ranks_per_node_problem(world, value, name):  # (-1 gave negative bytes)
            raise ValueError(why)
    hop = dict(batch=batch, seq_local=seq_local, heads=heads, kv_heads=kv_heads,
               head_dim=head_dim, elem=elem, acc_elem=acc_elem, grad_elem=grad_elem)
    kv = ring_hop_bytes("ring", **hop)[0]
    pay, acc = ring_hop_bytes(backward, **hop)
    vol = Volume()
    g = world
    if ranks_per_node == 1:  # a flat ring with every hop between nodes (burst.comm.ring_shape)
        node_size = node_size or 1
    if ring_shape(g, ranks_per_node)[0] == 1:
        s = g - 1 if span is None else span
        check_reach(g, s, back)
        size = node_size or g

        def link_to(offset):
            return "intra" if rank // size == ((rank + offset) % g) // size else "inter"

        _flat_ring_into(vol, link_to, s, back, kv, backward, pay, acc)
        return vol
    if back:
        raise ValueError(f"back={back}: a double ring visits all {g} blocks one way")
    m, l_ = g // ranks_per_node, ranks_per_node
    vol.add("forward", "intra", m * (l_ - 1) * kv)
    vol.add("forward", "inter", (m - 1) * kv)
    vol.add("backward", "intra", m * (l_ - 1) * pay + m * l_ * acc)
    vol.add("backward", "inter", (m - 1) * pay + m * acc)
    return vol


# ---------------------------------------------------------------------------------------------
# Every registry method (``baselines.registry``), keyed by name.


@dataclass(frozen=True)
class _Case:
    world: int
    batch: int
    seq_local: int
    heads: int
    kv_heads: int
    head_dim: int
    elem: int
    acc_elem: int
    grad_elem: int | None = None  # travelling gradient accumulators; None: acc_elem
    rank: int = 0
    node_size: int | None = None
    causal: bool = False
    window: tuple[int, int] | None = None
    cu_seqlens: tuple[int, ...] | None = None

    def __post_init__(self):  # the shapes the methods refuse get no byte count either
        sizes = {k: getattr(self, k) for k in ("world", "batch", "seq_local", "heads",
                                                "kv_heads", "head_dim", "elem", "acc_elem")}
        if bad := [f"{k}={v!r}" for k, v in sizes.items()
                   if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1]:
            raise ValueError(f"byte count: {', '.join(bad)}: expected whole numbers >= 1")
        if why := heads_problem(self.heads, self.kv_heads):
            raise ValueError(f"byte count: {why}")

    @property
    def bn(self) -> int:
        return self.batch * self.seq_local

    def shape(self) -> dict:
        return dict(world=self.world, batch=self.batch, seq_local=self.seq_local,
                    heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                    elem=self.elem, acc_elem=self.acc_elem, grad_elem=self.grad_elem)

    def link(self, peer: int) -> str:
        if self.node_size is None:
            return "intra"
        return "intra" if self.rank // self.node_size == peer // self.node_size else "inter"

    def to_peers(self, vol: Volume, phase: str, members: Sequence[int], nbytes: float) -> None:
        """A collective over ``members`` that sends ``nbytes`` to each other member."""
        for p in members:
            if p != self.rank:
                vol.add(phase, self.link(p), nbytes)

    @property
    def mask(self) -> MaskSpec:
        return MaskSpec(causal=self.causal, window=self.window, cu_seqlens=self.cu_seqlens)

    def reach(self, world: int, seq_local: int, layout: str, nodes: int = 1) -> tuple[int, int]:
        """(span, back) of the ring (``burst.masks.ring_reach``): (G-1, 0) unless a window
        cuts it."""
        return ring_reach(self.mask, layout, world, seq_local, nodes)

    def flat_suffices(self, layout: str, nodes: int) -> bool:
        """A double ring that runs flat for this mask (``burst.masks.flat_ring_suffices``)."""
        return flat_ring_suffices(self.mask, layout, self.world, self.seq_local, nodes)


def _ring_nodes(c: _Case, layout: str, ranks_per_node: int | None,
                truncate: bool = True) -> int | None:
    """The ranks_per_node of the ring burst_attn runs: None (flat) where the mask lets a flat
    ring serve a double ring's group (``burst.masks.flat_ring_suffices``; ``truncate`` False:
    the GPU packages' rings, never shortened)."""
    if not ranks_per_node_ok(c.world, ranks_per_node):
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide the group of "
                         f"{c.world} ranks")
    flat = truncate and c.flat_suffices(layout, ring_shape(c.world, ranks_per_node)[0])
    return None if flat else ranks_per_node


def _ring_like(c: _Case, backward: str, layout: str, ranks_per_node: int | None,
               truncate: bool = True) -> Volume:
    ranks_per_node = _ring_nodes(c, layout, ranks_per_node, truncate)
    nodes = ring_shape(c.world, ranks_per_node)[0]
    span, back = c.reach(c.world, c.seq_local, layout, nodes) if truncate else (None, 0)
    # node_size None is one node here (method_bytes), also for ranks_per_node=1, whose own
    # default in ring_attention_bytes is a node per rank
    vol = ring_attention_bytes(**c.shape(), backward=backward, ranks_per_node=ranks_per_node,
                               node_size=c.node_size or c.world, rank=c.rank, span=span,
                               back=back)
    if nodes == 1 or c.node_size == ranks_per_node:
        return vol
    # ring_attention_bytes labels a double ring's hops by its own rings; relabel them by the
    # physical nodes: inner-ring hops go to (node, local+1), outer-ring hops to (node+1, local)
    node, loc = divmod(c.rank, ranks_per_node)
    peer = {"intra": node * ranks_per_node + (loc + 1) % ranks_per_node,
            "inter": (node + 1) * ranks_per_node % c.world + loc}
    out = Volume()
    for (phase, ring_link), nbytes in vol.by.items():
        out.add(phase, c.link(peer[ring_link]), nbytes)
    return out


GRAD_ACC = ("fp32", "input")


def _grads_in(c: _Case, grad_acc: str) -> _Case:
    """The case with the travelling gradient accumulators in fp32 (``acc_elem``) or in the
    input dtype (TransformerEngine's ring: dK/dV travel with K/V in kv's dtype)."""
    if grad_acc not in GRAD_ACC:
        raise ValueError(f"grad_acc={grad_acc!r}; valid: {', '.join(GRAD_ACC)}")
    return c if grad_acc == "fp32" else dataclasses.replace(c, grad_elem=c.elem)


def _burst(c: _Case, *, backward: str = "auto", layout: str = "zigzag",
           ranks_per_node: int | None = None, grad_acc: str = "fp32") -> Volume:
    c = _grads_in(c, grad_acc)
    if backward == "auto":  # what burst_attn picks (its gradient sums in grad_acc's dtype),
        # for the ring it runs
        backward = auto_backward(**c.shape(), ranks_per_node=_ring_nodes(c, layout,
                                                                         ranks_per_node))
    return _ring_like(c, backward, layout, ranks_per_node)


def _ring(c: _Case, *, layout: str = "contiguous", grad_acc: str = "fp32") -> Volume:
    return _ring_like(_grads_in(c, grad_acc), "ring", layout, None)


def _zigzag_ring(c: _Case, *, layout: str = "zigzag", grad_acc: str = "fp32") -> Volume:
    return _ring_like(_grads_in(c, grad_acc), "ring", layout, None)


def _striped_ring(c: _Case, *, layout: str = "striped", grad_acc: str = "fp32") -> Volume:
    return _ring_like(_grads_in(c, grad_acc), "ring", layout, None)


def _double_ring(c: _Case, *, layout: str = "zigzag", ranks_per_node: int | None = 2) -> Volume:
    return _ring_like(c, "ring", layout, ranks_per_node)


def _allgather(c: _Case, *, layout: str = "zigzag") -> Volume:
    kv = 2 * c.bn * c.kv_heads * c.head_dim * c.elem
    vol, everyone = Volume(), range(c.world)
    c.to_peers(vol, "forward", everyone, kv)  # all-gather K, V
    c.to_peers(vol, "backward", everyone, kv)  # all-gather K, V again
    c.to_peers(vol, "backward", everyone, kv)  # reduce-scatter dK, dV (input dtype)
    return vol


def ulysses_kv_heads(kv_heads: int, degree: int) -> int:
    """K/V heads that enter the all-to-all: Hk, or the degree when Hk < degree (replicated)."""
    if kv_heads % degree == 0:
        return kv_heads
    if degree % kv_heads == 0:
        return degree
    raise ValueError(f"{kv_heads} kv heads and ulysses degree {degree}: one must divide the "
                     "other (kv heads are split across, or replicated up to, the degree)")


def _ulysses_into(vol: Volume, c: _Case, members: Sequence[int],
                  regather: bool = False) -> None:
    """Ulysses' all-to-alls over ``members``; ``regather``: the forward's alone, which the
    engine's selective checkpointing runs again in backward (``regather_bytes``)."""
    g = len(members)
    if c.heads % g:
        raise ValueError(f"ulysses degree {g} does not divide {c.heads} query heads")
    hk = ulysses_kv_heads(c.kv_heads, g)
    q = c.bn * c.heads // g * c.head_dim * c.elem  # one split of Q (or O, dO, dQ)
    kv = 2 * c.bn * hk // g * c.head_dim * c.elem  # one split of K and V
    if regather:
        c.to_peers(vol, "forward", members, 2 * q + kv)
        return
    for phase in ("forward", "backward"):  # Q, K, V in + O out; dO in + dQ, dK, dV out
        c.to_peers(vol, phase, members, 2 * q + kv)


def _ulysses(c: _Case, *, layout: str = "contiguous") -> Volume:
    vol = Volume()
    _ulysses_into(vol, c, range(c.world))
    return vol


def _ring_pass_into(vol: Volume, c: _Case, members: Sequence[int], reach: tuple[int, int],
                    kv: int, backward: str, pay: int, acc: int) -> None:
    """A flat ring over ``members`` (c.rank among them), shortened to ``reach`` (span, back)."""
    r = len(members)
    pos = members.index(c.rank)
    _flat_ring_into(vol, lambda offset: c.link(members[(pos + offset) % r]), *reach, kv,
                    backward, pay, acc)


def _flat_ring_into(vol: Volume, link: Callable[[int], str], span: int, back: int, kv: int,
                    backward: str, pay: int, acc: int) -> None:
    """What one rank of a flat ring sends (``burst.ring._flat``; ``link(offset)``: the link to
    the member ``offset`` places along the ring): K/V (``kv``) forward, then the backward's
    ``pay`` and trailing ``acc`` (``ring_hop_bytes``), to the next member for the classic
    backward, to the previous one for the burst backward (queries travel that way,
    ``burst.attention``). The blocks go ``span`` hops that way, the accumulators one step behind
    them and the last straight home; with ``back`` > 0 the same go ``back`` hops the other way,
    where my own block's accumulator, made by the first chain, does not travel."""
    d = -1 if backward == "burst" else 1
    vol.add("forward", link(1), span * kv)
    vol.add("backward", link(d), span * pay)
    if span > 0:  # S hops one behind the data, then one straight home
        vol.add("backward", link(d), span * acc)
        vol.add("backward", link(-d * span), acc)
    if back > 0:
        vol.add("forward", link(-1), back * kv)
        vol.add("backward", link(-d), back * pay + (back - 1) * acc)
        vol.add("backward", link(d * back), acc)


def _usp(c: _Case, *, ulysses_degree: int = 2, layout: str = "contiguous",
         backward: str = "ring", grad_acc: str = "fp32") -> Volume:
    return _usp_volume(_grads_in(c, grad_acc), ulysses_degree, layout, backward, truncate=True)


def usp_auto_backward(*, ulysses_degree: int, world: int, kv_heads: int, **shape) -> str:
    """usp's backward="auto": what ``burst_attn`` picks for USP's ring across the Ulysses
    groups (``auto_backward``), whose unit of U*n tokens x H/U, Hk/U heads moves the bytes of
    n tokens x H, Hk heads (Hk replicated up to U where fewer); ``shape``: ``auto_backward``'s
    other arguments."""
    return auto_backward(world=world // ulysses_degree,
                         kv_heads=ulysses_kv_heads(kv_heads, ulysses_degree), **shape)


def _usp_volume(c: _Case, u: int, layout: str, backward: str, *, truncate: bool) -> Volume:
    """USP's bytes; ``truncate``: a window shortens the ring (ours; yunchang's ring does not)."""
    if backward not in ("auto", "ring", "burst"):
        raise ValueError(f"usp backward={backward!r}; valid: auto, ring, burst")
    r, u_idx = c.world // u, c.rank % u
    vol = Volume()
    _ulysses_into(vol, c, _ulysses_group(c, u))
    # a ring unit is U*n tokens x H/U, hk/U heads: the bytes of n tokens x H, hk heads
    hop = dict(batch=c.batch, seq_local=c.seq_local, heads=c.heads,
               kv_heads=ulysses_kv_heads(c.kv_heads, u), head_dim=c.head_dim, elem=c.elem,
               acc_elem=c.acc_elem, grad_elem=c.grad_elem)
    if backward == "auto":
        backward = usp_auto_backward(ulysses_degree=u, **c.shape())
    kv, _ = ring_hop_bytes("ring", **hop)
    pay, acc = ring_hop_bytes(backward, **hop)
    reach = c.reach(r, u * c.seq_local, layout) if truncate else (r - 1, 0)
    _ring_pass_into(vol, c, [i * u + u_idx for i in range(r)], reach, kv, backward, pay, acc)
    return vol


def _tp(c: _Case, *, hidden: int | None = None) -> Volume:
    x = c.bn * (hidden or c.heads * c.head_dim) * c.elem
    vol, everyone = Volume(), range(c.world)
    for _ in range(2):  # all-gather x, reduce-scatter y
        c.to_peers(vol, "forward", everyone, x)
    for _ in range(3):  # all-gather dy, all-gather x again, reduce-scatter dx
        c.to_peers(vol, "backward", everyone, x)
    return vol


def _ring_flash_attn(c: _Case, *, layout: str = "zigzag") -> Volume:
    return _ring_like(c, "ring", layout, None, truncate=False)


def _yunchang(c: _Case, *, ulysses_degree: int = 2, layout: str = "contiguous") -> Volume:
    return _usp_volume(c, ulysses_degree, layout, "ring", truncate=False)


_FORMULAS: dict[str, Callable[..., Volume]] = {
    "burst": _burst, "ring": _ring, "zigzag_ring": _zigzag_ring, "striped_ring": _striped_ring,
    "double_ring": _double_ring, "allgather": _allgather, "ulysses": _ulysses, "usp": _usp,
    "tp": _tp, "ring_flash_attn": _ring_flash_attn, "yunchang": _yunchang,
}
METHODS = tuple(_FORMULAS)
_CASE_OPTIONS = ("rank", "node_size", "causal", "window", "cu_seqlens")
_NO_BYTES = ("backend",)  # options that change no byte


@cache  # asked for per rank: a 4096-rank cell asked 40960 times, 5 s
def formula_options(method: str) -> tuple[str, ...]:
    """The options that change ``method``'s bytes (its formula's keyword arguments)."""
    if method not in _FORMULAS:
        raise ValueError(f"no byte formula for method {method!r}; valid: {', '.join(METHODS)}")
    return tuple(p for p in inspect.signature(_FORMULAS[method]).parameters if p != "c")


def method_bytes(method: str, *, world: int, batch: int, seq_local: int, heads: int,
                 kv_heads: int, head_dim: int, elem: int, acc_elem: int = 4,
                 **options) -> Volume:
    """Bytes one rank sends in one attention layer (block, for ``tp``) of registry ``method``.

    ``options`` are the method's options (``layout``, ``backward``, ``grad_acc``,
    ``ranks_per_node``, ``ulysses_degree``, ``hidden``: ``formula_options``) plus the case:
    ``rank`` (default 0) and ``node_size`` (ranks per physical node, labels links intra/inter;
    default one node), ``causal``, ``window`` and ``cu_seqlens`` (only windows and documents
    change a ring's span).
    """
    c, options = _case(method, world=world, batch=batch, seq_local=seq_local, heads=heads,
                       kv_heads=kv_heads, head_dim=head_dim, elem=elem, acc_elem=acc_elem,
                       **options)
    return _FORMULAS[method](c, **options)


def regather_bytes(method: str, *, world: int, batch: int, seq_local: int, heads: int,
                   kv_heads: int, head_dim: int, elem: int, acc_elem: int = 4,
                   **options) -> Volume:
    """Bytes one rank sends again in one layer's backward under the engine's selective
    checkpointing (arguments as ``method_bytes``): Ulysses' and USP's all-to-alls of Q, K, V
    and O, whose results the cache does not keep (``burst.remake``: it keeps the kernel's
    output and moves it again), labelled ``forward`` as the method's own forward traffic;
    nothing for the other methods."""
    c, options = _case(method, world=world, batch=batch, seq_local=seq_local, heads=heads,
                       kv_heads=kv_heads, head_dim=head_dim, elem=elem, acc_elem=acc_elem,
                       **options)
    vol = Volume()
    if method == "ulysses":
        _ulysses_into(vol, c, range(c.world), regather=True)
    elif method == "usp":
        _ulysses_into(vol, c, _ulysses_group(c, options.get("ulysses_degree", 2)), regather=True)
    return vol


def _ulysses_group(c: _Case, u: int) -> range:
    """The USP Ulysses group of ``u`` consecutive ranks that ``c.rank`` belongs to."""
    if c.world % u:
        raise ValueError(f"ulysses_degree={u} does not divide the group of {c.world} ranks")
    start = c.rank // u * u
    return range(start, start + u)


def _case(method: str, *, world: int, batch: int, seq_local: int, heads: int, kv_heads: int,
          head_dim: int, elem: int, acc_elem: int, **options) -> tuple[_Case, dict]:
    """The case and the formula's own options of a ``method_bytes`` call."""
    own = list(formula_options(method))
    bad = sorted(set(options) - set(own) - set(_CASE_OPTIONS) - set(_NO_BYTES))
    if bad:
        raise ValueError(f"method {method!r} has no option(s) {', '.join(bad)}; valid: "
                         f"{', '.join(own + list(_CASE_OPTIONS))}")
    case = {k: options.pop(k) for k in _CASE_OPTIONS if k in options}
    if "node_size" in case:  # (the node sizes' checks take ints alone)
        case["node_size"] = plain_integer(case["node_size"])
    if why := ranks_per_node_problem(world, case.get("node_size"), "node_size"):
        raise ValueError(why)  # (0 labelled every link intra, -1 every link inter)
    if case.get("cu_seqlens") is not None:
        case["cu_seqlens"] = tuple(int(x) for x in case["cu_seqlens"])
    for k in _NO_BYTES:
        options.pop(k, None)
    c = _Case(world=world, batch=batch, seq_local=seq_local, heads=heads, kv_heads=kv_heads,
              head_dim=head_dim, elem=elem, acc_elem=acc_elem, **case)
    return c, options
