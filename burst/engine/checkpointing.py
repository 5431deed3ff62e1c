"""Sequence-level selective checkpointing: how a decoder layer is recomputed in backward.

Modes (names of ``burst.flops.CHECKPOINTING``; DESIGN.md 3):
  ``none``            plain autograd: every activation is kept.
  ``full``            only the layer input is kept; backward re-runs the whole layer, ring
                      attention included.
  ``selective``       the layer is recomputed, but the attention output and lse are cached, so
                      the ring is not re-run: backward recomputes q, k, v, runs the attention
                      method's own backward on them with the cached out/lse, then re-runs the
                      output projection and the MLP.
  ``selective_half``  as selective, but only the second half of the local sequence's out/lse is
                      cached; the first half is recomputed by running the method on the first
                      half of the local q, k, v. With the striped layout the first halves of all
                      ranks are exactly the first N/2 tokens of the sequence, again striped, and
                      causal queries there see only those keys, so the recompute is an ordinary
                      call on N/2 tokens: half the cache, a quarter of the causal attention FLOPs.

How the selective cache works for any registry method (no method-specific backward API): the
layer's attention runs once in forward with autograd on, under saved-tensor hooks. Whatever the
method saves for backward is kept in the cache, except its own inputs q, k, v, which become
placeholders filled with the recomputed q, k, v at backward time (the same trick as torch's
non-reentrant checkpoint). For BurstAttention what remains is exactly out and lse. The method's
autograd node is reached later through gradient edges, so nothing keeps the original q, k, v
alive. In ``selective_half`` the saved tensors that are per local row (out: B S H D, lse: B H S)
keep their second half only, and their first half is taken from what the method saves when run
on the first half alone; that is exact because causal queries of the prefix see only prefix keys
(true of out and lse). A method that saves anything else (Ulysses' index tensors, say) gets a
ValueError naming the tensor, never a silent approximation.

Ulysses and USP save the q, k, v they hold after their all-to-all (new tensors, not the layer's
q, k, v), and their layer's output is their kernel's, moved back by another all-to-all. They make
both through ``burst.remake.remakeable``, so the cache keeps neither: it gathers q, k, v again
from the recomputed ones in backward, and moves the kept kernel output back again for the
recomputation. Their forward all-to-alls run again (bytes for memory, as the paper's systems do
when they recompute a layer but its attention), and their cache holds what a ring method's does:
one output (head-sharded) and lse, plus the small index tensors that reorder rows in a zigzag or
striped layout (the simulator counts the bytes: ``Implementation.selective_regathers``).

Entries are keyed by the layer's run in one forward (weakly: a forward whose graph is dropped
without backward frees its entries with it), and freed when that run's backward has used them.
A second forward before the first one's backward has entries of its own, so each backward
replays exactly what its forward computed.
"""

from __future__ import annotations

import weakref

import torch
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from burst import comm
from burst.engine.attention_call import AttentionCall, recompute_phase
from burst.first_order import first_order
from burst.flops import CHECKPOINTING
from burst.remake import recording

__all__ = ["CHECKPOINTING", "ActivationCache", "CacheEntry", "check_mode", "run_layer"]


def check_mode(mode: str, layout: str, method=None) -> None:
    """Refuse a checkpointing mode this layout or attention ``method`` cannot run (a registry
    entry with ``row_saves=False``: selective_half keeps half of each saved tensor's rows)."""
    if mode not in CHECKPOINTING:
        raise ValueError(f"unknown checkpointing mode {mode!r}; valid modes: "
                         f"{', '.join(CHECKPOINTING)}")
    if mode == "selective_half" and layout != "striped":
        raise ValueError(f"checkpointing 'selective_half' needs the striped layout (the first "
                         f"halves of all ranks must form a prefix of the sequence), but the "
                         f"attention uses {layout!r}; give the attention the striped layout "
                         f"(Trainer: attention_options={{'layout': 'striped'}}; scripts/"
                         f"train.py: --layout striped; a spec: the method's options = {{layout "
                         f"= \"striped\"}}) or use checkpointing 'selective'")
    if mode == "selective_half" and not getattr(method, "row_saves", True):
        raise ValueError(f"checkpointing 'selective_half' caches per-row tensors, but "
                         f"{getattr(method, 'name', method)!r} also saves tensors that are not "
                         f"rows of its output (Ulysses' and USP's: their all-to-all's index "
                         f"tensors); use 'selective'")


class _Anchor(torch.autograd.Function):
    """Identity whose autograd node holds no tensor: the method's inputs get a grad_fn (so the
    method records its graph) without a leaf that would keep their memory alive."""

    @staticmethod
    def forward(ctx, x, anchor):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _view(x: torch.Tensor, size, stride, rel: int) -> torch.Tensor:
    """The view of ``x``'s storage that a saved tensor was, ``rel`` elements past ``x``."""
    return x.as_strided(size, stride, x.storage_offset() + rel)


class CacheEntry:
    """One layer's attention: the method's saved tensors minus its inputs, and its graph."""

    def __init__(self, call: AttentionCall, cu_seqlens, half: bool):
        self.call, self.cu_seqlens, self.half = call, cu_seqlens, half
        self.kept: list[torch.Tensor] = []  # selective: everything the method saved but q, k, v
        self.rows: list[tuple[torch.Tensor, int]] = []  # selective_half: (second half, row dim)
        self.out_row: int | None = None  # which of ``rows`` is the method's output
        self._row_ptrs: list[int] = []  # storages the rows were cut from
        self.out: torch.Tensor | None = None  # selective: the full output (also in ``kept``)
        self.out_made: tuple | None = None  # or how to make it again from ``kept`` instead
        self.inputs: list[torch.Tensor] | None = None  # recomputed q, k, v, at backward only
        self.first_rows: list[torch.Tensor] | None = None  # recomputed first halves
        self.out_edge = self.in_edges = None
        # tensors the method made from its inputs through burst.remake.remakeable: not kept,
        # made again from the recomputed inputs in backward (Ulysses' gathered q, k, v)
        self.recipes: list[tuple] = []  # (fn, which inputs) per remakeable call
        # storage -> (recipe, output, offset, the output while it lives)
        self._made: dict[int, tuple] = {}
        self.remade: dict[int, tuple] = {}  # recipe -> its outputs again, at backward only

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache (distinct storages): what the method saved, and the layer's
        output where that is another tensor that cannot be made again from them."""
        seen, total = set(), 0
        out = [] if self.out is None else [self.out]
        for t in [*self.kept, *(r for r, _ in self.rows), *out]:
            if _storage(t) not in seen:
                seen.add(_storage(t))
                total += t.untyped_storage().nbytes()
        return total

    # -- forward: run the method once, keep what it saved ---------------------------------------

    def _hooks(self, inputs, q_shape, record: list | None):
        b, n, h, _ = q_shape
        in_ptrs = [(_storage(t), t.storage_offset()) for t in inputs]

        def pack(t: torch.Tensor):
            for i, (ptr, off) in enumerate(in_ptrs):
                if _storage(t) == ptr:
                    return ("input", i, t.size(), t.stride(), t.storage_offset() - off)
            made = self._made.get(_storage(t)) if record is None else None
            if made is not None and made[3]() is not None:  # (alive: its address is its own)
                r, j, off, _ = made
                return ("made", r, j, t.size(), t.stride(), t.storage_offset() - off)
            t = t.detach()
            if record is not None:  # recompute of the first half: collect, in order
                record.append(t)
                return ("keep", t)
            if not self.half:
                self.kept.append(t)
                return ("keep", t)
            dim = 1 if tuple(t.shape) == tuple(q_shape) else \
                2 if tuple(t.shape) == (b, h, n) else None
            if dim is None:
                raise ValueError(
                    f"checkpointing 'selective_half' caches per-row tensors (out {tuple(q_shape)}"
                    f", lse {(b, h, n)}) but the attention method saves a tensor of shape "
                    f"{tuple(t.shape)}; use checkpointing 'selective' with this method")
            self.rows.append((t.narrow(dim, n // 2, n - n // 2).clone(), dim))
            self._row_ptrs.append(_storage(t))
            return ("row", len(self.rows) - 1)

        def unpack(p):
            if p[0] == "input":
                return _view(self.inputs[p[1]], *p[2:])
            if p[0] == "made":
                return _view(self._remake(p[1])[p[2]], *p[3:])
            if p[0] == "row":
                second, dim = self.rows[p[1]]
                return torch.cat([self.first_rows[p[1]], second], dim=dim)
            return p[1]

        return saved_tensors_hooks(pack, unpack)

    def _record(self, inputs, fn, args, outs) -> None:
        """A ``remakeable`` call of the method: outputs made from the method's inputs or from
        what the cache keeps (views of them), so the cache need not keep them. A call on
        anything else is left alone: what it makes is kept as usual."""
        views = []
        for a in args:
            for source, pool in (("input", inputs), ("kept", self.kept)):
                i = next((i for i, x in enumerate(pool) if _storage(a) == _storage(x)), None)
                if i is not None:
                    views.append((source, i, a.size(), a.stride(),
                                  a.storage_offset() - pool[i].storage_offset()))
                    break
            else:
                return
        self.recipes.append((fn, views))
        for j, o in enumerate(outs):
            self._made.setdefault(_storage(o), (len(self.recipes) - 1, j, o.storage_offset(),
                                                weakref.ref(o)))

    def _remake(self, r: int) -> tuple:
        """Recipe ``r``'s outputs, made again from the recomputed inputs (once per backward;
        a collective where the recipe communicates: every rank's backward unpacks them)."""
        if r not in self.remade:
            fn, views = self.recipes[r]
            args = [_view((self.inputs if source == "input" else self.kept)[i], *where)
                    for source, i, *where in views]
            with torch.no_grad():
                self.remade[r] = tuple(fn(*args))
        return self.remade[r]

    def run(self, q, k, v, anchor) -> torch.Tensor:
        """Forward: the method on q, k, v with autograd on; returns its output (detached)."""
        inputs = [q, k, v]
        if len({_storage(t) for t in inputs}) != 3:
            raise AssertionError("q, k, v must be separate tensors for the selective cache")
        with (torch.enable_grad(), self._hooks(inputs, q.shape, None),
              recording(lambda *a: self._record(inputs, *a))):
            ins = [_Anchor.apply(t, anchor) for t in inputs]
            out = self.call(*ins, cu_seqlens=self.cu_seqlens)
        self.out_edge = get_gradient_edge(out)
        self.in_edges = [get_gradient_edge(t) for t in ins]
        made = self._made.get(_storage(out))
        self._made.clear()  # only this call's saves are told apart by their storage
        if self.half:
            if _storage(out) in self._row_ptrs:
                self.out_row = self._row_ptrs.index(_storage(out))
            else:
                raise ValueError("checkpointing 'selective_half': the attention method does not "
                                 "save its output; use checkpointing 'selective'")
        elif made is not None and all(v[0] == "kept" for v in self.recipes[made[0]][1]):
            # the output is made from what the cache keeps (Ulysses': its kernel's output,
            # moved back to sequence sharding): made again for the recomputation, not kept
            r, j, off, _ = made
            self.out_made = (r, j, out.size(), out.stride(), out.storage_offset() - off)
        else:
            self.out = out.detach()
        return out.detach()

    # -- backward -------------------------------------------------------------------------------

    def replay_output(self, q, k, v, anchor) -> torch.Tensor:
        """The layer's attention output for the recomputation, without re-running the ring
        (selective_half: the first half is recomputed on the first half of q, k, v)."""
        if not self.half and self.out is not None:
            return self.out.detach()  # a fresh tensor object: autograd gives it this op's grad_fn
        if not self.half:  # made again from the kept tensors (a collective where it moves them)
            r, j, *where = self.out_made
            return _view(self._remake(r)[j], *where)
        n = q.shape[1]
        half = [t[:, : n // 2].contiguous() for t in (q, k, v)]
        record: list[torch.Tensor] = []
        with torch.enable_grad(), self._hooks(half, half[0].shape, record):
            ins = [_Anchor.apply(t, anchor) for t in half]
            out_a = self.call(*ins, cu_seqlens=_prefix(self.cu_seqlens, n, self.call))
        if len(record) != len(self.rows) or any(
                r.shape[d] != n // 2 for r, (_, d) in zip(record, self.rows, strict=False)):
            raise AssertionError("selective_half: the recomputed first half saved "
                                 f"{[tuple(r.shape) for r in record]}, expected the first halves"
                                 f" of {[tuple(r.shape) for r, _ in self.rows]}")
        self.first_rows = record
        return torch.cat([out_a.detach(), self.rows[self.out_row][0]], dim=1)

    def backward(self, q, k, v, dout) -> tuple[torch.Tensor, ...]:
        """dq, dk, dv through the method's own backward, with the recomputed inputs."""
        self.inputs = [t.detach().contiguous() for t in (q, k, v)]
        grads = torch.autograd.grad([self.out_edge], self.in_edges, [dout.contiguous()])
        self.kept = self.rows = self.inputs = self.first_rows = self.out = None
        self.remade = self.recipes = self.out_made = None
        self.out_edge = self.in_edges = None
        return grads


def _prefix(cu_seqlens, n_local: int, call: AttentionCall):
    """Document boundaries of the first half of the global sequence."""
    if cu_seqlens is None:
        return None
    half = n_local // 2 * comm.world_size(call.group)
    return (*[int(c) for c in cu_seqlens if c < half], half)


class ActivationCache:
    """Cache entries of the selective modes, keyed (weakly) by the layer run of one forward."""

    def __init__(self):
        self.entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.peak_nbytes = 0  # largest total held since the last clear()
        self._anchor: torch.Tensor | None = None

    @property
    def anchor(self) -> torch.Tensor:
        """A scalar leaf that gives the method's inputs a grad_fn (see ``_Anchor``); made on
        first use, on the CPU (it never meets another tensor in an op)."""
        if self._anchor is None:
            self._anchor = torch.zeros((), device="cpu", requires_grad=True)
        return self._anchor

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def store(self, run, call: AttentionCall, q, k, v, *, cu_seqlens, half: bool):
        entry = CacheEntry(call, cu_seqlens, half)
        out = entry.run(q, k, v, self.anchor)
        self.entries[run] = entry
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return out

    def pop(self, run) -> CacheEntry:
        if run not in self.entries:
            raise RuntimeError(f"no cached attention for layer {run.index}: backward ran twice "
                               "or without its forward")
        return self.entries.pop(run)

    def clear(self) -> None:
        self.entries.clear()
        self.peak_nbytes = 0


class _Replay(torch.autograd.Function):
    """The cached attention as an autograd op of the recomputed q, k, v."""

    @staticmethod
    def forward(ctx, entry: CacheEntry, anchor, q, k, v):
        ctx.entry = entry
        ctx.save_for_backward(q, k, v)
        with recompute_phase():
            return entry.replay_output(q, k, v, anchor)

    @staticmethod
    @first_order  # a gradient penalty through a checkpointed layer: refused, not dropped
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        entry, ctx.entry = ctx.entry, None
        return (None, None, *entry.backward(q, k, v, dout))


class _LayerRun:
    def __init__(self, layer, index: int, rope, attention: AttentionCall, mode: str,
                 cache: ActivationCache, cu_seqlens):
        self.layer, self.index, self.rope, self.attention = layer, index, rope, attention
        self.mode, self.cache, self.cu_seqlens = mode, cache, cu_seqlens

    def first(self, x):
        """Forward without keeping activations (autograd off)."""
        q, k, v = self.layer.attention_inputs(x, self.rope)
        if self.mode == "full":
            out = self.attention(q, k, v, cu_seqlens=self.cu_seqlens)
        else:
            out = self.cache.store(self, self.attention, q, k, v,
                                   cu_seqlens=self.cu_seqlens,
                                   half=self.mode == "selective_half")
        del q, k, v
        return self.layer.finish(x, out)

    def again(self, x):
        """The recomputation in backward (autograd on)."""
        q, k, v = self.layer.attention_inputs(x, self.rope)
        if self.mode == "full":
            with recompute_phase():
                out = self.attention(q, k, v, cu_seqlens=self.cu_seqlens)
        else:
            out = _Replay.apply(self.cache.pop(self), self.cache.anchor, q, k, v)
        return self.layer.finish(x, out)


class _Recompute(torch.autograd.Function):
    """Keeps the layer input only; backward recomputes the layer and differentiates it."""

    @staticmethod
    def forward(ctx, run: _LayerRun, x, *params):
        ctx.run = run
        ctx.save_for_backward(x)
        return run.first(x)

    @staticmethod
    @first_order  # a gradient penalty through a checkpointed layer: refused, not dropped
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        run, ctx.run = ctx.run, None
        if run is None:
            raise RuntimeError("a checkpointed layer's backward ran twice: retain_graph=True is "
                               "not supported with checkpointing other than 'none'")
        params = list(run.layer.parameters())
        live = [p for p in params if p.requires_grad]  # frozen ones (fine-tuning) get None
        with torch.enable_grad():
            x_ = x.detach().requires_grad_()
            y = run.again(x_)
        dx, *dlive = torch.autograd.grad(y, [x_, *live], dy, allow_unused=True)
        got = iter(dlive)
        return (None, dx, *(next(got) if p.requires_grad else None for p in params))


def run_layer(layer, index: int, x, rope, *, attention: AttentionCall, mode: str,
              cache: ActivationCache, cu_seqlens=None):
    """One decoder layer under checkpointing ``mode`` (see the module docstring)."""
    if mode == "none":
        q, k, v = layer.attention_inputs(x, rope)
        return layer.finish(x, attention(q, k, v, cu_seqlens=cu_seqlens))
    run = _LayerRun(layer, index, rope, attention, mode, cache, cu_seqlens)
    return _Recompute.apply(run, x, *layer.parameters())
