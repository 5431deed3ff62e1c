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

Topology-aware double ring (DESIGN.md 3; M nodes x L local ranks, node-major): at outer step m
rank (n, l) holds the "outer" block of (n-m, l) and circulates it around its node's ring in L
steps (NVLink), while the next outer block travels from (n-1, l) to (n, l) over the inter-node
link: every GPU of a node sends at once (all NICs busy) and the transfer has L-1 compute steps to
hide behind. Accumulators go around the node ring and back to the outer block's holder, then hop
to the next node along the same inter-node ring; the last hop lands at the owner.

Messages per rank (u = one block of the tensor in question):
  flat:   payload G-1 hops, accumulators G hops (the last one home)
  double: payload M(L-1) intra + (M-1) inter; accumulators M*L intra + M inter
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from burst import comm
from burst.comm import RingGroups

__all__ = ["run_ring", "visit_order"]

Step = Callable[[int, Sequence[torch.Tensor], list[torch.Tensor] | None], None]


def _zeros(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(t) for t in like]


def _empty(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in like]


def _post(group, send: Sequence[torch.Tensor], to: int, recv: Sequence[torch.Tensor], frm: int):
    return comm.exchange([(t, to) for t in send], [(t, frm) for t in recv], group)


def _add_(dst: list[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    for a, b in zip(dst, src, strict=True):
        a.add_(b)


def visit_order(world: int, me: int, *, nodes: int = 1, span: int | None = None,
                direction: int = 1) -> list[int]:
    """Ring positions whose blocks position ``me`` works on, in step order.

    The one definition of the schedule, used by ``run_ring`` and by ``burst.emulate`` (which
    replays every rank's steps in one process). Flat ring: me, me - d, me - 2d, ... for steps
    0..span. Double ring (``nodes`` M > 1, L = world / M): outer step m takes the block of node
    n - m, whose L blocks then go around the node ring.
    """
    if nodes == 1:
        span = world - 1 if span is None else span
        return [(me - direction * s) % world for s in range(span + 1)]
    if span not in (None, world - 1):  # burst.masks.ring_span never shortens a double ring
        raise ValueError(f"span={span}: a double ring visits all {world} blocks")
    local = world // nodes
    node, loc = divmod(me, local)
    return [((node - m) % nodes) * local + (loc - s) % local
            for m in range(nodes) for s in range(local)]


def run_ring(rg: RingGroups, payload: Sequence[torch.Tensor], step: Step, *,
             acc_like: Sequence[torch.Tensor] | None = None,
             span: int | None = None, direction: int = 1) -> list[torch.Tensor] | None:
    """Visit every block of the ring; return this rank's finished accumulators (or None).

    ``step(src, payload_of_src, acc)`` does the local work for the block owned by ring position
    ``src``; ``acc`` (zeros shaped like ``acc_like``) receives the contributions that must travel
    back to ``src``. ``span`` limits a flat ring to steps 0..span. ``direction`` -1 sends blocks
    to the previous rank instead (a flat ring then visits i, i+1, ..., which is what travelling
    queries need to meet the keys to their left first when a window truncates the ring).
    """
    payload = [t.contiguous() for t in payload]
    if rg.nodes == 1:
        return _flat(rg, payload, step, acc_like, rg.world - 1 if span is None else span,
                     direction)
    return _double(rg, payload, step, acc_like, span)


def _flat(rg: RingGroups, payload, step: Step, acc_like, span: int, direction: int):
    order = visit_order(rg.world, rg.me, span=span, direction=direction)
    return _ring_pass(list(rg.ranks), rg.me, order, payload, step, acc_like, span, direction,
                      rg.read_intra, rg.acc_intra)


def _ring_pass(ring: list[int], me: int, order: list[int], payload, step: Step, acc_like,
               span: int, d: int, read_group, acc_group):
    """Steps 0..span around ``ring`` (global ranks; I am ``ring[me]``), working on the blocks of
    ring positions ``order``; returns the finished accumulators of my own block."""
    g = len(ring)
    nxt, prv = ring[(me + d) % g], ring[(me - d) % g]
    cur, acc_in, acc_pend, sent = payload, None, None, []
    for s in range(span + 1):
        read = None
        if s < span:
            buf = _empty(cur)
            read = _post(read_group, cur, nxt, buf, prv)
        acc = _zeros(acc_like) if acc_like is not None else None
        step(order[s], cur, acc)
        if acc is not None and span > 0:
            if s > 0:
                acc_pend.wait()
                _add_(acc, acc_in)  # acc_in, added, receives the next hop's (no fourth block)
            else:
                acc_in = _empty(acc_like)
            # one hop behind the data; after the last step, straight to the block's holder
            to = nxt if s < span else ring[(me - d * span) % g]
            frm = prv if s < span else ring[(me + d * span) % g]
            acc_pend = _post(acc_group, acc, to, acc_in, frm)
            sent.append(acc_pend)
        elif acc is not None:
            acc_in = acc  # span 0: every block is its own owner's
        if read is not None:
            read.wait()
            cur = buf
    if acc_like is None:
        return None
    for p in sent:
        p.wait()
    return acc_in


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
                              acc_like, l_loc - 1, 1, rg.read_intra, rg.acc_intra)
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
