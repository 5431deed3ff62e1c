"""The one module that calls torch.distributed, and the byte counter. (One documented exception:
the engine's data parallelism hands its gradients to torch's DDP/FSDP and its checkpoints to
torch.distributed.checkpoint, which call it themselves: ``burst.engine.parallel``.)

Everything that moves data between ranks (ring point-to-point, all-gather, reduce-scatter,
all-to-all, all-reduce, small picklable objects) goes through here, so that ``count_bytes``
sees every byte:

    with burst.comm.count_bytes() as c:
        out = burst_attn(q, k, v, causal=True)
        out.sum().backward()
    c.sent(phase="backward", link="inter")   # bytes this rank sent

Counting convention (the analytic formulas in ``burst.volume`` use the same): a point-to-point
message counts its payload once as sent on the sender and once as received on the receiver.
Collectives count the logical peer-to-peer traffic: all-gather of an X-byte shard sends X to and
receives X from every other rank; reduce-scatter likewise for the X-byte piece each peer owns;
all-to-all counts each split sent to / received from another rank; all-reduce counts as
reduce-scatter + all-gather. Bytes to a peer on the same node are ``intra``, else ``inter``;
nodes are ``ranks_per_node`` consecutive global ranks (node-major), taken from the counter's
argument, else $LOCAL_WORLD_SIZE, else one node for everyone.

Process groups: ``ring_groups`` builds (once, cached) the groups of the flat or topology-aware
double ring, with separate groups for the read traffic and the accumulator (dQ / dK,dV) traffic,
so they never share a communicator (the official BurstEngine multi-node runs do, DESIGN.md 3).
On NCCL each communicator has its own stream, so transfers overlap compute on the default stream.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import os
import pickle
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "ByteCount",
    "RingGroups",
    "all_gather",
    "all_gather_list",
    "all_reduce",
    "all_to_all",
    "barrier",
    "count_bytes",
    "current_phase",
    "gather_objects",
    "destroy",
    "exchange",
    "global_rank",
    "group_ranks",
    "host_group",
    "init",
    "is_initialized",
    "phase",
    "rank",
    "reduce_scatter",
    "ring_groups",
    "ring_shape",
    "subgroup",
    "unlabelled_phase",
    "world_size",
]

# ---------------------------------------------------------------------------------------------
# Process-group basics


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def init(backend: str = "gloo", *, rank: int | None = None, world_size: int | None = None,
         init_method: str | None = None, timeout_s: float = 600.0, device_id=None,
         store=None) -> None:
    """Initialise the default process group (env:// unless ``init_method`` or a rendezvous
    ``store`` is given)."""
    # torch rejects rank=None / world_size=None; leaving them out makes env:// read RANK and
    # WORLD_SIZE (submitit jobs export them, issue 5)
    given = dict(rank=rank, world_size=world_size, device_id=device_id, store=store)
    kw = {k: v for k, v in given.items() if v is not None}
    dist.init_process_group(backend, init_method=init_method,
                            timeout=timedelta(seconds=timeout_s), **kw)
    _TIMEOUT[0] = timedelta(seconds=timeout_s)


def tcp_store(port: int = 0, *, serve: bool, timeout_s: float = 600.0):
    """A rendezvous store on 127.0.0.1 for ``init(store=...)``: served here (``serve``; port 0:
    one the kernel picks, read back as ``.port``), or a client of the one served at ``port``."""
    return dist.TCPStore("127.0.0.1", port, is_master=serve, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


# the timeout ``init`` was given, for the sub-groups too (``dist.new_group`` without one gives
# torch's default, 30 minutes: a rank that died left its peers waiting that long in a ring's
# accumulator group, whatever init said); a process group made outside ``init`` keeps torch's
_TIMEOUT: list = [None]


def destroy() -> None:
    """Destroy every process group. Garbage that still holds group objects (a Trainer that went
    out of scope: FSDP's parameter groups keep their process group, in reference cycles) is
    collected first, while the groups are alive: left to the interpreter's exit, its gloo
    groups were torn down after torch's, and 6 of 50 torchrun runs of ``scripts/train.py
    --data-parallel fsdp --cp-degree 1`` on 2 gloo processes aborted there after finishing
    ("terminate called without an active exception", exit -6); 0 of 40 with this."""
    _RING_CACHE.clear()
    _SUB_CACHE.clear()
    _TIMEOUT[0] = None
    if is_initialized():
        gc.collect()
        dist.destroy_process_group()


def _member(group) -> None:
    """A rank outside ``group`` gets torch's placeholder from new_group (size -1 and rank -1):
    refuse it by name instead of failing later on a -1. Anything but a process group (or None)
    is refused too: without a process group a name ran as one rank, with one it failed in
    torch."""
    if group is not None and group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the process group it was "
                         "given (torch.distributed.new_group returns a placeholder to the ranks "
                         "it leaves out): call it on the group's members only")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group={group!r}: expected a torch.distributed ProcessGroup or None "
                        f"(a DeviceMesh gives one with mesh.get_group()), got "
                        f"{type(group).__name__}")


def world_size(group=None) -> int:
    _member(group)
    if not is_initialized():
        return 1
    return dist.get_world_size(group)


def rank(group=None) -> int:
    _member(group)
    if not is_initialized():
        return 0
    return dist.get_rank(group)


def group_ranks(group=None) -> list[int]:
    """Global ranks of a group's members, in group-rank order."""
    _member(group)
    if not is_initialized():
        return [0]
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def global_rank(group, group_rank: int) -> int:
    return group_ranks(group)[group_rank]


def barrier(group=None) -> None:
    if is_initialized():
        dist.barrier(group=group)


# ---------------------------------------------------------------------------------------------
# Byte counter

_PHASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("burst_phase", default=None)
_UNLABELLED = ["forward"]
_COUNTERS: list[ByteCount] = []


@contextlib.contextmanager
def phase(name: str):
    """Label the traffic issued inside the block (``forward``, ``backward``, ...)."""
    token = _PHASE.set(name)
    try:
        yield
    finally:
        _PHASE.reset(token)


def current_phase() -> str:
    """The phase that traffic issued here and now is filed under."""
    return _PHASE.get() or _UNLABELLED[0]


@contextlib.contextmanager
def unlabelled_phase(name: str):
    """The phase of the traffic inside the block that no ``phase`` labels (default
    ``forward``): the harness and the engine set ``backward`` around their backward calls, so
    that a method of the user's that sends through this module without labels has its
    backward's bytes counted as backward. A process-wide setting, not a context variable:
    autograd runs a CUDA backward on threads of its own, which a context variable set by the
    caller does not reach; so not for threads that count bytes side by side (a rank is a
    process, and runs one step at a time)."""
    saved, _UNLABELLED[0] = _UNLABELLED[0], name
    try:
        yield
    finally:
        _UNLABELLED[0] = saved


@dataclass
class ByteCount:
    """Bytes sent and received by this rank, by (phase, link)."""

    ranks_per_node: int | None = None
    _sent: dict = field(default_factory=lambda: defaultdict(int))
    _recv: dict = field(default_factory=lambda: defaultdict(int))

    def _link(self, me: int, peer: int) -> str:
        rpn = self.ranks_per_node
        if rpn is None:
            return "intra"
        return "intra" if me // rpn == peer // rpn else "inter"

    def record(self, peer: int, nbytes: int, direction: str) -> None:
        key = (current_phase(), self._link(rank(), peer))
        (self._sent if direction == "send" else self._recv)[key] += nbytes

    @staticmethod
    def _total(table, phase, link):
        # a misspelt link ("internode") matched nothing and counted 0 bytes; phases are the
        # callers' own labels (comm.phase), so a misspelt one still counts 0
        if link not in (None, "intra", "inter"):
            raise ValueError(f"link={link!r}; valid: 'intra', 'inter' (or None: both)")
        if phase is not None and not isinstance(phase, str):
            raise ValueError(f"phase={phase!r}: expected a phase name (or None: every phase)")
        return sum(v for (p, lk), v in table.items()
                   if (phase is None or p == phase) and (link is None or lk == link))

    def sent(self, phase: str | None = None, link: str | None = None) -> int:
        return self._total(self._sent, phase, link)

    def received(self, phase: str | None = None, link: str | None = None) -> int:
        return self._total(self._recv, phase, link)


@contextlib.contextmanager
def count_bytes(ranks_per_node: int | None = None):
    """Count every byte this rank sends and receives inside the block (counters may nest)."""
    name = "ranks_per_node"  # (None: $LOCAL_WORLD_SIZE, else one node)
    if ranks_per_node is None and (env := os.environ.get("LOCAL_WORLD_SIZE")) is not None:
        name = "$LOCAL_WORLD_SIZE"  # (read unchecked, -1 labelled every link inter, 0 none,
        try:  # "abc" failed at the first transfer: a topology audit)
            ranks_per_node = int(env)
        except ValueError:
            ranks_per_node = env
    # a whole number of the world's ranks (links are labelled by global rank): 0 labelled every
    # link intra, -1 every link inter, "2" failed at the first transfer, 3 ranks a node of 4
    # made a node of one rank (audits)
    if why := ranks_per_node_problem(world_size(), ranks_per_node, name):
        raise ValueError(f"count_bytes: {why}")
    c = ByteCount(ranks_per_node=ranks_per_node)
    _COUNTERS.append(c)
    try:
        yield c
    finally:
        _COUNTERS.remove(c)


def _record(peer: int, t: torch.Tensor, direction: str) -> None:
    for c in _COUNTERS:
        c.record(peer, t.numel() * t.element_size(), direction)


# ---------------------------------------------------------------------------------------------
# Point-to-point


class Pending:
    """Handles of posted transfers; ``wait()`` blocks (on GPU: orders the current stream).

    It also holds the transfers' tensors until then: a send buffer the caller drops (a ring
    step's block, rebound to the received one) must not return to the allocator while the
    backend may still read it, whatever the backend itself keeps alive."""

    def __init__(self, works, tensors=()):
        self._works = works
        self._tensors = list(tensors)

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []
        self._tensors = []


def exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
             group) -> Pending:
    """Post sends (tensor, global peer) and receives into preallocated tensors, all at once."""
    ops = []
    for t, peer in sends:
        _record(peer, t, "send")
        ops.append(dist.P2POp(dist.isend, t, peer, group))
    for t, peer in recvs:
        _record(peer, t, "recv")
        ops.append(dist.P2POp(dist.irecv, t, peer, group))
    if not ops:
        return Pending([])
    return Pending(dist.batch_isend_irecv(ops), [op.tensor for op in ops])


# ---------------------------------------------------------------------------------------------
# Collectives (logical peer-to-peer counting, see the module docstring)


def _record_peers(group, nbytes_to_peer: list[int], nbytes_from_peer: list[int]) -> None:
    ranks = group_ranks(group)
    me = rank()
    for g, nb_out, nb_in in zip(ranks, nbytes_to_peer, nbytes_from_peer, strict=True):
        if g == me:
            continue
        for c in _COUNTERS:
            c.record(g, nb_out, "send")
            c.record(g, nb_in, "recv")


def all_gather(x: torch.Tensor, *, dim: int = 0, group=None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in group-rank order."""
    return torch.cat(all_gather_list(x, group=group), dim=dim)


def all_gather_list(x: torch.Tensor, *, group=None) -> list[torch.Tensor]:
    g = world_size(group)
    if g == 1:
        return [x]
    x = x.contiguous()
    nb = x.numel() * x.element_size()
    _record_peers(group, [nb] * g, [nb] * g)
    parts = [torch.empty_like(x) for _ in range(g)]
    dist.all_gather(parts, x, group=group)
    return parts


def gather_objects(obj, *, group=None, device=None) -> list:
    """Every rank's ``obj`` (picklable; small: flags, error texts, metadata), in group-rank
    order, on every rank; ``[obj]`` alone. ``device``: the rank's GPU under NCCL. Counted as
    each pickled object sent to and received from every other rank."""
    if world_size(group) == 1:
        return [obj]
    out = [None] * world_size(group)
    on_gpu = device is not None and torch.device(device).type == "cuda"
    with torch.cuda.device(device) if on_gpu else contextlib.nullcontext():
        dist.all_gather_object(out, obj, group=group)
    sizes = [len(pickle.dumps(o)) for o in out]
    _record_peers(group, [sizes[rank(group)]] * len(out), sizes)
    return out


def reduce_scatter(x: torch.Tensor, *, dim: int = 0, group=None) -> torch.Tensor:
    """Sum ``x`` over ranks and return this rank's 1/G slice along ``dim``."""
    g = world_size(group)
    if g == 1:
        return x
    if x.shape[dim] % g:
        raise ValueError(f"reduce_scatter: dim {dim} of size {x.shape[dim]} is not divisible by "
                         f"{g} ranks")
    parts = [p.contiguous() for p in x.chunk(g, dim=dim)]
    nb = parts[0].numel() * parts[0].element_size()
    _record_peers(group, [nb] * g, [nb] * g)
    out = torch.empty_like(parts[0])
    if x.device.type == "cpu" and dist.get_backend(group) == "gloo":
        # gloo has no reduce_scatter: reduce each piece to its owner (same logical traffic)
        for i, p in enumerate(parts):
            buf = p.clone()
            dist.reduce(buf, dst=global_rank(group, i), group=group)
            if i == rank(group):
                out.copy_(buf)
        return out
    dist.reduce_scatter(out, parts, group=group)
    return out


def all_to_all(x: torch.Tensor, *, split_dim: int, cat_dim: int, group=None) -> torch.Tensor:
    """Send part i of ``x`` (``split_dim`` cut into G equal parts) to rank i; concatenate what
    arrives along ``cat_dim`` in rank order. Every rank's ``x`` has the same shape."""
    g = world_size(group)
    if g == 1:
        return x
    if x.shape[split_dim] % g:
        raise ValueError(f"all_to_all: dim {split_dim} of size {x.shape[split_dim]} is not "
                         f"divisible by {g} ranks")
    split_dim, cat_dim = split_dim % x.dim(), cat_dim % x.dim()
    # the G parts stacked in one buffer (one copy, as the parts' .contiguous() was), received
    # into one buffer whose rank-major rows are already the concatenation along cat_dim. The
    # single-tensor form on every backend: gloo's list form (torch >= 2.12) packs and unpacks
    # around the same transfer, and joining its parts copied once more (4 gloo ranks, a
    # (1, 1024, 8, 64) fp32 shard: 7.9 ms against 4.5 ms, the same bytes; a profiling audit)
    send = x.unflatten(split_dim, (g, -1)).movedim(split_dim, 0).contiguous()
    nbytes = [send[0].numel() * send.element_size()] * g
    _record_peers(group, nbytes, nbytes)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.movedim(0, cat_dim).flatten(cat_dim, cat_dim + 1)


def all_reduce(x: torch.Tensor, *, group=None, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (``sum`` or ``max``); returns ``x``. Counted as a ring all-reduce:
    2 x ceil(bytes / G) to every other rank (a tensor smaller than G bytes still moves)."""
    if op not in ("sum", "max"):  # refused on one rank too ("min" ran as max)
        raise ValueError(f"op={op!r}: all_reduce takes 'sum' or 'max'")
    g = world_size(group)
    if g == 1:
        return x
    nb = -(-x.numel() * x.element_size() // g)
    _record_peers(group, [2 * nb] * g, [2 * nb] * g)
    dist.all_reduce(x, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=group)
    return x


# ---------------------------------------------------------------------------------------------
# Sub-groups

_SUB_CACHE: dict = {}


def _new_group(ranks: list[int], local_sync: bool):
    kw = {"timeout": _TIMEOUT[0]} if _TIMEOUT[0] is not None else {}
    if local_sync:
        return dist.new_group(ranks, use_local_synchronization=True, **kw)
    return dist.new_group(ranks, **kw)


_CACHED_UNDER: list = [None]  # the default group the cached groups were created under


def _fresh_caches() -> None:
    """Forget cached groups made under an earlier default group: after
    torch.distributed.destroy_process_group() + init_process_group() (without ``destroy``
    above) they are dead, and using one failed in the next backward, then hung."""
    world = dist.group.WORLD if is_initialized() else None
    if _CACHED_UNDER[0] is not world:
        _RING_CACHE.clear()
        _SUB_CACHE.clear()
        _CACHED_UNDER[0] = world


def _check_group_histories(parent) -> None:
    """Refuse, on every member of ``parent``, to make groups among its members alone when they
    have made different numbers of process groups: torch names such a group by its ranks and
    that number (``distributed_c10d._hash_ranks_to_str``), so they would wait on different
    names until the timeout (a ring on ranks {1, 2, 3} after one on {0, 1, 2}: rank 3 had made
    none of the latter's groups; a topology audit). A private count of torch's; unchecked where
    a torch lacks it."""
    world_state = getattr(dist.distributed_c10d, "_world", None)
    if getattr(world_state, "pg_names", None) is None:
        return
    counts = [None] * len(group_ranks(parent))
    dist.all_gather_object(counts, len(world_state.pg_names), group=parent)  # (not counted)
    if len(set(counts)) > 1:
        had = ", ".join(f"rank {r}: {c}" for r, c in zip(group_ranks(parent), counts, strict=True))
        raise ValueError(
            f"the ranks of this group have made different numbers of process groups ({had}), "
            "and torch names a group made among some ranks by that number: its groups would "
            "hang. Make every member's groups alike first (e.g. the same methods on the same "
            "groups, in the same order, on every rank), or use groups of the whole world")


def subgroup(rank_lists: list[list[int]], *, parent=None, purpose: str = ""):
    """The group (among ``rank_lists``, a partition of ``parent``'s global ranks) holding this
    rank. Created once (per default process group) and cached. With parent = the world every
    rank creates every group in the same order; inside a smaller parent only the members
    synchronise. Under NCCL with a bound device (``init(device_id=...)``) torch creates a group
    by splitting the world's communicator, a call every rank of the world must make: so each
    rank must call this the same number of times in the same order, which every caller here
    does (each rank of every parent makes one group per call; not yet run on GPUs)."""
    _fresh_caches()
    key = (tuple(map(tuple, rank_lists)), purpose)
    if key in _SUB_CACHE:
        return _SUB_CACHE[key]
    me = rank()
    whole = parent is None or parent is dist.group.WORLD or len(group_ranks(parent)) == world_size()
    if not whole:
        _check_group_histories(parent)
    mine = None
    for ranks in rank_lists:
        if whole or me in ranks:
            g = _new_group(list(ranks), local_sync=not whole)
            if me in ranks:
                mine = g
    _SUB_CACHE[key] = mine
    return mine


def host_group():
    """A gloo group over the whole world, for host-side collectives that run beside the
    training's own, from another thread (a background checkpoint write: torch.distributed.
    checkpoint's ``async_save`` takes one); None without a process group. Created once per
    default group, by every rank at its first call (a collective)."""
    if not is_initialized():
        return None
    _fresh_caches()
    if "host" not in _SUB_CACHE:
        kw = {"timeout": _TIMEOUT[0]} if _TIMEOUT[0] is not None else {}
        _SUB_CACHE["host"] = dist.new_group(backend="gloo", **kw)
    return _SUB_CACHE["host"]


@dataclass(frozen=True)
class RingGroups:
    """Ranks and process groups of a flat (M=1) or double ring (M nodes x L local ranks).

    ``ranks`` are the global ranks in ring order; position i = node * L + local.
    """

    ranks: tuple[int, ...]
    nodes: int  # M
    local: int  # L
    me: int  # my position in ``ranks``
    read_intra: object
    acc_intra: object
    read_inter: object = None
    acc_inter: object = None

    @property
    def world(self) -> int:
        return len(self.ranks)

    def at(self, node: int, local: int) -> int:
        """Global rank at (node, local), wrapping around both rings."""
        return self.ranks[(node % self.nodes) * self.local + local % self.local]


_RING_CACHE: dict = {}


def ring_shape(world: int, ranks_per_node: int | None) -> tuple[int, int]:
    """(nodes M, ranks per inner ring L) of the ring ``burst_attn`` runs; M = 1 is a flat ring.

    The one rule, used by the ring, the byte formulas and the emulation: no ``ranks_per_node``,
    or one node's worth, is a flat ring; so is one rank per node (a flat ring whose every hop
    crosses nodes, not a double ring of one-rank inner rings that would send to themselves)."""
    if ranks_per_node is None or ranks_per_node >= world or ranks_per_node == 1:
        return 1, world
    return world // ranks_per_node, ranks_per_node


def ranks_per_node_ok(world: int, ranks_per_node) -> bool:
    """``ring_shape``'s valid inputs: None, or a positive int that divides the group or holds it
    whole (one node's worth or more is a flat ring)."""
    return ranks_per_node is None or (
        isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool)
        and ranks_per_node >= 1
        and (ranks_per_node >= world or world % ranks_per_node == 0))


def ranks_per_node_problem(world: int, ranks_per_node, name: str = "ranks_per_node") -> str | None:
    """Why ``ranks_per_node`` cannot shape a ring of ``world`` ranks (None: it can); the one
    message of burst_attn, the registry's burst entry, the emulation, the byte formulas and the
    byte counter (``name``: the argument's name there, e.g. ``node_size``)."""
    if ranks_per_node_ok(world, ranks_per_node):
        return None
    if not ranks_per_node_ok(1, ranks_per_node):  # not a whole number >= 1 at all
        return f"{name} must be a whole number >= 1 (or None), got {ranks_per_node!r}"
    from burst.layout import divisors

    return (f"a group of {world} ranks is not divisible by {name}={ranks_per_node}; "
            f"valid values: {', '.join(map(str, divisors(world)))}, or any number >= {world} "
            f"(one node{': a flat ring' if name == 'ranks_per_node' else ''})")


def ring_groups(group=None, ranks_per_node: int | None = None) -> RingGroups:
    """The process groups of a flat (one node) or double ring over ``group``, cached. A double
    ring's first call also makes the flat ring's groups: ``burst_attn`` runs a window or
    documents that a flat ring serves in at most M - 1 steps each way on it (two more
    communicators per double ring under NCCL, used or not; ``burst.masks.flat_ring_suffices``),
    and making them only then would make the set of groups a rank creates depend on its
    batch, while under NCCL every rank of the world joins each creation (``subgroup``)."""
    _fresh_caches()
    ranks = tuple(group_ranks(group))
    g = len(ranks)
    _, local = ring_shape(g, ranks_per_node)
    # the group object is part of the key: a new group over the same ranks (the old one
    # destroyed) must not get the old one back
    key = (ranks, local, None if group is None or group is dist.group.WORLD else group)
    if key in _RING_CACHE:
        return _RING_CACHE[key]
    me = ranks.index(rank())
    nodes = g // local
    if nodes == 1:
        # reads and accumulators each on a group of their own, never the caller's: under NCCL
        # a communicator runs its operations in order, so a ring step's transfer would wait
        # behind whatever else the caller's group carries (FSDP's gathers and reduce-scatters
        # over the world under fsdp_world, where the context-parallel group is the world)
        read = subgroup([list(ranks)], parent=group, purpose="ring-read") if g > 1 else group
        acc = subgroup([list(ranks)], parent=group, purpose="ring-acc") if g > 1 else None
        rg = RingGroups(ranks, 1, local, me, read_intra=read, acc_intra=acc)
    else:
        ring_groups(group, None)  # the flat ring's, made now whatever the masks (see above)
        intra = [list(ranks[n * local:(n + 1) * local]) for n in range(nodes)]
        inter = [list(ranks[l::local]) for l in range(local)]
        rg = RingGroups(
            ranks, nodes, local, me,
            read_intra=subgroup(intra, parent=group, purpose="read-intra"),
            acc_intra=subgroup(intra, parent=group, purpose="acc-intra"),
            read_inter=subgroup(inter, parent=group, purpose="read-inter"),
            acc_inter=subgroup(inter, parent=group, purpose="acc-inter"),
        )
    _RING_CACHE[key] = rg
    return rg
