"""The ring schedule: blocks circulate, accumulators trail them back to their owners.

One loop serves every ring pass in the project: BurstAttention's forward (K/V travel), its
backward (Q, dO, D, LSE travel, dQ trails), the classic ring backward (K/V travel, dK/dV trail)
and the baselines' rings. The caller gives the travelling ``payload`` and a ``step`` callback that
does the local work for the block of ring position ``src``; the loop does all communication.

Flat ring (M = 1 node-group of L = G ranks): at step s rank i holds the block of i - s. Before
computing it posts the send of that block to i+1 and the receive of the next one (double buffer),
so the transfer hides behind the compute. Travelling accumulators (fresh zeros each step, filled
by ``step``) are added to the partial sum that arrives from i-1 and passed on, one hop behind the
data; after the last step the finished sum goes to its owner. ``span`` < G-1 stops the ring early
when no rank needs blocks further away (sliding windows); the last hop then goes straight home.
Where the keys a window needs lie on both sides (``burst.masks.ring_reach``), a second chain
sends the blocks ``back`` hops the other way at the same steps, with its own trailing
accumulators; my block's sum is the two chains' (every transfer of a step is posted before its
compute).

Topology-aware double ring (DESIGN.md 3; M nodes x L local ranks, node-major): at outer step m
rank (n, l) holds the "outer" block of (n-m, l) and circulates it around its node's ring in L
steps (NVLink), while the next outer block travels from (n-1, l) to (n, l) over the inter-node
link: every GPU of a node sends at once (all NICs busy) and the transfer has L-1 compute steps to
hide behind. Accumulators go around the node ring and back to the outer block's holder, then hop
to the next node along the same inter-node ring; the last hop lands at the owner.

Messages per rank (u = one block of the tensor in question):
  flat:   payload G-1 hops, accumulators G hops (the last one home); shortened to (S, B):
          payload S + B hops, accumulators S + 1 + B (S + B when S = 0: my own stays home)
  double: payload M(L-1) intra + (M-1) inter; accumulators M*L intra + M inter
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from burst import comm
from burst.comm import RingGroups

__all__ = ["check_reach", "run_ring", "visit_order"]

Step = Callable[[int, Sequence[torch.Tensor], list[torch.Tensor] | None], None]


def _zeros(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(t) for t in like]


def _empty(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in like]


def _post(group, send: Sequence[torch.Tensor], to: int, recv: Sequence[torch.Tensor], frm: int):
    return _post_pairs(group, [(t, to) for t in send], [(t, frm) for t in recv])


def _post_pairs(group, sends: list[tuple[torch.Tensor, int]],
                recvs: list[tuple[torch.Tensor, int]]):
    """Every transfer of the ring goes out here, as one batch (``comm.exchange``)."""
    return comm.exchange(sends, recvs, group)


def _add_(dst: list[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    for a, b in zip(dst, src, strict=True):
        a.add_(b)


def check_reach(world: int, span: int, back: int) -> None:
    """ValueError unless a flat ring of ``world`` can go ``span`` hops one way and ``back`` the
    other without visiting a block twice (``burst.masks.ring_reach`` gives such a pair)."""
    if min(span, back) < 0 or span + back > world - 1:
        raise ValueError(f"span={span}, back={back}: a flat ring of {world} visits each block "
                         f"at most once (0 <= span, 0 <= back, span + back <= {world - 1})")


def visit_order(world: int, me: int, *, nodes: int = 1, span: int | None = None,
                back: int = 0, direction: int = 1) -> list[int]:
    """Ring positions whose blocks position ``me`` works on, in step order.

    The one definition of the schedule, used by ``run_ring`` and by ``burst.emulate`` (which
    replays every rank's steps in one process). Flat ring: me, me - d, me - 2d, ... for steps
    0..span; with ``back`` > 0 a second chain runs the other way beside it, and step t also
    works on me + d t (t = 1..back), after me - d t. Double ring (``nodes`` M > 1, L = world /
    M): outer step m takes the block of node n - m, whose L blocks then go around the node ring.
    """
    if nodes == 1:
        span = world - 1 if span is None else span
        check_reach(world, span, back)
        return [(me + sign * direction * t) % world for t in range(max(span, back) + 1)
                for sign, reach in ((-1, span), (1, back)) if t <= reach and (t or sign < 0)]
    if span not in (None, world - 1) or back:  # burst.masks.ring_reach never shortens it
        raise ValueError(f"span={span}, back={back}: a double ring visits all {world} blocks "
                         "one way")
    local = world // nodes
    node, loc = divmod(me, local)
    return [((node - m) % nodes) * local + (loc - s) % local
            for m in range(nodes) for s in range(local)]


def run_ring(rg: RingGroups, payload: Sequence[torch.Tensor], step: Step, *,
             acc_like: Sequence[torch.Tensor] | None = None,
             span: int | None = None, back: int = 0,
             direction: int = 1) -> list[torch.Tensor] | None:
    """Visit every block of the ring; return this rank's finished accumulators (or None).

    ``step(src, payload_of_src, acc)`` does the local work for the block owned by ring position
    ``src``; ``acc`` (zeros shaped like ``acc_like``) receives the contributions that must travel
    back to ``src``. ``span`` limits a flat ring to steps 0..span. ``direction`` -1 sends blocks
    to the previous rank instead (a flat ring then visits i, i+1, ..., which is what travelling
    queries need to meet the keys to their left first when a window truncates the ring).
    ``back`` > 0 (a flat ring only) also sends the blocks the other way, ``back`` hops, at the
    same steps (``burst.masks.ring_reach``: a window that needs both neighbours, as on the
    zigzag layout, costs 2 hops instead of G-1).
    """
    payload = [t.contiguous() for t in payload]
    if rg.nodes == 1:
        span = rg.world - 1 if span is None else span
        check_reach(rg.world, span, back)  # before the first transfer
        return _flat(rg, payload, step, acc_like, span, back, direction)
    if back:
        raise ValueError(f"back={back}: a double ring visits all {rg.world} blocks one way")
    return _double(rg, payload, step, acc_like, span)


def _flat(rg: RingGroups, payload, step: Step, acc_like, span: int, back: int, direction: int):
    ring, me, g = list(rg.ranks), rg.me, rg.world
    chains = [_Chain(ring, me, visit_order(g, me, span=span, direction=direction), payload,
                     direction, 0, acc_like)]
    if back:  # the same schedule the other way, from step 1 (my own block is the first's)
        chains.append(_Chain(ring, me, visit_order(g, me, span=back, direction=-direction),
                             payload, -direction, 1, acc_like))
    for t in range(max(span, back) + 1):
        _post_reads(chains, t, rg.read_intra)  # before any compute of the step
        for c in chains:
            c.work(t, step, rg.acc_intra)
        for c in chains:
            c.advance()
    if acc_like is None:
        return None
    results = [c.result() for c in chains]
    for extra in results[1:]:
        _add_(results[0], extra)
    return results[0]


def _ring_pass(ring: list[int], me: int, order: list[int], payload, step: Step, acc_like,
               d: int, read_group, acc_group):
    """One step per block of ``order`` (ring positions) around ``ring`` (global ranks; I am
    ``ring[me]``); returns the finished accumulators of my own block."""
    chain = _Chain(ring, me, order, payload, d, 0, acc_like)
    for t in range(len(order)):
        _post_reads([chain], t, read_group)
        chain.work(t, step, acc_group)
        chain.advance()
    return None if acc_like is None else chain.result()


def _post_reads(chains: list[_Chain], t: int, group) -> None:
    """Post step ``t``'s block transfers of every chain that sends one, as one batch (both
    directions of a two-way ring at once: NCCL runs a batch's transfers together, where two
    batches on one group would run one after the other)."""
    sends, recvs, posting = [], [], []
    for c in chains:
        if t < c.reach:
            c.buf = _empty(c.cur)
            sends += [(x, c.nxt) for x in c.cur]
            recvs += [(x, c.prv) for x in c.buf]
            posting.append(c)
    if posting:
        read = _post_pairs(group, sends, recvs)
        for c in posting:
            c.read = read


class _Chain:
    """One direction of a ring pass around ``ring`` (global ranks; I am ``ring[me]``): at step t
    I hold the block of ring position ``order[t]`` (``visit_order``'s), working on it at steps
    ``first``..``reach`` (the last of ``order``), and post its send to the next rank before
    that step's work (double buffer). Accumulators (fresh zeros at each working step, filled by
    ``step``) are added to the partial sum that arrives from the previous rank and passed on,
    one hop behind the data; after step ``reach`` the finished sum goes straight to its owner.
    A chain with ``first`` 1 skips my own block (the other chain works on it) but still sends
    it at step 0."""

    def __init__(self, ring, me, order, payload, d, first, acc_like):
        g, reach = len(ring), len(order) - 1
        self.nxt, self.prv = ring[(me + d) % g], ring[(me - d) % g]
        # after the last step: my sum to the block's holder, the sum of my block from the rank
        # that worked on it last
        self.home, self.last = ring[(me - d * reach) % g], ring[(me + d * reach) % g]
        self.order, self.reach, self.first, self.acc_like = order, reach, first, acc_like
        self.cur, self.buf, self.read = payload, None, None
        self.acc_in, self.acc_pend, self.sent = None, None, []

    def work(self, t: int, step: Step, group) -> None:
        if not self.first <= t <= self.reach:
            return
        acc = _zeros(self.acc_like) if self.acc_like is not None else None
        step(self.order[t], self.cur, acc)
        if acc is None:
            return
        if self.reach == 0:
            self.acc_in = acc  # span 0: every block is its own owner's
            return
        if t > self.first:
            self.acc_pend.wait()
            _add_(acc, self.acc_in)  # acc_in, added, receives the next hop's (no fourth block)
        else:
            self.acc_in = _empty(self.acc_like)
        to, frm = (self.nxt, self.prv) if t < self.reach else (self.home, self.last)
        self.acc_pend = _post(group, acc, to, self.acc_in, frm)
        self.sent.append(self.acc_pend)

    def advance(self) -> None:
        if self.read is not None:
            self.read.wait()
            self.cur, self.read = self.buf, None

    def result(self) -> list[torch.Tensor] | None:
        for p in self.sent:
            p.wait()
        return self.acc_in


def _double(rg: RingGroups, payload, step: Step, acc_like, span: int | None):
    m_nodes, l_loc = rg.nodes, rg.local
    node, loc = divmod(rg.me, l_loc)
    node_ring = [rg.at(node, j) for j in range(l_loc)]
    inter_next, inter_prev = rg.at(node + 1, loc), rg.at(node - 1, loc)
    outer, inter_in, inter_pend, pending = payload, None, None, []
    order = visit_order(rg.world, rg.me, nodes=m_nodes, span=span)  # (refuses a shorter span)
    for m in range(m_nodes):
        outer_read = None
        if m < m_nodes - 1:  # prefetch the next outer block over the inter-node link
            outer_buf = _empty(outer)
            outer_read = _post(rg.read_inter, outer, inter_next, outer_buf, inter_prev)
        # the outer block around the node ring; its node-local accumulators come back to me
        node_acc = _ring_pass(node_ring, loc, order[m * l_loc:(m + 1) * l_loc], outer, step,
                              acc_like, 1, rg.read_intra, rg.acc_intra)
        if acc_like is not None:
            if m > 0:
                inter_pend.wait()
                _add_(node_acc, inter_in)  # inter_in, added, receives the next node's
            else:
                inter_in = _empty(acc_like)
            inter_pend = _post(rg.acc_inter, node_acc, inter_next, inter_in, inter_prev)
            pending.append(inter_pend)
        if outer_read is not None:
            outer_read.wait()
            outer = outer_buf
    if acc_like is None:
        return None
    for p in pending:
        p.wait()
    return inter_in
