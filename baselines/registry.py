"""One registry for every attention method, ours and the baselines, behind one call signature.

Every entry is called the same way, on this rank's shards in the entry's layout:

    out = method(q, k, v, causal=..., softmax_scale=None, group=None, **options)

q (batch, seq_local, heads, head_dim); k, v (batch, seq_local, kv_heads, head_dim). Options are
method-specific (``layout``, ``backward``, ``ranks_per_node``, ``ulysses_degree``, ...). Tests,
benchmarks and sweeps loop over ``names()`` without special cases. A method in a sweep can also
be an import path ``package.module:function`` with this signature (contiguous layout unless the
options name another).

Every rank of the group calls with the same shapes, dtype and arguments; a call does not compare
them across ranks (``burst.burst_attn`` says what a mismatch does: wrong results or a wait until
the process group's timeout; the engine's ``Trainer`` compares them once per step).

Each entry declares what it requires; ``Method.check`` raises a ValueError naming the problem and
the valid choices before any communication starts, and ``Method.unavailable`` says in one line
why an entry cannot run here (missing package, no GPU) without breaking any import.

Most entries are attention *cores* (``level="core"``: q, k, v in, attention out). A method that
only exists as a whole attention block (Megatron tensor parallelism needs the projection weights)
has ``level="block"``: its ``fn`` raises a ValueError pointing at ``block_fn``, its block-level
entry point. Loops over cores use ``names(level="core")``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from burst.attention import dims_problems
from burst.kernel import resolve_scale
from burst.layout import LAYOUTS, heads_problem, plain_integer
from burst.masks import MaskSpec

__all__ = ["LEVELS", "Method", "accepted_options", "get", "names", "plain_integer",
           "plain_integers", "register"]

LEVELS = ("core", "block")


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable
    """fn(q, k, v, *, causal, softmax_scale, group, **options) -> out."""
    description: str
    layouts: tuple[str, ...] = ("contiguous",)
    """Layouts the method accepts in options["layout"]."""
    causal_only: bool = False
    options: dict = field(default_factory=dict)
    """Default options; ``layout`` is the layout the inputs must be sharded in (contiguous when
    absent), unless a call's options name another."""
    requires: Callable[..., list[str]] | None = None
    """requires(world=, heads=, kv_heads=, seq_local=, causal=, **options) -> list of problems."""
    unavailable: Callable[[], str | None] = lambda: None
    """None when the method can run here, else one line: what is missing and how to get it."""
    level: str = "core"
    """``core`` (q, k, v -> out) or ``block`` (hidden states + weights -> hidden states)."""
    block_fn: Callable | None = None
    """The block-level entry point of a ``block`` method (its signature is the method's own)."""
    dtypes: tuple[str, ...] | Callable[..., tuple[str, ...]] | None = None
    """Input dtypes the method computes in (torch names, e.g. "bfloat16"), or a function of the
    call's options giving them (``dtypes_for``); None: any float."""
    counted: bool = True
    """Whether its traffic goes through ``burst.comm`` (the byte counter sees it); False for
    the adapters of external packages, whose bytes the harness leaves empty, not 0."""
    row_saves: bool = True
    """Whether all it saves for backward is rows of its output (out, LSE), as the engine's
    ``selective_half`` cache needs; False for Ulysses and USP (their all-to-all's index
    tensors)."""

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"method {self.name!r}: level={self.level!r}; valid levels: "
                             f"{', '.join(LEVELS)}")
        if self.level == "block" and self.block_fn is None:
            raise ValueError(f"method {self.name!r}: a block-level method needs block_fn")

    def dtypes_for(self, options: dict | None = None) -> tuple[str, ...] | None:
        """The input dtypes of a call with these options (the defaults filled in)."""
        d = self.dtypes
        if callable(d):
            d = d(**{**self.options, **(options or {})})
        return None if d is None else (d,) if isinstance(d, str) else tuple(d)

    def layout(self, options: dict | None = None) -> str:
        return {**self.options, **(options or {})}.get("layout", "contiguous")

    def layout_problem(self, options: dict | None = None) -> str | None:
        """Why the layout these options name (or the default) is not one of ``layouts``."""
        lay = self.layout(options)
        if lay in self.layouts:
            return None
        return f"layout {lay!r} is not supported; valid layouts: {', '.join(self.layouts)}"

    def check(self, *, world: int, heads: int, kv_heads: int, seq_local: int, causal: bool,
              **options) -> None:
        """Raise ValueError listing every reason these shapes/options cannot run."""
        options = plain_integers(options)  # as __call__ passes them on
        opts = {**self.options, **options}
        problems = []
        why = self.unavailable()
        if why:
            problems.append(why)
        why = self._unknown_options(options)
        if why:  # the checks below would be handed an option they do not know
            problems.append(f"it {why}")
            raise ValueError(f"method {self.name!r} cannot run this case: " + "; ".join(problems))
        if why := self.layout_problem(opts):
            problems.append(why)
        if self.causal_only and not causal:
            problems.append("it balances causal work only; use causal=True or the 'ring' method")
        if why := heads_problem(heads, kv_heads):
            problems.append(why)
            if heads < 1 or kv_heads < 1:  # the checks below divide by them
                raise ValueError(f"method {self.name!r} cannot run this case: "
                                 + "; ".join(problems))
        if self.requires is not None:
            problems += self.requires(world=world, heads=heads, kv_heads=kv_heads,
                                      seq_local=seq_local, causal=causal, **opts)
        if problems:
            raise ValueError(f"method {self.name!r} cannot run this case: " + "; ".join(problems))

    def bytes(self, **kw):
        """Analytic bytes per rank (``burst.volume.Volume``) under the options this entry runs
        with: its defaults merged with ``kw``, as ``__call__`` merges them."""
        from burst import volume

        if self.name not in volume.METHODS:
            raise ValueError(f"method {self.name!r} has no byte formula")
        shape = {k: kw.pop(k) for k in list(kw) if k in _SHAPE_KEYS}
        return volume.method_bytes(self.name, **shape, **{**self.options, **kw})

    @functools.cached_property
    def _accepted(self) -> set[str] | None:  # read once: inspect costs ~25 us a call
        return accepted_options(self.fn)

    def option_problems(self, names, *, refused: bool = True) -> list[tuple[str, str]]:
        """(option, why) for each of ``names`` this method does not take: one not in its
        function's signature, and (``refused``) one its package's function takes only to refuse
        by value (``fn.refuses``: a spec naming it can never run; a call passing None may)."""
        accepted, no = self._accepted, set(getattr(self.fn, "refuses", ()))
        valid = None if accepted is None else ", ".join(sorted(accepted - no)) or "(none)"
        out = []
        for k in sorted(names):
            if refused and k in no:
                out.append((k, f"does not support {k} (the package's function has no such "
                               "argument)"))
            elif accepted is not None and k not in accepted:
                out.append((k, f"has no option {k!r}; valid options: {valid}"))
        return out

    def _unknown_options(self, options: dict) -> str | None:
        why = [msg for _, msg in self.option_problems(options, refused=False)]
        return "; ".join(why) or None

    def __call__(self, q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                 group=None, **options):
        # clear errors for every method, the packages' and the user's too
        try:
            why = dims_problems(q, k, v)
        except TypeError as e:
            raise TypeError(f"method {self.name!r}: {e}") from None
        if why:  # (a shape read below raised an IndexError)
            raise ValueError(f"method {self.name!r} cannot run this case: " + "; ".join(why))
        resolve_scale(q.shape[-1], softmax_scale)
        try:  # the mask's rule (a numpy bool reaches every function as Python's)
            causal = MaskSpec(causal=causal).causal
        except ValueError as e:
            raise ValueError(f"method {self.name!r}: {e}") from None
        why = self._unknown_options(options)
        if why:  # was a bare TypeError ("unexpected keyword argument")
            raise ValueError(f"method {self.name!r} {why}")
        options = plain_integers(options)
        return self.fn(q, k, v, causal=causal, softmax_scale=softmax_scale, group=group,
                       **{**self.options, **options})


def plain_integers(options: dict) -> dict:
    return {k: plain_integer(v) for k, v in options.items()}


_SHAPE_KEYS = ("world", "batch", "seq_local", "heads", "kv_heads", "head_dim", "elem",
               "acc_elem", "rank", "node_size", "causal", "window", "cu_seqlens")
_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    return method


def names(available_only: bool = False, level: str | None = None) -> list[str]:
    """Registered names; ``available_only`` drops entries that cannot run here, ``level`` keeps
    only ``core`` or ``block`` methods."""
    _load_builtins()
    return [n for n, m in _REGISTRY.items()
            if (not available_only or m.unavailable() is None)
            and (level is None or m.level == level)]


def get(name: str) -> Method:
    """The registered method, or one loaded from an import path ``package.module:function``."""
    _load_builtins()
    if not isinstance(name, str):
        raise ValueError(f"a method name is a string (a registered name or "
                         f"'package.module:function'), got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), attr)
        except Exception as e:  # noqa: BLE001  (a module that fails as it imports, whatever
            # it raises: SyntaxError, OSError of a missing library, its own error)
            raise ValueError(f"cannot import method {name!r}: "
                             f"{type(e).__name__}: {e}") from e
        if isinstance(fn, Method):
            return fn
        problem = _call_problem(fn)
        if problem:
            raise ValueError(f"method {name!r} {problem}: a method is called as "
                             "method(q, k, v, *, causal, softmax_scale, group, **options)")
        return Method(name=name, fn=fn, description=f"user method {name}", layouts=LAYOUTS)
    raise ValueError(f"unknown method {name!r}; registered: {', '.join(_REGISTRY)} "
                     "(or give an import path package.module:function)")


def accepted_options(fn) -> set[str] | None:
    """Keyword options a method function takes beyond q, k, v, causal, softmax_scale and group
    (None: any, or a signature Python cannot read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {
        "q", "k", "v", "causal", "softmax_scale", "group"}


CALL_KEYWORDS = ("causal", "softmax_scale", "group")
"""The keyword arguments every call of a method passes (the harness, the engine)."""


def _call_problem(fn) -> str | None:
    """Why ``fn`` cannot be called as a method (not callable, fewer than three positional
    parameters for q, k, v, or a keyword of ``CALL_KEYWORDS`` it does not take), else None; a
    signature Python cannot read is given the benefit."""
    if not callable(fn):
        return f"is of type {type(fn).__name__}, not a function"
    try:  # a torch module is called through its forward (its own signature is *args, **kw)
        params = inspect.signature(getattr(fn, "forward", fn) if isinstance(
            fn, torch.nn.Module) else fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        return f"takes {len(positional)} positional parameters, not q, k, v"
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    named = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    missing = [k for k in CALL_KEYWORDS if k not in named]
    if missing:  # (it failed on every rank after the spawn, with torch's TypeError)
        return (f"does not take the keyword argument{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)}, which every call passes")
    return None


_LOADED = False


def _load_builtins() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True  # before the imports: an adapter that asks the registry does not recurse
    try:
        from baselines._builtins import MODULES  # each adapter module registers itself
    except BaseException:
        _LOADED = False  # a failed import leaves no partial registry: the next call retries
        raise

    rank = {f"baselines.{m}": i for i, m in enumerate(MODULES)}
    ordered = sorted(_REGISTRY.items(), key=lambda kv: rank.get(kv[1].fn.__module__, len(rank)))
    _REGISTRY.clear()
    _REGISTRY.update(ordered)
