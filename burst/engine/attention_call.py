"""The engine's one path to an attention method, and the counter of the attention FLOPs it runs.

The engine never imports ``baselines`` (STYLE.md principle 10, dependency direction): the
caller hands it a method object with the registry's call signature

    out = method(q_BSHD, k_BSHD, v_BSHD, *, causal, softmax_scale, group, **options)

and, optionally, ``method.layout(options)`` (the layout its inputs must be sharded in) and
``method.check(world=, heads=, kv_heads=, seq_local=, causal=, **options)``. ``None`` (or the
name ``"burst"``) is BurstAttention itself.

Every attention call of the model goes through ``AttentionCall``, so one place sees them all:
``count_attention_flops`` records each call's FLOPs with the phase it ran in (``forward``, or
``recompute`` inside a checkpointed layer's backward). A call's FLOPs are those of the whole
context-parallel group for the call's global sequence (the local length times the group size),
in the convention of ``burst.flops.recompute_flops`` (causal = N^2/2 pairs), so a model's counted
recompute equals the formula; ``exact`` keeps the exact pair count (N(N+1)/2, windows,
documents) as well.

Shapes: q_BSHD (batch, local tokens, heads, head dim), k_BSHD/v_BSHD with kv heads.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from burst import comm, flops
from burst.attention import CHOICES, burst_attn, choice_problems
from burst.layout import check_layout
from burst.masks import per_layer

__all__ = [
    "AttentionCall",
    "AttentionFlops",
    "BurstMethod",
    "check_method",
    "count_attention_flops",
    "output_problem",
    "recompute_phase",
    "resolve_attention",
]


class BurstMethod:
    """BurstAttention with the registry signature: the engine's default attention."""

    name = "burst"
    options = {"layout": "zigzag", "backward": "auto"}

    def layout(self, options: dict | None = None) -> str:
        return {**self.options, **(options or {})}["layout"]

    def __call__(self, q, k, v, *, causal: bool, softmax_scale: float | None = None, group=None,
                 **options):
        return burst_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group,
                          **{**self.options, **options})


RESERVED = {"causal", "softmax_scale", "group", "window", "cu_seqlens"}
"""Keyword arguments of a method call that the engine passes itself (``AttentionCall``)."""


def output_problem(out, q: torch.Tensor) -> str | None:
    """Why a method's output is not attention's for ``q`` (a tensor of q's shape, batch x
    local tokens x heads x head_dim, and dtype), else None: the engine's and the harness'
    one check."""
    if isinstance(out, torch.Tensor) and (out.shape, out.dtype) == (q.shape, q.dtype):
        return None
    got = (f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor)
           else type(out).__name__)
    return (f"its output is {got}, not q's {q.dtype} {tuple(q.shape)}: attention returns q's "
            "shape and dtype")


def resolve_attention(attention, options: dict | None) -> tuple[Callable, str]:
    """(method, layout) for the Trainer's ``attention`` argument; errors name the fix."""
    if attention is None or attention == "burst":
        method = BurstMethod()
    elif isinstance(attention, str):
        raise ValueError(
            f"unknown attention method {attention!r}: the engine itself only knows 'burst' "
            "(burst does not import baselines); pass the method object instead, e.g. "
            f"attention=baselines.registry.get({attention!r})")
    elif not callable(attention):
        raise TypeError(f"attention must be a method with the registry signature "
                        f"method(q, k, v, *, causal, softmax_scale, group, **options), got "
                        f"{type(attention).__name__}")
    else:
        method = attention
    opts = dict(options or {})
    taken = sorted(set(opts) & RESERVED)
    if taken:
        raise ValueError(f"attention_options {taken}: the engine sets these itself (causal "
                         "always, the group from cp_group/cp_degree, window and documents from "
                         "Trainer(window=...) and the batch's cu_seqlens); remove them")
    problems = _option_problems(method, opts)
    if problems:  # found at construction, not ten frames into the first step's forward
        raise ValueError("attention_options: " + "; ".join(problems))
    if hasattr(method, "layout") and callable(method.layout):
        layout = method.layout(opts)
    else:  # a plain function: contiguous unless the options name a layout (registry rule)
        layout = opts.get("layout", "contiguous")
    check_layout(layout)
    return method, layout


def check_method(method, options: dict, *, world: int, heads: int, kv_heads: int,
                 seq_local: int) -> None:
    """Raise the method's own ValueError (registry ``Method.check``) where it cannot run these
    shapes on a group of ``world`` ranks, as the engine calls it (causal); a method without a
    check (a plain function) checks itself when called."""
    check = getattr(method, "check", None)
    if callable(check):
        check(world=world, heads=heads, kv_heads=kv_heads, seq_local=seq_local, causal=True,
              **options)


def _option_problems(method, opts: dict) -> list[str]:
    """Option names the method does not take (and, for the engine's own burst, values it does
    not know; for a registry method, a layout it does not support or a package that is not
    here); a method of another kind checks its options when it is called."""
    if isinstance(method, BurstMethod):
        valid = (set(inspect.signature(burst_attn).parameters) - {"q", "k", "v", "return_lse"}
                 - RESERVED)  # the model takes the output alone
        out = [f"burst has no option {k!r}; valid options: {', '.join(sorted(valid))}"
               for k in sorted(set(opts) - valid)]
        return out + choice_problems(**{k: opts[k] for k in CHOICES if k in opts})
    if callable(getattr(method, "option_problems", None)):  # a registry method
        why = [f"it {w}" for _, w in method.option_problems(opts, refused=False)]
        if not why:  # (its layout is read from options it knows) what no call of it can run
            why = [w for w in (method.unavailable(), method.layout_problem(opts)) if w]
        return [f"method {getattr(method, 'name', method)!r} cannot run this case: {w}"
                for w in why]  # (its check's words)
    return []


# ---------------------------------------------------------------------------------------------
# FLOP counter

_PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("engine_attn_phase",
                                                             default="forward")
_COUNTERS: list[AttentionFlops] = []


@dataclass
class AttentionFlops:
    """Attention forward FLOPs run by the engine, per phase, summed over the CP group."""

    by_phase: dict = field(default_factory=lambda: defaultdict(float))
    exact_by_phase: dict = field(default_factory=lambda: defaultdict(float))
    calls: list = field(default_factory=list)

    def flops(self, phase: str = "recompute", *, exact: bool = False) -> float:
        return (self.exact_by_phase if exact else self.by_phase).get(phase, 0.0)

    def record(self, *, batch: int, seq_len: int, heads: int, head_dim: int, causal: bool,
               window, cu_seqlens) -> None:
        phase = _PHASE.get()
        window = flops.counted_window(window, seq_len, causal)  # spanning the call: none
        masked = window is not None or cu_seqlens is not None
        exact = flops.attention_flops(batch, seq_len, heads, head_dim, causal=causal,
                                      window=window, cu_seqlens=cu_seqlens)
        halved = exact if masked else flops.attention_flops_halved(batch, seq_len, heads,
                                                                    head_dim, causal=causal)
        self.by_phase[phase] += halved
        self.exact_by_phase[phase] += exact
        self.calls.append(dict(phase=phase, batch=batch, seq_len=seq_len, heads=heads,
                               head_dim=head_dim, flops=halved))


@contextlib.contextmanager
def count_attention_flops():
    """Record the FLOPs of every attention call the engine makes inside the block."""
    c = AttentionFlops()
    _COUNTERS.append(c)
    try:
        yield c
    finally:
        _COUNTERS.remove(c)


@contextlib.contextmanager
def recompute_phase():
    """Label the attention calls inside the block as recomputation (checkpointed backward)."""
    token = _PHASE.set("recompute")
    try:
        yield
    finally:
        _PHASE.reset(token)


# ---------------------------------------------------------------------------------------------
# The call


@dataclass
class AttentionCall:
    """A causal attention call of the model: method, its options, the CP group and the mask."""

    method: Callable
    layout: str
    options: dict = field(default_factory=dict)
    group: object = None
    window: tuple | None = None
    """(left, right) sliding window in global token positions (passed through to the method);
    or, for a model whose layers differ, one entry per layer, each (left, right) or None
    (``burst.masks.model_window``'s form): ``for_layer`` gives each layer's call."""

    def __post_init__(self):
        self._layers: dict[int, AttentionCall] = {}

    @property
    def per_layer(self) -> bool:
        """The window differs between layers (``window`` holds one entry per layer)."""
        return per_layer(self.window)

    def for_layer(self, index: int) -> AttentionCall:
        """The call of decoder layer ``index``: this one, or a copy with that layer's window."""
        if not self.per_layer:
            return self
        if index not in self._layers:
            self._layers[index] = replace(self, window=self.window[index])
        return self._layers[index]

    def mask_options(self, cu_seqlens: Sequence[int] | None) -> dict:
        extra = {}
        if self.window is not None:
            extra["window"] = self.window
        if cu_seqlens is not None:
            extra["cu_seqlens"] = tuple(int(x) for x in cu_seqlens)
        return extra

    def check(self, *, heads: int, kv_heads: int, seq_local: int) -> None:
        """The method's own validation (registry ``Method.check``) for these shapes."""
        check_method(self.method, self.options, world=comm.world_size(self.group), heads=heads,
                     kv_heads=kv_heads, seq_local=seq_local)

    def __call__(self, q_BSHD: torch.Tensor, k_BSHD: torch.Tensor, v_BSHD: torch.Tensor, *,
                 cu_seqlens: Sequence[int] | None = None) -> torch.Tensor:
        if self.per_layer:
            raise ValueError("this attention call holds one window per layer; call the one "
                             "for_layer(index) gives")
        if _COUNTERS:
            b, n, h, d = q_BSHD.shape
            g = comm.world_size(self.group)
            for c in _COUNTERS:
                c.record(batch=b, seq_len=n * g, heads=h, head_dim=d, causal=True,
                         window=self.window, cu_seqlens=cu_seqlens)
        # a forward that checkpointing runs again inside the backward is forward traffic, as
        # this project's methods label theirs; a user's method may label none (comm.phase)
        with comm.unlabelled_phase("forward"):
            out = self.method(q_BSHD, k_BSHD, v_BSHD, causal=True, softmax_scale=None,
                              group=self.group, **self.options, **self.mask_options(cu_seqlens))
        if why := output_problem(out, q_BSHD):
            name = getattr(self.method, "name", getattr(self.method, "__name__", "attention"))
            raise ValueError(f"attention method {name!r}: {why}")
        return out
